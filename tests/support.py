"""Helpers for tests that compare yolojet with ultralytics: random-weight models and tie-aware comparisons."""

from __future__ import annotations

import functools

import torch
from torch import nn

# (architecture, imgsz, head mode, per-output errors) of every passing export comparison in this session.
VERIFIED: list[tuple[str, tuple[int, int], str, tuple[float, ...]]] = []


def randomize_batchnorm(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give every BatchNorm random running statistics and affine parameters, so folding is really exercised."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.2)
                m.running_var.copy_(torch.rand(n, generator=g) * 1.5 + 0.5)
                m.weight.copy_(torch.rand(n, generator=g) + 0.5)
                m.bias.copy_(torch.randn(n, generator=g) * 0.2)
    return model


@functools.lru_cache(maxsize=4)
def random_model(cfg: str, seed: int = 0) -> nn.Module:
    """An ultralytics model built from an architecture YAML, random weights and BatchNorm statistics, eval mode."""
    from ultralytics import YOLO

    torch.manual_seed(seed)
    return randomize_batchnorm(YOLO(cfg, verbose=False).model, seed).float().eval()


def relative_max_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """max |ours − ref| / max |ref|, the export tolerance measure; NaN anywhere is infinitely wrong."""
    if ours.shape != ref.shape:
        raise AssertionError(f"shape {tuple(ours.shape)} != reference {tuple(ref.shape)}")
    if torch.isnan(ours).any() or torch.isnan(ref).any():
        return float("inf")
    return float((ours - ref).abs().max() / ref.abs().max().clamp_min(1e-12))


def topk_relative_error(ours: torch.Tensor, ref: torch.Tensor, score_tol: float = 1e-6) -> float:
    """Relative error between two one-to-one outputs (N, K, 6+extra), sorted by score, up to tie order.

    Rows whose scores lie within `score_tol` of each other may come out in either order (both
    implementations are right); each of our rows is compared with the closest reference row of
    the same tie group. A row of the last group may be missing from the reference when the
    selection was cut inside a tie.
    """
    if ours.shape != ref.shape:
        raise AssertionError(f"shape {tuple(ours.shape)} != reference {tuple(ref.shape)}")
    scale = float(ref.abs().max().clamp_min(1e-12))
    worst = float((ours[..., 4] - ref[..., 4]).abs().max()) / scale
    for b in range(ours.shape[0]):
        scores = ref[b, :, 4]
        cut = float(scores[-1])
        for row in ours[b]:
            group = ref[b][(scores - row[4]).abs() <= score_tol]
            if len(group) == 0:
                if abs(float(row[4]) - cut) <= score_tol:
                    continue
                return float("inf")
            worst = max(worst, float((group - row).abs().amax(1).min()) / scale)
    return worst


def compare_outputs(ours, ref, end2end: bool) -> list[float]:
    """Per-output relative errors between our head outputs and ultralytics' first eval output."""
    ours = ours if isinstance(ours, tuple) else (ours,)
    ref = tuple(ref) if isinstance(ref, (tuple, list)) else (ref,)
    if len(ours) != len(ref):
        raise AssertionError(f"{len(ours)} outputs, reference has {len(ref)}")
    errors = []
    for i, (o, r) in enumerate(zip(ours, ref, strict=True)):
        one_to_one = end2end and i == 0
        errors.append(topk_relative_error(o, r) if one_to_one else relative_max_error(o, r))
    return errors
