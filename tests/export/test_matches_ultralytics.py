"""Level 1: an exported graph, reloaded from disk, reproduces ultralytics' eval forward pass.

Every architecture in scope is built from its YAML with random weights and random BatchNorm
statistics, exported, saved, loaded back and run by the reference executor; each head output
must be within 1e-4 (max abs error / max abs reference) of ultralytics' own first output.
"""

from __future__ import annotations

import pytest
import torch
from support import VERIFIED, compare_outputs, random_model

import yolojet

TOLERANCE = 1e-4
FAMILIES = ("yolov8", "yolo11", "yolo26")
TASK_SUFFIXES = ("", "-seg", "-cls", "-obb", "-pose")

ARCHITECTURES = (
    [f"{family}{scale}{task}.yaml" for family in FAMILIES for scale in "ns" for task in TASK_SUFFIXES]
    + [f"{family}{scale}.yaml" for family in FAMILIES for scale in "mlx"]
    + [
        "yolov8n-p2.yaml",
        "yolov8n-p6.yaml",
        "yolov8n-seg-p6.yaml",
        "yolov8n-pose-p6.yaml",
        "yolo26n-p2.yaml",
        "yolo26n-p6.yaml",
    ]
)


def image_sizes(cfg: str) -> list[tuple[int, int]]:
    """One square and one non-square size per model, each with more than 300 anchors for detection heads."""
    if "-cls" in cfg:
        return [(96, 96), (128, 96)]
    if "p6" in cfg:
        return [(128, 128), (192, 128)]
    return [(128, 128), (160, 96)]


def head_modes(cfg: str) -> list[bool | None]:
    """Every model in its built mode; YOLO26 detection heads also through the one-to-one branch."""
    return [None, True] if cfg.startswith("yolo26") and "-cls" not in cfg else [None]


CASES = [
    pytest.param(cfg, size, mode, id=f"{cfg[:-5]}-{size[0]}x{size[1]}" + ("-one2one" if mode else ""))
    for cfg in ARCHITECTURES
    for size in image_sizes(cfg)
    for mode in head_modes(cfg)
]


@pytest.mark.parametrize(("cfg", "imgsz", "end2end"), CASES)
def test_reference_matches_ultralytics(cfg, imgsz, end2end, tmp_path):
    model = random_model(cfg)
    model_dir = yolojet.export(model, out=tmp_path / "model", imgsz=imgsz, end2end=end2end)
    reference = yolojet.load_reference(model_dir)
    head_end2end = reference.meta.end2end
    assert head_end2end == bool(end2end)

    x = torch.rand(2, 3, *imgsz, generator=torch.Generator().manual_seed(1))
    previous = getattr(model, "end2end", False)
    try:
        if head_end2end:
            model.end2end = True
        with torch.inference_mode():
            expected = model(x)[0]
    finally:
        if head_end2end:
            model.end2end = previous
    errors = compare_outputs(reference(x), expected, head_end2end)
    assert max(errors) <= TOLERANCE, f"{cfg} at {imgsz}: relative errors {errors}"
    VERIFIED.append((cfg, imgsz, "one2one" if head_end2end else "built", tuple(errors)))


def test_every_architecture_yaml_is_exercised():
    """Guard against the list silently shrinking: 30 task models, 9 large scales, 6 P2/P6 variants."""
    assert len(ARCHITECTURES) == 45
    assert len(set(ARCHITECTURES)) == 45
