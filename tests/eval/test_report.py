"""`yolojet report` on the small dataset of test_val.py (the shipped photos, ground truth from ultralytics' own
predictions): yolojet and PyTorch eager run the same weights through the same letterbox and evaluator, so their
mAPs agree, and yolojet's equals what `validate` gives for the engine."""

from __future__ import annotations

import json
import math
from copy import deepcopy

import pytest
import torch
from support import calibrated_model, random_model
from test_val import cpu_fallback, write_coco_dataset

import yolojet
from yolojet.cli import main
from yolojet.engine.engine import Engine
from yolojet.eval.datasets import load_dataset
from yolojet.eval.report import batch_sizes, markdown_table, onnx_unavailable
from yolojet.eval.val import validate

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """test_val's COCO folder, with the model saved as an ultralytics checkpoint and exported from it, so the model
    directory names the checkpoint that PyTorch eager loads."""
    root = tmp_path_factory.mktemp("report")
    model = calibrated_model("yolov8n.yaml")
    annotations = write_coco_dataset(root, model)
    checkpoint = root / "calibrated.pt"
    torch.save({"model": deepcopy(model)}, checkpoint)
    model_dir = yolojet.export(str(checkpoint), out=root / "model", imgsz=640)
    assert annotations >= 10, "the check needs objects to mean something"
    return root, model, model_dir


def test_report_rows_share_images_letterbox_and_evaluator(dataset, tmp_path, capsys, monkeypatch):
    cpu_fallback(monkeypatch)
    root, _, model_dir = dataset
    out = tmp_path / "report"
    data = root / "instances.json"
    code = main(["report", str(model_dir), "--data", str(data), "--big-batch", "2", "--iters", "3", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err

    report = json.loads((out / "report.json").read_text())
    assert report["big_batch"] == 2 and report["batches"] == [1, 2] and report["images"] == 5
    (model,) = report["models"]
    rows = {r["runtime"]: r for r in model["rows"]}
    assert {"yolojet-fp32", "pytorch-fp32"} <= rows.keys(), model["notes"]
    for row in rows.values():
        assert math.isfinite(row["ms_per_img_batch1"]) and row["ms_per_img_batch1"] > 0
        assert math.isfinite(row["img_per_s_big_batch"]) and row["img_per_s_big_batch"] > 0
        assert set(row["latency_ms"]) == {"1", "2"}
    ours, theirs = rows["yolojet-fp32"], rows["pytorch-fp32"]
    assert ours["mAP50-95"] >= 0.99  # the ground truth is these weights' own predictions
    assert abs(ours["mAP50-95"] - theirs["mAP50-95"]) <= 0.005
    if onnx_unavailable() is None:  # ONNX Runtime is optional: where it is installed, its row must agree too
        assert abs(ours["mAP50-95"] - rows["onnxruntime"]["mAP50-95"]) <= 0.005
    else:
        assert "onnxruntime" not in rows and onnx_unavailable() in report["notes"]

    # The report's yolojet row is exactly what `yolojet val --protocol predict` scores for the same square engine.
    engine = Engine.load(model_dir, half=False, max_batch=2, rect=False)
    expected = validate(engine, load_dataset(data), batch=2, progress=False, protocol="predict").scores
    assert ours["mAP50-95"] == pytest.approx(expected.map50_95, abs=1e-6)
    assert ours["mAP50"] == pytest.approx(expected.map50, abs=1e-6)

    png = (out / "latency.png").read_bytes()
    assert png.startswith(PNG_SIGNATURE)
    from PIL import Image

    with Image.open(out / "latency.png") as image:
        image.verify()
        assert image.format == "PNG" and image.size[0] > 100

    markdown = (out / "report.md").read_text()
    assert "| runtime" in markdown and "| ms/img batch 1 |" in markdown and "img/s at batch 2" in markdown
    label = ours["label"]
    assert f"| {label}" in markdown and "| pytorch-fp32" in markdown
    assert f"{ours['mAP50-95']:.4f}" in markdown
    # The tables (and their notes) are what is printed on stdout, after everything else has run.
    assert captured.out.startswith(f"### {model_dir}") and "| pytorch-fp32" in captured.out
    # Its mAP is at the engine's own square input, not val's rectangles: both outputs say so.
    assert f"({model['imgsz'][0]}x{model['imgsz'][1]}, every image letterboxed to it)" in captured.out
    assert "rect=False; yolojet val scores ultralytics' rectangles" in markdown
    assert captured.out.strip() in markdown
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")], "no staging files left behind"


def test_missing_dataset_writes_nothing(dataset, tmp_path, capsys, monkeypatch):
    cpu_fallback(monkeypatch)
    root, _, model_dir = dataset
    out = tmp_path / "report"
    code = main(["report", str(model_dir), "--data", str(root / "missing.json"), "--out", str(out)])
    assert code == 2 and "no such dataset file" in capsys.readouterr().err
    assert not out.exists()


def test_a_model_report_cannot_score_is_refused_before_any_is_measured(dataset, tmp_path, capsys, monkeypatch):
    """A segment model after a detection model: refused up front, not after the first model's minutes of work."""
    import yolojet.engine.engine

    cpu_fallback(monkeypatch)
    root, _, model_dir = dataset

    def no_measuring(*args, **kwargs):
        raise AssertionError("a model was measured before every model was checked")

    monkeypatch.setattr(yolojet.engine.engine.Engine, "load", no_measuring)
    segment = yolojet.export(random_model("yolov8n-seg.yaml"), out=tmp_path / "seg", imgsz=640)
    out = tmp_path / "report"
    code = main(["report", str(model_dir), str(segment), "--data", str(root / "instances.json"), "--out", str(out)])
    assert code == 2 and "a segment model; `report` compares detection models' boxes" in capsys.readouterr().err
    assert not out.exists()


def test_model_dir_without_checkpoint_reports_yolojet_alone(dataset, tmp_path, capsys, monkeypatch):
    """A model directory exported from an in-memory model names no checkpoint: the PyTorch rows are left out with
    a note that says why, and the report still runs."""
    cpu_fallback(monkeypatch)
    root, model, _ = dataset
    model_dir = yolojet.export(model, out=tmp_path / "model", imgsz=640)
    out = tmp_path / "report"
    code = main(
        [
            "report",
            str(model_dir),
            "--data",
            str(root / "instances.json"),
            "--big-batch",
            "1",
            "--iters",
            "1",
            "--out",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err
    (report,) = json.loads((out / "report.json").read_text())["models"]
    expected = ["yolojet-fp16", "yolojet-fp32"] if torch.cuda.is_available() else ["yolojet-fp32"]
    assert [r["runtime"] for r in report["rows"]] == expected
    assert any("no PyTorch" in n and "checkpoint" in n for n in report["notes"])


def test_helpers():
    assert batch_sizes(1) == [1]
    assert batch_sizes(64) == [1, 2, 4, 8, 16, 32, 64]
    assert batch_sizes(6) == [1, 2, 4, 6]
    table = markdown_table([("a", "1.00")], ("runtime", "ms"))
    assert table.splitlines() == ["| runtime |   ms |", "| ------- | ---: |", "| a       | 1.00 |"]
