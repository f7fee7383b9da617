"""ultralytics' own ONNX export of a model, the ONNX Runtime peer of `yolojet report` (export/ is the one room that
imports ultralytics)."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

from torch import nn

from yolojet.ir import ModelMeta


def export_onnx(module: nn.Module, meta: ModelMeta, workdir: Path) -> Path:
    """The model as ultralytics exports it to ONNX (fp32, dynamic batch, not simplified), written under `workdir`."""
    from ultralytics.engine.exporter import Exporter
    from ultralytics.utils import LOGGER

    exported: Any = copy.deepcopy(module)  # given the attributes ultralytics' Exporter reads, not nn.Module's typing
    exported.pt_path = str(workdir / "model.pt")  # the export lands beside it, not beside the user's checkpoint
    if not hasattr(exported, "args"):
        exported.args = {}
    if not hasattr(exported, "task"):
        exported.task = meta.task
    # nms=False keeps the one-to-one head where the model directory runs it; None, the raw one-to-many output.
    overrides = {
        "format": "onnx",
        "imgsz": list(meta.imgsz),
        "dynamic": True,
        "simplify": False,
        "batch": 1,
        "device": "cpu",
        "verbose": False,
        "mode": "export",
        "nms": False if meta.end2end else None,
    }
    level = LOGGER.level
    LOGGER.setLevel(logging.WARNING)  # its export log goes to stdout, where the report's tables go
    try:
        return Path(Exporter(overrides=overrides)(model=exported))
    finally:
        LOGGER.setLevel(level)
