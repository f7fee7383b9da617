"""The engine's per-op gate: every launch's output within 1e-2 relative L2 of the reference executor's value of
the same name in fp16 (1e-4 in fp32), across the architecture families in scope.

On a GPU every family and task at 320×320 (P6 models need a multiple of 64); on the CPU, where the kernels run
under Triton's interpreter, a sample at 64×64 (yolo11n's gate is in test_engine)."""

from __future__ import annotations

import pytest
import torch
from support import random_model, relative_l2

import yolojet
from yolojet.engine.engine import Engine

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
IMGSZ = 320 if ON_GPU else 64
TOLERANCE = {torch.float16: 1e-2, torch.float32: 1e-4}

GPU_MODELS = [
    (f"{family}{task}.yaml", end2end, torch.float16)
    for family in ("yolov8n", "yolo11n", "yolo26n")
    for task in ("", "-seg", "-pose", "-obb", "-cls")
    for end2end in ((None, True) if family == "yolo26n" and task != "-cls" else (None,))
] + [
    ("yolov8n-p2.yaml", None, torch.float16),
    ("yolov8n-p6.yaml", None, torch.float16),
    ("yolov8n-seg-p6.yaml", None, torch.float16),
    ("yolov8n-pose-p6.yaml", None, torch.float16),
    ("yolo26n-p2.yaml", True, torch.float16),
    ("yolo26n-p6.yaml", True, torch.float16),
    ("yolo11s.yaml", None, torch.float16),
    ("yolo11m.yaml", None, torch.float16),
    ("yolo11n.yaml", None, torch.float32),
    ("yolo26n-seg.yaml", True, torch.float32),
    ("yolov8n-obb.yaml", None, torch.float32),
]
# Tuned: the tiles start-up timing picks (split K, direct, packed), not only the untimed defaults above. TMA tiles
# start at 2^16 output pixels, beyond 320 x 2 images: test_engine forces them on every conv of a network.
GPU_TUNED_MODELS = [
    ("yolo11n.yaml", None, torch.float16, "tuned"),
    ("yolo26n-seg.yaml", True, torch.float16, "tuned"),
    ("yolov8n-pose.yaml", None, torch.float32, "tuned"),
]
CPU_MODELS = [("yolov8n-seg.yaml", None, torch.float16), ("yolo26n-pose.yaml", True, torch.float32)]
CASES = [(*case, "untuned") for case in (GPU_MODELS if ON_GPU else CPU_MODELS)] + (GPU_TUNED_MODELS if ON_GPU else [])


@pytest.mark.parametrize(("cfg", "end2end", "dtype", "tiles"), CASES, ids=lambda p: str(p).replace("torch.", ""))
def test_every_op_within_the_gate(cfg, end2end, dtype, tiles, tmp_path):
    model_dir = yolojet.export(random_model(cfg), out=tmp_path / "model", imgsz=IMGSZ, end2end=end2end)
    half, tune = dtype == torch.float16, tiles == "tuned"
    engine = Engine.load(model_dir, device=DEVICE, half=half, max_batch=2, tune=tune)
    reference = yolojet.load_reference(model_dir, device=DEVICE)
    x = torch.rand(2, 3, IMGSZ, IMGSZ, device=DEVICE)
    ours, expected = engine.dump(x), reference.dump(x)  # dump poisons the buffers first
    # The one-to-one head's top-k may order near-equal fp16 scores differently: its selection is compared as
    # the sorted set of selected scores.
    selected = {name for node in engine.graph.nodes if node.op == "topk" for name in node.outputs}
    worst = {}
    for name, value in ours.items():
        ref = expected[name]
        if name in selected:
            value, ref = value[..., 4].sort(-1).values, ref[..., 4].sort(-1).values
        assert not value.isnan().any(), f"{name}: NaN (unwritten)"
        worst[name] = relative_l2(value, ref)
    failing = {name: f"{error:.2e}" for name, error in worst.items() if error > TOLERANCE[dtype]}
    assert not failing, f"ops over {TOLERANCE[dtype]:.0e}: {failing}"
    assert len(worst) >= 20
