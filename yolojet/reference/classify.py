"""Classification pre- and post-processing in torch ops, following ultralytics' `ClassificationPredictor`.

Pre-processing. For numpy and PIL inputs, ultralytics 8.4 builds `classify_transforms(imgsz)`:
`T.Resize(imgsz, BILINEAR)` (shorter side to imgsz, longer side `int(imgsz * long / short)`),
`T.CenterCrop(imgsz)` (offsets by Python's round(), halves to even), `T.ToTensor()` and
`T.Normalize(mean=0, std=1)`, the identity. Resize and crop run on the host on a PIL image of the
BGR array (`pre_transform`); the uint8 crop is flipped to RGB and divided by 255 on the device
(`preprocess`). torchvision resizes PIL images with PIL itself, so the resize is Pillow's
`ImagingResample` (src/libImaging/Resample.c): a separable triangle filter whose support widens with
the downscale factor (antialiasing), weights normalised per output pixel and turned into 22-bit fixed
point, two passes each rounded to uint8: horizontal then vertical, or, from Pillow 13 on, vertical
first when the height shrinks by more than twice as many pixels as the width (Pillow#9549).

Once the weights are known that arithmetic is integer, so it is reproduced here in torch, bit for bit
(tests/pipeline/test_classify_matches_ultralytics.py holds it to PIL and to ultralytics' predict with `torch.equal`):
weights computed in float64 exactly as Pillow's C computes them (same operation order, a sequential
sum for the normaliser), each pass a gather-multiply-accumulate over the taps in int32, which cannot
overflow (at most 255 * 2^22 + 2^21 < 2^31, Pillow's own `int` accumulators). Torch rather than a call
into PIL so that a frame stays on its device (a CUDA frame is never copied to the host), and only the
pixels the centre crop keeps, and the source pixels they read, are computed. The GPU engine runs the same
plan (`classify_plan`) on its resample kernel (yolojet/engine/classify_input.py).

Colour handling matches ultralytics' loader: a grey image is replicated to three channels (cv2
GRAY2BGR), an alpha channel dropped (cv2 BGRA2BGR, PIL convert("RGB")). Resampling works per channel,
so it runs on the one grey channel, and BGR→RGB happens on the small crop.
"""

from __future__ import annotations

import functools
import importlib.metadata
import math
import operator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from yolojet.errors import ImageReadError, ImageSizeError
from yolojet.images import Frame

# Pillow's 8-bit resampling: 32 - 8 - 2 fraction bits (Resample.c, PRECISION_BITS).
PRECISION_BITS = 22


def _resized_size(height: int, width: int, imgsz: int | tuple[int, int]) -> tuple[int, int]:
    """torchvision's `_compute_resized_output_size`: an int sets the shorter side, a pair the exact (h, w)."""
    if not isinstance(imgsz, int):
        return int(imgsz[0]), int(imgsz[1])
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = imgsz, int(imgsz * long / short)
    new_w, new_h = (new_short, new_long) if width <= height else (new_long, new_short)
    return new_h, new_w


def _crop_offset(size: int, crop: int) -> int:
    """torchvision `center_crop`'s offset: Python's round(), which rounds halves to even."""
    return round((size - crop) / 2.0)


def _pil_bilinear_taps(in_size: int, out_size: int, first: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Pillow's BILINEAR taps for output indices first .. first + count - 1 of an in_size → out_size resize.

    Returns (count, ksize) source indices (unused taps repeat the first) and int32 22-bit weights
    (unused taps 0), computed as `precompute_coeffs` + `normalize_coeffs_8bpc` compute them.
    """
    scale = float(in_size) / out_size
    filterscale = max(scale, 1.0)
    support = 1.0 * filterscale  # the triangle filter's support is 1
    ksize = math.ceil(support) * 2 + 1
    xx = np.arange(first, first + count, dtype=np.float64)
    center = 0.0 + (xx + 0.5) * scale
    ss = 1.0 / filterscale
    xmin = np.maximum(np.trunc(center - support + 0.5), 0).astype(np.int64)
    xmax = np.minimum(np.trunc(center + support + 0.5), in_size).astype(np.int64) - xmin
    taps = np.arange(ksize, dtype=np.int64)
    used = taps[None, :] < xmax[:, None]
    x = np.abs(((taps[None, :] + xmin[:, None]) - center[:, None] + 0.5) * ss)
    k = np.where(used & (x < 1.0), 1.0 - x, 0.0)
    ww = np.zeros(count, dtype=np.float64)
    for j in range(ksize):  # Pillow sums the weights one after another; so must we, for the same last bit
        ww = ww + k[:, j]
    k = np.where(ww[:, None] != 0.0, k / np.where(ww == 0.0, 1.0, ww)[:, None], k)
    weights = np.trunc(0.5 + k * (1 << PRECISION_BITS)).astype(np.int32)  # bilinear weights are never negative
    index = np.where(used, taps[None, :] + xmin[:, None], xmin[:, None])
    return index, weights


def _resample_axis(pixels: torch.Tensor, axis: int, index: np.ndarray, weights: np.ndarray) -> torch.Tensor:
    """One Pillow pass along `axis` (0 rows, 1 columns) of uint8 (H, W, C) with the given taps, as uint8."""
    # The resampled axis first and everything else flattened: each tap then gathers whole contiguous rows.
    source = pixels.movedim(axis, 0).contiguous()
    rest = source.shape[1:]
    source = source.reshape(source.shape[0], -1)
    index_t = torch.from_numpy(index).to(source.device)
    weights_t = torch.from_numpy(weights).to(source.device)
    acc = torch.full(
        (index.shape[0], source.shape[1]), 1 << (PRECISION_BITS - 1), dtype=torch.int32, device=source.device
    )
    for j in range(index.shape[1]):
        acc += source.index_select(0, index_t[:, j]).to(torch.int32).mul_(weights_t[:, j : j + 1])
    out = (acc >> PRECISION_BITS).clamp_(0, 255).to(torch.uint8)
    return out.reshape(index.shape[0], *rest).movedim(0, axis)


@functools.lru_cache(maxsize=1)
def _pillow_may_resize_vertically_first() -> bool:
    """Pillow 13 runs the vertical pass first when the height shrinks by more than twice the width's shrink
    (python-pillow/Pillow#9549); earlier versions always run the horizontal pass first. The two orders round
    the intermediate image differently, so follow the Pillow that torchvision (and so ultralytics) resizes with."""
    try:
        return int(importlib.metadata.version("pillow").split(".")[0]) >= 13
    except (importlib.metadata.PackageNotFoundError, ValueError):  # pragma: no cover - Pillow comes with torchvision
        return True


@dataclass(frozen=True)
class ResamplePass:
    """One Pillow pass along `axis` (0 rows, 1 columns): output i = sum_t input[index[i, t]] * weights[i, t], in
    22-bit fixed point, rounded to uint8. Indices count from the start of the pass's input."""

    axis: int
    index: np.ndarray  # (outputs, taps) int64
    weights: np.ndarray  # (outputs, taps) int32


@dataclass(frozen=True)
class ResamplePlan:
    """How a (height, width) image becomes the centre crop of its Pillow resize: the source window that is read
    (top, left, rows, cols), then the passes in Pillow's order, each rounding to uint8. No pass: the window is the
    crop."""

    window: tuple[int, int, int, int]
    passes: tuple[ResamplePass, ...]
    crop: tuple[int, int]


def resample_plan(height: int, width: int, size: tuple[int, int], crop: tuple[int, int]) -> ResamplePlan:
    """The plan for `PIL.Image.resize(size[::-1], BILINEAR)` of a height x width image, then the window
    torchvision's `center_crop` keeps. Only the kept pixels, and the source pixels they read, are computed."""
    new_h, new_w = size
    crop_h, crop_w = crop
    if crop_h > new_h or crop_w > new_w:
        # Never the case for classify_transforms (the resize covers the crop); torchvision would pad with 0.
        raise ImageSizeError(f"centre crop {crop_h}x{crop_w} is larger than the resized image {new_h}x{new_w}")
    top, left = _crop_offset(new_h, crop_h), _crop_offset(new_w, crop_w)
    # A dimension whose size is unchanged gets no pass (Pillow skips it; an unchanged image torchvision returns
    # as is), so it is only cropped. For the others: taps for the kept outputs only, and the source narrowed to
    # the span those taps read. Each output pixel depends on its own taps alone, so this changes no value.
    window: list[tuple[int, int]] = []
    taps: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for axis, (n_in, n_out, first, count) in enumerate(((height, new_h, top, crop_h), (width, new_w, left, crop_w))):
        if n_out == n_in:
            window.append((first, count))
            continue
        index, weights = _pil_bilinear_taps(n_in, n_out, first, count)
        lo, hi = int(index.min()), int(index.max()) + 1
        window.append((lo, hi - lo))
        taps[axis] = (index - lo, weights)
    # Pillow's pass order; each pass rounds to uint8, so the order shows in the result.
    shrink_h, shrink_w = height - new_h, width - new_w
    vertical_first = _pillow_may_resize_vertically_first() and shrink_h > 0 and shrink_h > 2 * shrink_w
    order = (0, 1) if vertical_first else (1, 0)
    passes = tuple(ResamplePass(axis, *taps[axis]) for axis in order if axis in taps)
    (top_in, rows), (left_in, cols) = window
    return ResamplePlan((top_in, left_in, rows, cols), passes, (crop_h, crop_w))


def classify_plan(height: int, width: int, imgsz: int | tuple[int, int]) -> ResamplePlan:
    """The resample plan of ultralytics' classification pre-processing for a height x width image (see
    `classify_preprocess` for what `imgsz` means)."""
    crop = _check_imgsz(imgsz)
    if height < 1 or width < 1:
        raise ImageReadError("the image has zero size")
    return resample_plan(height, width, _resized_size(height, width, crop[0] if crop[0] == crop[1] else crop), crop)


def _check_imgsz(imgsz: object) -> tuple[int, int]:
    """An int s → (s, s); an (h, w) pair → (h, w); anything else, or a size below 1, is an ImageSizeError."""
    pair = isinstance(imgsz, (tuple, list))
    values: list[Any] = list(imgsz) if isinstance(imgsz, (tuple, list)) else [imgsz]
    try:
        if isinstance(imgsz, bool) or any(isinstance(v, bool) for v in values):
            raise TypeError
        sizes = [operator.index(v) for v in values]
    except TypeError:
        sizes = []
    if len(sizes) != (2 if pair else 1) or min(sizes) < 1:
        raise ImageSizeError(f"classification image size {imgsz!r}: expected a positive int or (height, width)")
    return sizes[0], sizes[-1]


def classify_preprocess(frame: Frame, imgsz: int | tuple[int, int]) -> torch.Tensor:
    """The model input ultralytics' ClassificationPredictor makes of this frame: (3, h, w) float32 RGB in [0, 1],
    on the frame's device, bit for bit.

    `imgsz` is an int or a square (s, s) (shorter side resized to s, then the centre s x s crop, as predict does
    with a square imgsz), or a non-square (h, w) (resized to exactly h x w, as predict does then).
    """
    if not isinstance(frame, Frame):
        raise TypeError(f"classify_preprocess takes a yolojet.images.Frame, got {type(frame).__name__}")
    pixels = frame.pixels
    if pixels.ndim != 3 or pixels.shape[2] not in (1, 3, 4) or pixels.dtype != torch.uint8:
        raise ImageReadError(f"frame of {tuple(pixels.shape)} {pixels.dtype}: expected uint8 (H, W, C), C in 1, 3, 4")
    plan = classify_plan(int(pixels.shape[0]), int(pixels.shape[1]), imgsz)
    pixels = pixels[..., :3]  # alpha dropped, as ultralytics' loader does (cv2 BGRA2BGR, PIL convert("RGB"))
    top, left, rows, cols = plan.window
    pixels = pixels[top : top + rows, left : left + cols]
    for step in plan.passes:  # per channel, so BGR→RGB can wait for the small crop
        pixels = _resample_axis(pixels, step.axis, step.index, step.weights)
    x = pixels.permute(2, 0, 1).float().div_(255)  # ToTensor's / 255; Normalize(mean=0, std=1) changes nothing
    if x.shape[0] == 1:
        return x.expand(3, -1, -1).contiguous()  # grey replicated, as cv2 GRAY2BGR
    return (x.flip(0) if frame.bgr else x).contiguous()


def top5(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Probabilities (..., nc) → (top1 (...,), top5 indices (..., k), their probabilities (..., k)), k = min(5, nc).

    Highest first, as ultralytics' `Probs.top5`; equal probabilities rank by class id (a stable sort), so
    top5[..., 0] is always top1 (the first maximum, as `argmax` gives).
    """
    if not isinstance(probs, torch.Tensor):
        raise TypeError(f"top5 takes a torch.Tensor of probabilities, got {type(probs).__name__}")
    if probs.ndim == 0 or probs.shape[-1] == 0:
        raise ValueError(f"probabilities of shape {tuple(probs.shape)}: expected (..., nc) with nc >= 1")
    k = min(5, probs.shape[-1])
    order = torch.sort(probs, dim=-1, descending=True, stable=True).indices[..., :k]
    return order[..., 0], order, probs.gather(-1, order)
