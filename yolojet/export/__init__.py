"""Checkpoint → graph IR. The only room that imports ultralytics, and only when an export runs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn


def export(
    source: str | Path | nn.Module,
    out: str | Path | None = None,
    imgsz: int | tuple[int, int] | None = None,
    end2end: bool | None = None,
) -> Path:
    """Export a `.pt` checkpoint, an ultralytics model name or an architecture YAML to a model directory.

    `source` may also be an ultralytics model object. `imgsz` is an int or (height, width), each a
    multiple of the model's largest stride; None takes the size the checkpoint was trained at, as
    ultralytics' predict does (640 when it does not say). `end2end=None` follows the checkpoint's head mode (YOLO26
    one-to-one vs one-to-many); True or False overrides it. Returns the model directory's path; the
    directory is written atomically (default: `<name>_yolojet` beside the checkpoint, or here).
    """
    from yolojet.export.walker import export_model

    return export_model(source, out=out, imgsz=imgsz, end2end=end2end)
