"""Checkpoints with custom class counts, saved the way ultralytics saves them, run with no per-model code.

A user's fine-tuned model is a `.pt` with its own class count and names, fp16 weights and the training
arguments (the image size among them). Each model here is built from an architecture YAML with nc=2 or
nc=7 and custom names, given BatchNorm statistics measured on the shipped photos, saved as an
ultralytics checkpoint, then loaded by path both by yolojet (our kernels: Triton's interpreter on the CPU,
the captured graph on a GPU) and by ultralytics' `YOLO`, and predicted on the same photos. No image size
is passed to yolojet: it must take the training size from the checkpoint, as predict does. Class ids and
names must come from the checkpoint, and the engine's channel padding must never show in the results.
"""

from __future__ import annotations

import datetime

import numpy as np
import pytest
import torch
from support import assert_same_top5, calibrate_batchnorm, match_detections, real_photos

import yolojet
from yolojet.engine.engine import Engine

TASK_MODELS = {"detect": "DetectionModel", "segment": "SegmentationModel", "classify": "ClassificationModel"}


def save_checkpoint(path, cfg: str, task: str, nc: int, imgsz: int):
    """An ultralytics-layout checkpoint (as its trainer's `save_model` writes it): fp16 model, train args."""
    from copy import deepcopy

    import ultralytics
    from ultralytics.nn import tasks

    torch.manual_seed(nc)
    model = getattr(tasks, TASK_MODELS[task])(cfg, nc=nc, verbose=False).float()
    model = calibrate_batchnorm(model, imgsz)
    if task == "classify":  # calibrated random logits are near-uniform; peak them so the top-5 means something
        with torch.no_grad():
            model.model[-1].linear.weight.mul_(30)
            model.model[-1].linear.bias.mul_(30)
    model.names = {i: f"kind-{i}" for i in range(nc)}
    model.args = {"task": task, "imgsz": imgsz, "data": "custom.yaml", "single_cls": False}
    checkpoint = {
        "date": datetime.datetime.now().isoformat(),
        "version": ultralytics.__version__,
        "epoch": -1,
        "best_fitness": None,
        "model": deepcopy(model).half(),
        "ema": None,
        "updates": None,
        "optimizer": None,
        "train_args": dict(model.args),
        "train_metrics": {},
    }
    torch.save(checkpoint, path)
    return path


def ultralytics_predict(path, images, conf: float):
    from ultralytics import YOLO

    results = YOLO(str(path)).predict(images, conf=conf, verbose=False, rect=False)
    return [r.cpu() for r in results]  # predict leaves them on its device


@pytest.mark.parametrize(
    ("cfg", "task", "nc"),
    [("yolo11n.yaml", "detect", 2), ("yolov8n-seg.yaml", "segment", 7), ("yolo11n-cls.yaml", "classify", 7)],
)
def test_custom_class_count_checkpoint_runs_like_ultralytics(cfg, task, nc, tmp_path, monkeypatch):
    monkeypatch.setenv("YOLOJET_CACHE", str(tmp_path / "cache"))
    imgsz = {"classify": 64}.get(task, 640 if torch.cuda.is_available() else 128)
    checkpoint = save_checkpoint(tmp_path / "custom.pt", cfg, task, nc, imgsz)
    # predict letterboxes a list of photos of several sizes to the square, as rect=False does (its LetterBox runs
    # auto only where every image of a batch has one shape)
    engine = Engine.load(checkpoint, backend="triton", half=False, max_batch=2, tune=False, rect=False)
    assert engine.meta.imgsz == (imgsz, imgsz), "the training size must be the default"
    assert engine.meta.nc == nc and engine.names == {i: f"kind-{i}" for i in range(nc)}
    photos = [real_photos()["bus.jpg"], real_photos()["zidane.jpg"], real_photos()["coffee"]]
    conf = 0.01 if torch.cuda.is_available() else 0.001
    ours, theirs = engine(photos, conf=conf), ultralytics_predict(checkpoint, photos, conf)
    found = 0
    for got, want in zip(ours, theirs, strict=True):
        assert got.error is None
        if task == "classify":
            assert got.probs.data.shape == (nc,), "padding leaked into the probabilities"
            assert_same_top5(got.probs.top5, list(want.probs.top5), want.probs.data.numpy())
            assert float(np.abs(got.probs.data - want.probs.data.cpu().numpy()).max()) <= 5e-3
            continue
        assert not match_detections(got.boxes.data, want.boxes.data)
        classes = got.boxes.cls.astype(int)
        assert classes.size == 0 or classes.max() < nc, "a padded class came out"
        assert {got.names[c] for c in classes} <= {f"kind-{i}" for i in range(nc)}
        if task == "segment" and len(
            got
        ):  # test_segment holds masks to predict's exactly; here: the coefficients line up
            from ultralytics.utils.ops import scale_masks

            theirs_masks = scale_masks(want.masks.data[None].float().cpu(), got.orig_shape)[0].numpy() > 0.5
            assert got.masks.data.shape == theirs_masks.shape
            for a, b in zip(got.masks.data, theirs_masks, strict=True):
                union = np.logical_or(a, b).sum()
                assert union == 0 or np.logical_and(a, b).sum() / union >= 0.95
        found += len(got)
    assert task == "classify" or found >= 2, "the comparison needs detections"
    assert yolojet.Engine.load(checkpoint, backend="reference").meta.imgsz == (imgsz, imgsz)
