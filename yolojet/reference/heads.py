"""Per-task post-processing in torch ops, following ultralytics' predictors: the CPU fallback and the truth the
GPU kernels of each task are held to. One module per task; the checks they share are here."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from yolojet.errors import EngineConfigError


def check_options(conf: float, iou: float, max_det: int, classes: Sequence[int] | None, nc: int) -> None:
    if not 0 <= conf <= 1 or not 0 <= iou <= 1:
        raise EngineConfigError(f"conf {conf} and iou {iou} must lie in [0, 1]")
    if max_det < 1:
        raise EngineConfigError(f"max_det {max_det}: must be at least 1")
    if nc < 1:
        raise EngineConfigError(f"nc {nc}: a model has at least one class")
    if classes is not None and any(not 0 <= int(c) < nc for c in classes):
        raise EngineConfigError(f"classes {list(classes)}: class ids run from 0 to {nc - 1}")


def head_output(preds: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
    """The first output when the executor returns several (as ultralytics' non_max_suppression takes it)."""
    if isinstance(preds, (tuple, list)):
        if not preds:
            raise EngineConfigError("preds: an empty sequence of head outputs")
        preds = preds[0]
    if not isinstance(preds, torch.Tensor) or preds.ndim != 3:
        shape = tuple(preds.shape) if isinstance(preds, torch.Tensor) else type(preds).__name__
        raise EngineConfigError(f"preds: expected a 3-d head output tensor, got {shape}")
    return preds
