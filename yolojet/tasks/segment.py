"""Instance masks of one image, with ultralytics' attribute names (`masks.data`, `masks.xy`, `masks.xyn`), and COCO RLE.

Numpy, and OpenCV's `findContours(mask, RETR_EXTERNAL, CHAIN_APPROX_SIMPLE)` for the polygons, as ultralytics finds
them (imported when a polygon is asked for); the RLE strings are pycocotools' compressed format, written here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from yolojet.tasks.arrays import HostData, host


def external_contours(mask: np.ndarray) -> list[np.ndarray]:
    """Outer contours of a 2-d mask as (n, 2) int32 (x, y) pixel arrays: OpenCV's findContours(mask, RETR_EXTERNAL,
    CHAIN_APPROX_SIMPLE), what ultralytics' masks2segments calls, run on the mask's bounding box only (OpenCV frames
    an image with zeros, so the crop's contours, shifted back, are the whole mask's, in the same order; a 810x1080
    mask holding a 200x300 box took 3.2 ms whole, 2.2 ms through a port of the follower in Python, 0.3 ms cropped)."""
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise ValueError(f"external_contours: expected a 2-d mask, got shape {mask.shape}")
    rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
    if len(rows) == 0:
        return []
    top, left = int(rows[0]), int(cols[0])
    return _contours((mask[top : int(rows[-1]) + 1, left : int(cols[-1]) + 1] != 0).view(np.uint8), left, top)


def _contours(crop: np.ndarray, left: int, top: int) -> list[np.ndarray]:
    """The outer contours of a 0/1 uint8 crop of a mask whose corner is (left, top), in the mask's pixels."""
    import cv2  # here, not at import: results are made and read without it

    contours, _ = cv2.findContours(crop, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE, offset=(left, top))
    return [c.reshape(-1, 2) for c in contours]


def _closest_points(a: np.ndarray, b: np.ndarray) -> tuple[int, int]:
    """Indices of the closest pair of points between (n, 2) `a` and (m, 2) `b` (the first such pair, row-major)."""
    distance = ((a[:, None, :].astype(np.int64) - b[None, :, :]) ** 2).sum(-1)
    i, j = np.unravel_index(int(np.argmin(distance)), distance.shape)
    return int(i), int(j)


def merged_contour(mask: np.ndarray) -> np.ndarray:
    """(n, 2) float32 (x, y) points of one polygon through every outer contour of the mask, as ultralytics'
    masks2segments(strategy="all") builds it; (0, 2) for an empty mask."""
    return merge_contours(external_contours(mask))


def merge_contours(contours: list[np.ndarray]) -> np.ndarray:
    """`external_contours`' contours of a mask as one polygon (`merged_contour`).

    Each contour is joined to the next at their closest pair of points. The polygon walks from the first contour
    out through the joins to the last (each contour started at its join and closed), then back through the middle
    contours' remaining points, so the joins are thin lines walked both ways.
    """
    if not contours:
        return np.zeros((0, 2), np.float32)
    if len(contours) == 1:
        return contours[0].astype(np.float32)
    joins: list[list[int]] = [[] for _ in contours]  # a contour's join points: to the one before, to the one after
    for k in range(1, len(contours)):
        i, j = _closest_points(contours[k - 1], contours[k])
        joins[k - 1].append(i)
        joins[k].append(j)
    last = len(contours) - 1
    walked, outward = [], []
    for k, (contour, at) in enumerate(zip(contours, joins, strict=True)):
        if len(at) == 2 and at[0] > at[1]:  # walk a middle contour the way that meets its second join first
            at = [len(contour) - 1 - a for a in at]
            contour = contour[::-1]
        closed = np.roll(contour, -at[0], axis=0)
        closed = np.concatenate([closed, closed[:1]])
        walked.append(closed)
        outward.append(closed if k in (0, last) else closed[: at[1] - at[0] + 1])
    back = [walked[k][abs(joins[k][1] - joins[k][0]) :] for k in range(last - 1, 0, -1)]
    return np.concatenate(outward + back).astype(np.float32)


def _rle_string(counts: np.ndarray) -> str:
    """pycocotools' rleToString: each count (after the first two, as the difference with the one two before) in
    5-bit groups, low first, 0x20 marking a continuation, offset by 48 into printable ASCII."""
    out = []
    values = counts.astype(np.int64).tolist()
    for i, x in enumerate(values):
        if i > 2:
            x -= values[i - 2]
        while True:
            c = x & 0x1F
            x >>= 5
            more = x != -1 if c & 0x10 else x != 0
            if more:
                c |= 0x20
            out.append(chr(c + 48))
            if not more:
                break
    return "".join(out)


def encode_rle(mask: np.ndarray) -> dict:
    """A 2-d mask as a COCO RLE dict {"size": [h, w], "counts": str}: run lengths in column-major order, starting
    with a (possibly empty) run of zeros, in pycocotools' compressed string form."""
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise ValueError(f"encode_rle: expected a 2-d mask, got shape {mask.shape}")
    h, w = mask.shape
    flat = (mask.T.reshape(-1) != 0).astype(np.int8)
    edges = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate([[0], edges, [flat.size]])
    counts = np.diff(bounds)
    if flat.size and flat[0]:
        counts = np.concatenate([[0], counts])
    return {"size": [int(h), int(w)], "counts": _rle_string(counts)}


def _rle_counts(text: str) -> np.ndarray:
    """pycocotools' rleFrString, the inverse of `_rle_string`, in array operations (a character at a time in Python
    took 0.6 ms for a mask of 800 runs): each value's 5-bit groups summed at their shifts, sign-extended where its
    last group says so, then each count after the second is its difference with the one two before, so each of the
    two interleaved series is a running sum."""
    codes = np.frombuffer(text.encode("ascii"), np.uint8).astype(np.int64) - 48
    if codes.size == 0:
        return codes
    if codes.min() < 0 or codes.max() > 0x3F or codes[-1] & 0x20:
        raise ValueError("RLE counts: not pycocotools' compressed string")
    ends = np.flatnonzero((codes & 0x20) == 0)  # each value's last group
    starts = np.concatenate([[0], ends[:-1] + 1])
    groups = ends - starts + 1
    shift = 5 * (np.arange(codes.size) - np.repeat(starts, groups))
    values = np.add.reduceat((codes & 0x1F) << shift, starts)
    negative = (codes[ends] & 0x10) != 0
    values[negative] |= np.left_shift(-1, 5 * groups[negative])
    counts = values.copy()
    counts[1::2] = np.cumsum(values[1::2])
    counts[2::2] = np.cumsum(values[2::2])
    return counts


def rle_counts(rle: dict) -> np.ndarray:
    """The run lengths of a COCO RLE dict {"size": [h, w], "counts": str or bytes} (compressed, as `encode_rle` and
    pycocotools write it): zeros first, column-major; a ValueError where they do not cover the image."""
    h, w = (int(v) for v in rle["size"])
    text = rle["counts"].decode() if isinstance(rle["counts"], bytes) else rle["counts"]
    counts = _rle_counts(text)
    if int(counts.sum()) != h * w or (counts < 0).any():
        raise ValueError(f"RLE counts cover {int(counts.sum())} pixels, not {h}x{w}")
    return counts


def decode_rle(rle: dict) -> np.ndarray:
    """A COCO RLE dict as an (h, w) bool mask."""
    h, w = (int(v) for v in rle["size"])
    counts = rle_counts(rle)
    values = np.zeros(len(counts), dtype=bool)
    values[1::2] = True
    flat = np.repeat(values, counts)
    return flat.reshape(w, h).T


def rle_area(rle: dict) -> int:
    """The pixels a COCO RLE mask covers (pycocotools' `area`), from its runs alone."""
    return int(rle_counts(rle)[1::2].sum())


def rle_contours(rle: dict) -> list[np.ndarray]:
    """`external_contours` of a COCO RLE mask, decoding only the columns its pixels lie in (a 200x300 box in a
    810x1080 mask: a fifth of the pixels the whole mask has, and no strided pass over them)."""
    h, _ = (int(v) for v in rle["size"])
    counts = rle_counts(rle)
    ends = np.cumsum(counts)
    starts = ends - counts
    set_runs = np.flatnonzero(counts[1::2]) * 2 + 1
    if len(set_runs) == 0:
        return []
    left, right = int(starts[set_runs[0]]) // h, (int(ends[set_runs[-1]]) - 1) // h
    begin, length = left * h, (right - left + 1) * h
    values = np.zeros(len(counts), np.uint8)
    values[1::2] = 1
    runs = np.clip(ends - begin, 0, length) - np.clip(starts - begin, 0, length)  # each run within the columns
    columns = np.repeat(values, runs).reshape(right - left + 1, h)  # (column, row)
    rows = np.flatnonzero(columns.any(0))
    top, bottom = int(rows[0]), int(rows[-1])
    return _contours(np.ascontiguousarray(columns[:, top : bottom + 1].T), left, top)


@dataclass
class Masks(HostData):
    """k instance masks as a (k, h, w) bool array over the original image."""

    data: np.ndarray

    def __post_init__(self) -> None:
        data = np.asarray(self.data)
        if data.ndim == 2:
            data = data[None]
        if data.ndim != 3:
            raise ValueError(f"Masks data: expected (k, h, w), got shape {data.shape}")
        self.data = host(data.astype(bool, copy=False))

    def __len__(self) -> int:
        return len(self.data)

    @property
    def orig_shape(self) -> tuple[int, int]:
        return (int(self.data.shape[1]), int(self.data.shape[2]))

    @cached_property
    def xy(self) -> list[np.ndarray]:
        """Per mask, the (n, 2) float32 (x, y) pixel points of one polygon through all its outer contours, as
        ultralytics' masks2segments builds it by default (strategy "all"); (0, 2) for an empty mask."""
        return [merged_contour(m) for m in self.data]

    @property
    def xyn(self) -> list[np.ndarray]:
        """`xy` divided by the image's width and height."""
        h, w = self.orig_shape
        return [p / np.array([w, h], np.float32) for p in self.xy]

    def to_rle(self) -> list[dict]:
        """One COCO RLE dict {"size": [h, w], "counts": str} per mask, as pycocotools.mask.encode writes it
        (decodable with pycocotools.mask.decode)."""
        return [encode_rle(m) for m in self.data]
