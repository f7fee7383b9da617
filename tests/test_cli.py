"""The `yolojet` command: export and info, and a clear error for each kind of bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import random_model, relative_max_error, run_cli
from torch import nn

import yolojet
from yolojet.cli import main
from yolojet.errors import UnsupportedModuleError, YolojetError


def test_export_yaml_then_info(tmp_path, capsys):
    out = tmp_path / "yolo11n"
    code, stdout, stderr = run_cli(capsys, "export", "yolo11n.yaml", "--imgsz", "128x96", "--out", out)
    assert code == 0, stderr
    assert "RANDOM weights" in stderr
    assert (out / "graph.json").is_file() and (out / "weights.safetensors").is_file()

    code, stdout, stderr = run_cli(capsys, "info", out)
    assert code == 0, stderr
    assert "task          detect" in stdout
    assert "input         3x128x96" in stdout
    assert "attention" in stdout and "conv" in stdout
    assert "(RANDOM weights)" in stdout
    assert "a photo of height 1080 and width 810 runs at 128x96, height x width" in stdout

    code, _, stderr = run_cli(capsys, "export", out, "--imgsz", "64")  # a model directory is not exported again
    assert code == 2 and "already a yolojet model directory; export takes a .pt checkpoint" in stderr, stderr

    code, stdout, stderr = run_cli(capsys, "info", "yolov8n-cls.yaml")  # what every other command takes
    assert code == 0, stderr
    assert "task          classify" in stdout and "resize and centre crop" in stdout


def test_info_gflops_agree_with_ultralytics(tmp_path, capsys):
    from copy import deepcopy

    from ultralytics.utils.torch_utils import get_flops

    model = random_model("yolo11n.yaml")
    graph = yolojet.Graph.load(yolojet.export(model, out=tmp_path / "m", imgsz=640))
    ultralytics_gflops = get_flops(model, 640)
    assert abs(graph.flops() / 1e9 - ultralytics_gflops) / ultralytics_gflops < 0.02
    # Parameters as ultralytics counts the fused model's, a DFL head's fixed weights among them (yolo11n), or none
    # (yolo26n: reg_max 1).
    for name in ("yolo11n.yaml", "yolo26n.yaml"):
        model = random_model(name)
        code, stdout, stderr = run_cli(capsys, "info", yolojet.export(model, out=tmp_path / name, imgsz=64))
        assert code == 0, stderr
        fused = sum(p.numel() for p in deepcopy(model).fuse().parameters())
        assert f"parameters    {fused:,}\n" in stdout, (name, fused, stdout)


def test_export_checkpoint_file_beside_it(tmp_path, capsys, monkeypatch):
    """A `.pt` checkpoint (ultralytics' {"model": ...} layout) exports next to itself and runs like the original."""
    model = random_model("yolov8n-pose.yaml")
    checkpoint = tmp_path / "weights" / "pose.pt"
    checkpoint.parent.mkdir()
    torch.save({"model": model}, checkpoint)
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = run_cli(capsys, "export", checkpoint, "--imgsz", "128")
    assert code == 0, stderr
    model_dir = tmp_path / "weights" / "pose_128x128_yolojet"
    assert model_dir.is_dir(), stdout
    x = torch.rand(1, 3, 128, 128)
    with torch.inference_mode():
        expected = model(x)[0]
    assert relative_max_error(yolojet.load_reference(model_dir)(x), expected) <= 1e-4


def test_missing_file(tmp_path, capsys):
    code, _, stderr = run_cli(capsys, "export", tmp_path / "nope" / "missing.pt")
    assert code == 2
    assert "missing.pt: no such file" in stderr


def test_unknown_model_name_says_it_could_not_be_fetched(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, stderr = run_cli(capsys, "export", "yolo99z.pt")
    assert code == 2
    assert "yolo99z.pt: not found locally" in stderr


def test_unknown_architecture_yaml(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, stderr = run_cli(capsys, "export", "yolo99z.yaml")
    assert code == 2
    assert "yolo99z.yaml" in stderr and "architecture" in stderr


def test_yaml_files_that_are_no_buildable_model(tmp_path, capsys):
    """A dataset YAML passed as the model, broken YAML, and an architecture ultralytics' YOLO cannot build
    (RT-DETR): each one line naming the file, exit status 2, nothing written."""
    dataset = tmp_path / "data.yaml"
    dataset.write_text("train: images/train\nval: images/val\nnames:\n  0: cat\n")
    broken = tmp_path / "broken.yaml"
    broken.write_text("backbone: [\n  - [a, b\n")
    cases = [
        (dataset, "not a model architecture file (no 'backbone' and 'head' sections): it looks like a dataset YAML"),
        (broken, "not valid YAML"),
        ("rtdetr-l.yaml", "ultralytics cannot build this architecture as a YOLO model"),
    ]
    for source, message in cases:
        for command in (("export", source, "--out", tmp_path / "out"), ("detect", source, tmp_path / "x.jpg")):
            code, _, stderr = run_cli(capsys, *command)
            assert code == 2, stderr
            assert f"{Path(source).name}: {message}" in stderr, stderr
            assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert not (tmp_path / "out").exists()


def test_dump_without_a_gpu_or_the_interpreter_says_what_it_needs(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    code, _, stderr = run_cli(capsys, "dump", tmp_path, "--device", "cpu", "--out", tmp_path / "dump")
    assert code == 2
    assert "dump runs the Triton kernels: on the CPU set TRITON_INTERPRET=1 (slow, for tests)" in stderr, stderr
    assert "reference executor" not in stderr  # said before any model loads


def test_the_reference_notice_comes_once_a_model_loads(tmp_path, capsys, monkeypatch):
    """On the CPU without Triton's interpreter the reference executor runs, and says so once the model has loaded:
    not before a model's own error, which stays one line."""
    from yolojet.engine.engine import Engine

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    notice = "running the float32 reference executor on the CPU"
    with pytest.raises(YolojetError, match="nowhere_model: no such file"):
        Engine.load(tmp_path / "nowhere_model", device="cpu")
    assert notice not in capsys.readouterr().err
    model_dir = yolojet.export(random_model("yolov8n-cls.yaml"), out=tmp_path / "cls", imgsz=64)
    capsys.readouterr()
    Engine.load(model_dir, device="cpu").close()
    assert notice in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"yolojet {yolojet.__version__}"


def test_corrupt_checkpoint(tmp_path, capsys):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(torch.randint(0, 256, (4096,), dtype=torch.uint8).numpy().tobytes())
    code, _, stderr = run_cli(capsys, "export", bad, "--out", tmp_path / "out")
    assert code == 2
    assert "bad.pt: cannot read as a PyTorch checkpoint, corrupt or truncated? (" in stderr
    assert stderr.count(str(bad)) == 1, stderr  # named once, not again in the reason
    assert not (tmp_path / "out").exists()


def test_truncated_checkpoint(tmp_path, capsys):
    good = tmp_path / "good.pt"
    torch.save({"model": random_model("yolov8n.yaml")}, good)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[:20000])
    code, _, stderr = run_cli(capsys, "export", truncated)
    assert code == 2
    assert "truncated.pt: cannot read as a PyTorch checkpoint" in stderr
    assert stderr.count(str(truncated)) == 1, stderr


def test_non_yolo_checkpoints(tmp_path, capsys):
    foreign_module = tmp_path / "linear.pt"
    torch.save({"model": nn.Linear(3, 2)}, foreign_module)
    code, _, stderr = run_cli(capsys, "export", foreign_module)
    assert code == 2
    assert "not an ultralytics YOLO model" in stderr

    for name, content in (("state_dict.pt", {"state_dict": nn.Linear(3, 2).state_dict()}), ("t.pt", torch.zeros(3))):
        torch.save(content, tmp_path / name)
        code, _, stderr = run_cli(capsys, "export", tmp_path / name)
        assert code == 2
        assert f"{name}: a PyTorch file, but not an ultralytics YOLO checkpoint (no model saved under 'model'" in stderr
        assert "has no attribute" not in stderr and "yolo predict" not in stderr  # ultralytics' internals, not ours


def test_imgsz_not_multiple_of_stride(tmp_path, capsys):
    out = tmp_path / "out"
    code, _, stderr = run_cli(capsys, "export", "yolov8n.yaml", "--imgsz", "100", "--out", out)
    assert code == 2
    assert "100x100" in stderr and "multiples of the model's stride 32" in stderr
    assert not out.exists()

    code, _, stderr = run_cli(capsys, "export", "yolov8n-p6.yaml", "--imgsz", "96", "--out", out)
    assert code == 2
    assert "stride 64" in stderr


def test_bad_imgsz_text(capsys):
    try:
        main(["export", "yolov8n.yaml", "--imgsz", "big"])
    except SystemExit as e:
        assert e.code == 2
    assert "expected an integer or HEIGHTxWIDTH" in capsys.readouterr().err


def test_failed_export_keeps_previous_directory(tmp_path, capsys):
    out = tmp_path / "model"
    assert run_cli(capsys, "export", "yolov8n-cls.yaml", "--imgsz", "64", "--out", out)[0] == 0
    before = (out / "graph.json").read_bytes()
    assert run_cli(capsys, "export", "yolov8n-cls.yaml", "--imgsz", "65", "--out", out)[0] == 2
    assert (out / "graph.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_unsupported_module_names_class_and_layer(tmp_path):
    class Mystery(nn.Module):
        def forward(self, x):
            return x

    model = random_model("yolov8n.yaml")
    original = model.model[3]
    mystery = Mystery()
    mystery.f, mystery.i = original.f, original.i
    model.model[3] = mystery
    try:
        yolojet.export(model, out=tmp_path / "m", imgsz=64)
    except UnsupportedModuleError as e:
        assert e.module_class == "Mystery" and e.layer == 3
        assert "layer 3: unsupported module Mystery" in str(e)
    else:
        raise AssertionError("an unknown module class must not be skipped silently")
    finally:
        model.model[3] = original

    upsample = model.model[10]  # a factor a side: the IR's upsample takes one
    upsample.scale_factor = (2.0, 3.0)
    with pytest.raises(UnsupportedModuleError, match="layer 10: unsupported module Upsample"):
        yolojet.export(model, out=tmp_path / "m", imgsz=64)
    upsample.scale_factor = (2.0, 2.0)
    assert yolojet.export(model, out=tmp_path / "m", imgsz=64).is_dir()


def test_info_on_bad_directories(tmp_path, capsys):
    code, _, stderr = run_cli(capsys, "info", tmp_path / "absent")
    assert code == 2 and "absent: no such file" in stderr

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "graph.json").write_text("{not json")
    (broken / "weights.safetensors").write_bytes(b"")
    code, _, stderr = run_cli(capsys, "info", broken)
    assert code == 2 and "not valid JSON" in stderr


def test_dump_then_compare(tmp_path, capsys):
    """`dump` runs the engine's kernels and the reference on a real photo; `compare` finds them within the gate."""
    from ultralytics.utils import ASSETS

    model_dir = yolojet.export(random_model("yolov8n-cls.yaml"), out=tmp_path / "cls", imgsz=64)
    dump_dir = tmp_path / "dump"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    code, stdout, stderr = run_cli(
        capsys, "dump", model_dir, "--image", ASSETS / "bus.jpg", "--out", dump_dir, "--device", device
    )
    assert code == 0, stderr
    assert (dump_dir / "engine.safetensors").is_file() and (dump_dir / "reference.safetensors").is_file()
    code, stdout, stderr = run_cli(capsys, "compare", dump_dir)
    assert code == 0, stdout
    assert "0 over the fp16 gate" in stdout
    assert "28 values" in stdout  # the input and the output of each of the 27 launches (the head pools too)

    # The engine switches reach dump: unfused, the classifier's pool is a launch of its own, its output a value.
    code, _, stderr = run_cli(
        capsys, "dump", model_dir, "--out", tmp_path / "unfused", "--device", device, "--no-fuse", "--no-tune"
    )
    assert code == 0, stderr
    code, stdout, _ = run_cli(capsys, "compare", tmp_path / "unfused")
    assert code == 0 and "0 over the fp16 gate" in stdout and "29 values" in stdout, stdout


def test_compare_flags_values_over_the_gate(tmp_path, capsys):
    from safetensors.torch import save_file

    good, bad = torch.rand(2, 8), torch.rand(2, 8)
    save_file({"a": good, "b": bad}, str(tmp_path / "engine.safetensors"), {"precision": "fp32"})
    save_file({"a": good, "b": bad + 1}, str(tmp_path / "reference.safetensors"), {"precision": "fp32"})
    code, stdout, _ = run_cli(capsys, "compare", tmp_path)
    assert code == 1
    assert stdout.splitlines()[2].startswith("b ") and "FAIL" in stdout
    assert "1 over the fp32 gate" in stdout

    unwritten = torch.full((2, 8), float("nan"))  # a value a launch left unwritten: listed first, over the gate
    save_file({"a": good, "b": bad, "n": unwritten}, str(tmp_path / "engine.safetensors"), {"precision": "fp32"})
    reference = {"a": good, "b": bad + 1, "n": good.clone()}
    save_file(reference, str(tmp_path / "reference.safetensors"), {"precision": "fp32"})
    code, stdout, _ = run_cli(capsys, "compare", tmp_path, "--top", "1")
    assert code == 1 and stdout.splitlines()[2].startswith("n ") and "2 over the fp32 gate" in stdout

    tiny = torch.rand(2, 8) * 1e-6  # below fp16's normal range: an untrained model's activations
    save_file({"t": tiny}, str(tmp_path / "engine.safetensors"), {"precision": "fp16"})
    save_file({"t": tiny * 2}, str(tmp_path / "reference.safetensors"), {"precision": "fp16"})
    code, stdout, _ = run_cli(capsys, "compare", tmp_path)
    assert code == 1 and "1 of them never reach fp16's normal range" in stdout

    overflowed = torch.full((2, 8), float("inf"))  # past fp16's largest value, 65504
    save_file({"h": overflowed}, str(tmp_path / "engine.safetensors"), {"precision": "fp16"})
    save_file({"h": torch.full((2, 8), 1.05e5)}, str(tmp_path / "reference.safetensors"), {"precision": "fp16"})
    code, stdout, _ = run_cli(capsys, "compare", tmp_path)
    assert code == 1 and "1 of them go past fp16's largest value (65504)" in stdout and "--fp32" in stdout


def test_a_one_to_one_head_asked_of_a_model_without_one_is_a_bad_option(tmp_path, capsys):
    code, _, stderr = run_cli(capsys, "export", "yolo11n.yaml", "--head", "one2one", "--out", tmp_path / "m")
    assert code == 2 and "--head one2one (end2end=True): this model's Detect head has no one-to-one branch" in stderr
    assert "unsupported module" not in stderr and not (tmp_path / "m").exists()


def test_dump_and_compare_errors(tmp_path, capsys):
    model_dir = yolojet.export(random_model("yolov8n-cls.yaml"), out=tmp_path / "cls", imgsz=64)
    not_an_image = tmp_path / "notes.jpg"
    not_an_image.write_text("not an image")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    code, _, stderr = run_cli(capsys, "dump", model_dir, "--image", not_an_image, "--device", device)
    assert code == 2 and "notes.jpg: cannot decode as an image" in stderr
    code, _, stderr = run_cli(capsys, "compare", tmp_path / "nothing")
    assert code == 2 and "run `yolojet dump` first" in stderr


def test_profile(tmp_path, capsys):
    model_dir = yolojet.export(random_model("yolov8n-cls.yaml"), out=tmp_path / "cls", imgsz=64)
    code, stdout, stderr = run_cli(capsys, "profile", model_dir)
    if torch.cuda.is_available():
        assert code == 0 and "conv" in stdout and "whole graph replay" in stdout
    else:
        assert code == 2 and "no CUDA device" in stderr


def timed_rows(stdout: str) -> dict[str, list[float]]:
    """The rows of a timing table `pipeline` or `bench` printed: a name, then its p20, p50, p80 (and img/s)."""
    import re

    rows = {}
    for line in stdout.splitlines():
        match = re.fullmatch(r"(\S.*?)\s{2,}(\d+\.\d{4})\s+(\d+\.\d{4})\s+(\d+\.\d{4})(?:\s+([\d,]+))?\s*", line)
        if match:
            rows[match[1]] = [float(v.replace(",", "")) for v in match.groups()[1:] if v is not None]
    return rows


# What each timing command prints a row for, in order.
TIMED = {
    "pipeline": [
        "frame in pinned host memory -> boxes in pinned memory",
        "frame in GPU memory -> boxes in pinned memory",
        "network only (graph replay)",
    ],
    "bench": ["stream launches", "CUDA graph replay"],
}


def test_pipeline_and_bench(tmp_path, capsys):
    model_dir = yolojet.export(random_model("yolov8n.yaml"), out=tmp_path / "det", imgsz=64)
    for command, names in TIMED.items():
        code, stdout, stderr = run_cli(capsys, command, model_dir, "--iters", "5", "--warmup", "1")
        if not torch.cuda.is_available():
            assert code == 2 and f"{command} times the GPU path" in stderr
            continue
        assert code == 0, stderr
        rows = timed_rows(stdout)
        assert list(rows) == names, stdout
        for name, (p20, p50, p80, *rate) in rows.items():
            assert 0 < p20 <= p50 <= p80, f"{name}: {stdout}"
            if rate:  # bench: the batch of 1 over the median
                assert rate[0] == pytest.approx(1000 / p50, rel=0.01, abs=1), f"{name}: {stdout}"


def test_timing_commands_refuse_bad_numbers_and_images_before_any_build(tmp_path, capsys):
    """Runs, warm-up runs and thresholds out of range are argparse's errors (one line, exit 2), and a missing --image
    or model is named before the engine is built or a GPU looked for: each would otherwise surface only after a build
    (or, without a GPU, never)."""
    for argv, fragment in (
        (("pipeline", "m", "--iters", "0"), "'0': expected a positive integer"),
        (("bench", "m", "--iters", "-1"), "'-1': expected a positive integer"),
        (("bench", "m", "--warmup", "-5"), "'-5': expected a whole number, 0 or more"),
        (("pipeline", "m", "--conf", "7"), "'7': expected a number in [0, 1]"),
        (("pipeline", "m", "--conf", "nan"), "'nan': expected a number in [0, 1]"),
        (("val", "m", "--data", "d.json", "--iou", "1.5"), "'1.5': expected a number in [0, 1]"),
        (("report", "m", "--data", "d.json", "--iters", "0"), "'0': expected a positive integer"),
    ):
        code, _, stderr = run_cli(capsys, *argv)
        assert code == 2 and fragment in stderr and "Traceback" not in stderr, (argv, stderr)
    for argv in (("profile", "m", "--iters", "5"), ("bench", "m", "--device", "cpu")):  # options they do not take
        code, _, stderr = run_cli(capsys, *argv)
        assert code == 2 and f"usage: yolojet {argv[0]} " in stderr, stderr
        assert f"unrecognized arguments: {' '.join(argv[2:])}" in stderr, stderr
    code, _, stderr = run_cli(capsys, "pipeline", tmp_path / "no_model", "--image", tmp_path / "absent.jpg")
    assert code == 2 and "absent.jpg" in stderr and "CUDA" not in stderr, stderr
    for command in ("pipeline", "bench", "profile"):  # a missing model is named before any GPU is looked for
        code, _, stderr = run_cli(capsys, command, tmp_path / "runs" / "best.pt")
        assert code == 2 and "best.pt: no such file or model directory" in stderr and "CUDA" not in stderr, stderr
    from yolojet.engine.models import check_model_exists

    for name in ("yolo11n.pt", "yolo11n.yaml", "yolov8n-seg.yml"):  # fetched by ultralytics, or shipped with it
        check_model_exists(name)


def test_a_full_standard_output_is_a_line_not_a_traceback(tmp_path):
    """`yolojet info MODEL > /dev/full`: the write fails for want of room; one line on stderr, exit 2."""
    model_dir = yolojet.export(random_model("yolov8n-cls.yaml"), out=tmp_path / "cls", imgsz=64)
    with open("/dev/full", "w") as full:
        command = [sys.executable, "-m", "yolojet.cli", "info", str(model_dir)]
        done = subprocess.run(command, stdout=full, stderr=subprocess.PIPE, text=True)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "yolojet info: error: an output could not be written: [Errno 28] No space left on device"
    ], done.stderr


def test_export_defaults_to_the_training_size(tmp_path, capsys):
    """Without --imgsz a checkpoint exports at the size it was trained at (its train args), as predict runs it."""
    from copy import deepcopy

    model = deepcopy(random_model("yolov8n-cls.yaml"))
    model.args = {"task": "classify", "imgsz": 96}
    checkpoint = tmp_path / "cls.pt"
    torch.save({"model": model, "train_args": dict(model.args)}, checkpoint)
    code, _, stderr = run_cli(capsys, "export", checkpoint)
    assert code == 0, stderr
    graph = yolojet.Graph.load(tmp_path / "cls_96x96_yolojet")
    assert tuple(graph.meta.imgsz) == (96, 96)


def test_engine_switches(tmp_path, capsys):
    """--no-tune, --no-fuse, --no-pdl and --no-branches reach Engine.load and change no detection."""
    from ultralytics.utils import ASSETS

    from yolojet.cli import _engine_switches, build_parser
    from yolojet.options import EngineOptions

    args = build_parser().parse_args(["detect", "m", "x.jpg", "--no-tune", "--no-fuse", "--no-pdl", "--no-branches"])
    assert _engine_switches(args) == {"switches": EngineOptions(tune=False, fuse=False, pdl=False, branches=False)}
    args = build_parser().parse_args(["bench", "m"])
    assert _engine_switches(args) == {"switches": EngineOptions(tune=None, fuse=True, pdl=None, branches=None)}

    model_dir = yolojet.export(random_model("yolov8n.yaml"), out=tmp_path / "det", imgsz=64)
    outputs = []
    for i, switches in enumerate([[], ["--no-tune", "--no-fuse", "--no-pdl", "--no-branches"]]):
        out = tmp_path / f"run{i}.jsonl"
        code, _, stderr = run_cli(
            capsys, "detect", model_dir, ASSETS / "bus.jpg", "--conf", "0.001", "--json", out, *switches
        )
        assert code == 0, stderr
        outputs.append(out.read_text())
    assert outputs[0] == outputs[1] and outputs[0].strip()


def test_unwritable_output_folders_fail_before_any_work(tmp_path, capsys):
    """An --out under a file cannot be created: one line, exit 2, before the model is even loaded."""
    blocker = tmp_path / "a_file"
    blocker.write_text("in the way")
    for argv in (
        ("val", tmp_path / "no_model", "--data", tmp_path / "none.json", "--out", blocker / "out"),
        ("dump", tmp_path / "no_model", "--out", blocker / "out"),
    ):
        code, _, stderr = run_cli(capsys, *argv)
        assert code == 2 and f"{blocker} exists and is not a directory" in stderr, stderr
        assert "Traceback" not in stderr


def test_val_and_report_never_write_over_their_dataset(tmp_path, capsys):
    """A dataset file named as an output of `val` or `report` in its --out folder is refused before any work, and is
    left as it was (the model does not exist: nothing was loaded)."""
    for command, name in (("val", "metrics.json"), ("val", "predictions.json"), ("report", "report.json")):
        folder = tmp_path / command / name.split(".")[0]
        folder.mkdir(parents=True)
        data = folder / name
        data.write_text('{"images": [], "annotations": [], "categories": []}')
        before = data.read_bytes()
        code, _, stderr = run_cli(capsys, command, tmp_path / "no_model", "--data", data, "--out", folder)
        assert code == 2 and f"--out {data}: the dataset this run scores against" in stderr, stderr
        assert data.read_bytes() == before


def test_a_resume_with_other_options_is_refused_before_the_model_loads(tmp_path, capsys):
    """The records' options are compared before any model loads or cluster starts (the model here does not exist, so
    a check made after the load would name it instead)."""
    from ultralytics.utils import ASSETS

    out = tmp_path / "labels.jsonl"
    out.write_text(json.dumps({"path": str(ASSETS / "bus.jpg"), "detections": []}) + "\n")
    (tmp_path / "labels.jsonl.settings.json").write_text(json.dumps({"options": {"conf": 0.3}}) + "\n")
    code, _, stderr = run_cli(
        capsys, "label", ASSETS, "--local", "--model", tmp_path / "no_model", "--out", out, "--resume", "--conf", "0.5"
    )
    assert code == 2 and "its records were made with --conf 0.3; this run asks for --conf 0.5" in stderr, stderr


def test_labeling_through_a_server_never_imports_torch(tmp_path):
    """`yolojet label --server` reads files and sends bytes: torch (seconds of every client process's start) stays
    unimported, through the command line to the server's refusal, and in the modules its streams run."""
    import subprocess
    import sys

    from ultralytics.utils import ASSETS

    code = (
        "import sys\nfrom yolojet import cli\n"
        "import yolojet.client.remote, yolojet.client.records, yolojet.client.label, yolojet.scale.stream_workers\n"
        f"code = cli.main(['label', {str(ASSETS)!r}, '--server', '127.0.0.1:1', '--retries', '0', '--out', "
        f"{str(tmp_path / 'labels.jsonl')!r}])\n"
        "assert code == 2, code\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'torch')\nassert not bad, bad"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "UNAVAILABLE" in done.stderr  # it got as far as asking the server


@pytest.mark.parametrize("command", ["export", "info"])
def test_sigterm_mid_export_leaves_no_staging_folder(tmp_path, capsys, monkeypatch, command):
    """SIGTERM (a scheduler's stop) while the weights are written ends the export as Ctrl-C does: exit 143, and
    neither a half-written model directory nor its hidden staging folder is left; so does `info` of a checkpoint,
    which exports it into the cache first."""
    import os
    import signal

    import yolojet.ir

    def stopped(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs here, mid-write

    def not_handled(*args):
        raise AssertionError("export left SIGTERM to its default: it would have ended the process there")

    monkeypatch.setattr(yolojet.ir, "save_file", stopped)
    checkpoint = tmp_path / "cls.pt"
    torch.save({"model": random_model("yolov8n-cls.yaml")}, checkpoint)
    monkeypatch.setenv("YOLOJET_CACHE", str(tmp_path / "cache"))
    exported = ["export", checkpoint, "--imgsz", "64", "--out", tmp_path / "out"]
    argv = exported if command == "export" else ["info", checkpoint]
    before = signal.signal(signal.SIGTERM, not_handled)  # (the test process's own: this test must not end it)
    try:
        code, _, stderr = run_cli(capsys, *argv)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert code == 143 and "terminated" in stderr, stderr
    left = [p for p in tmp_path.rglob("*") if p.name.startswith(".") or p.suffix in (".json", ".safetensors")]
    assert not left and (command == "info" or not (tmp_path / "out").exists()), left
