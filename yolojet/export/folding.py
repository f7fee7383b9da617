"""BatchNorm folding: conv(x)·γ/σ + (β − μ·γ/σ) becomes one conv with a new weight and bias."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def fold_batchnorm(conv: nn.Conv2d, bn: nn.BatchNorm2d | None) -> tuple[np.ndarray, np.ndarray]:
    """Return (weight, bias) of the conv with `bn` folded in, computed in float64 then stored as float32.

    Folding in float64 keeps the folded model within rounding of the unfused one, which is what
    the 1e-4 export tolerance checks.
    """
    weight = conv.weight.detach().to(torch.float64)
    bias = (
        conv.bias.detach().to(torch.float64)
        if conv.bias is not None
        else torch.zeros(conv.out_channels, dtype=torch.float64)
    )
    if bn is not None:
        # ultralytics' Conv builds BatchNorm2d(c2): affine, with running statistics, so none of these is None
        assert bn.weight is not None and bn.bias is not None
        assert bn.running_mean is not None and bn.running_var is not None
        scale = bn.weight.detach().double() / torch.sqrt(bn.running_var.detach().double() + bn.eps)
        weight = weight * scale.view(-1, 1, 1, 1)
        bias = (bias - bn.running_mean.detach().double()) * scale + bn.bias.detach().double()
    return weight.numpy().astype(np.float32), bias.numpy().astype(np.float32)
