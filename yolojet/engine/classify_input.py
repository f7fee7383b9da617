"""Classification input on the GPU: a `ResamplePlan` (reference/classify.py: Pillow's resize and centre crop, as
ultralytics' classify transforms) uploaded once per frame shape and run by our resample kernel."""

from __future__ import annotations

import numpy as np
import torch

from yolojet.kernels.preprocess import resample_pass
from yolojet.reference.classify import PRECISION_BITS, ResamplePass, ResamplePlan


class DeviceResamplePlan:
    """A `ResamplePlan` on the device, run by our resample kernel: taps uploaded once, an intermediate buffer for
    each pass but the last. Calling it writes one frame's classification input into an (h, w, 3) NHWC slot."""

    def __init__(self, plan: ResamplePlan, channels: int, device: torch.device) -> None:
        rows, cols = plan.window[2:]
        self.window = plan.window
        passes = plan.passes or (  # nothing to resize: one identity pass does the crop, RGB and /255
            ResamplePass(0, np.arange(rows)[:, None], np.full((rows, 1), 1 << PRECISION_BITS, np.int32)),
        )
        kept = 1 if channels == 1 else 3
        shape = [rows, cols]
        self.steps: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
        for k, step in enumerate(passes):
            shape[step.axis] = step.index.shape[0]
            last = k == len(passes) - 1
            scratch = None if last else torch.empty(*shape, kept, dtype=torch.uint8, device=device)
            index = torch.from_numpy(step.index.astype(np.int32)).to(device)
            weights = torch.from_numpy(step.weights.astype(np.int32)).to(device)
            self.steps.append((step.axis, index, weights, scratch))

    def __call__(self, out: torch.Tensor, frame: torch.Tensor, *, bgr: bool) -> None:
        top, left, rows, cols = self.window
        source = frame[top : top + rows, left : left + cols]
        for axis, index, weights, scratch in self.steps:
            target = out if scratch is None else scratch
            resample_pass(target, source, axis, index, weights, bgr=bgr if scratch is None else None)
            source = target
