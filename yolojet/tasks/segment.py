"""Instance masks of one image, with ultralytics' attribute names (`masks.data`, `masks.xy`, `masks.xyn`), and COCO RLE.

Plain numpy, no OpenCV: the polygons come from a border follower written here that reproduces OpenCV's
`findContours(mask, RETR_EXTERNAL, CHAIN_APPROX_SIMPLE)` (Suzuki & Abe's algorithm as OpenCV implements it), and
the RLE strings are pycocotools' compressed format, written here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from yolojet.tasks.arrays import HostData, host

# OpenCV's chain codes: direction s moves by (dx, dy); 0 is right and they turn counterclockwise on screen.
_DX = (1, 1, 0, -1, -1, -1, 0, 1)
_DY = (0, -1, -1, -1, 0, 1, 1, 1)
_OUTER_MARK = 2  # border pixel whose right neighbour is set (OpenCV's nbd)
_RIGHT_MARK = -126  # border pixel whose right neighbour is empty (nbd | -128 as a signed char)


def _follow_border(img: np.ndarray, y0: int, x0: int) -> list[tuple[int, int]]:
    """Trace the outer border starting at (y0, x0) of a zero-framed int8 image, marking it as OpenCV does; the
    CHAIN_APPROX_SIMPLE points (x, y) in img's coordinates."""
    s = 4  # the pixel on the left is empty: search clockwise from it for the first set neighbour
    while True:
        s = (s - 1) & 7
        if s == 4 or img[y0 + _DY[s], x0 + _DX[s]] != 0:
            break
    if s == 4:  # back at the empty left neighbour: no set neighbour, a single pixel
        img[y0, x0] = _RIGHT_MARK
        return [(x0, y0)]
    y1, x1 = y0 + _DY[s], x0 + _DX[s]
    points = []
    prev_s = s ^ 4
    y3, x3 = y0, x0
    while True:
        s_end = s
        while True:  # counterclockwise from the pixel we came from, up to a full turn
            s += 1
            y4, x4 = y3 + _DY[s & 7], x3 + _DX[s & 7]
            if img[y4, x4] != 0 or s >= 15:
                break
        s &= 7
        if 0 <= s - 1 < s_end:  # the search passed the (empty) right neighbour
            img[y3, x3] = _RIGHT_MARK
        elif img[y3, x3] == 1:
            img[y3, x3] = _OUTER_MARK
        if s != prev_s:
            points.append((x3, y3))
            prev_s = s
        if y4 == y0 and x4 == x0 and y3 == y1 and x3 == x1:
            return points
        y3, x3 = y4, x4
        s = (s + 4) & 7


def external_contours(mask: np.ndarray) -> list[np.ndarray]:
    """Outer contours of a 2-d mask as (n, 2) int32 (x, y) pixel arrays, in the order and with the points of
    OpenCV's findContours(mask, RETR_EXTERNAL, CHAIN_APPROX_SIMPLE): components inside another's hole are left out."""
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise ValueError(f"external_contours: expected a 2-d mask, got shape {mask.shape}")
    rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
    if len(rows) == 0:
        return []
    top, left = int(rows[0]), int(cols[0])
    crop = mask[top : int(rows[-1]) + 1, left : int(cols[-1]) + 1] != 0
    img = np.zeros((crop.shape[0] + 2, crop.shape[1] + 2), np.int8)  # a zero frame, as OpenCV adds
    img[1:-1, 1:-1] = crop
    found = []
    for y in range(1, img.shape[0] - 1):
        row = img[y]
        inside = False  # sign of the last marked border pixel on this row: inside a traced component?
        x = 1
        while True:
            # the pixels from x on where the value changes: only there can a border start or a mark be read
            changes = np.flatnonzero(row[x:] != row[x - 1 : -1]) + x
            traced = False
            for c in changes.tolist():
                p = int(row[c])
                if p == 1 and row[c - 1] == 0 and not inside:
                    found.append(_follow_border(img, y, c))
                    inside = row[c] > 0
                    x = c + 1
                    traced = True
                    break  # the trace marked pixels of this row: look at it again
                if p not in (0, 1):
                    inside = p > 0
            if not traced:
                break
    offset = np.array([left - 1, top - 1], np.int32)
    return [np.asarray(points, np.int32) + offset for points in reversed(found)]


def _closest_points(a: np.ndarray, b: np.ndarray) -> tuple[int, int]:
    """Indices of the closest pair of points between (n, 2) `a` and (m, 2) `b` (the first such pair, row-major)."""
    distance = ((a[:, None, :].astype(np.int64) - b[None, :, :]) ** 2).sum(-1)
    i, j = np.unravel_index(int(np.argmin(distance)), distance.shape)
    return int(i), int(j)


def merged_contour(mask: np.ndarray) -> np.ndarray:
    """(n, 2) float32 (x, y) points of one polygon through every outer contour of the mask, as ultralytics'
    masks2segments(strategy="all") builds it; (0, 2) for an empty mask.

    Each contour is joined to the next at their closest pair of points. The polygon walks from the first contour
    out through the joins to the last (each contour started at its join and closed), then back through the middle
    contours' remaining points, so the joins are thin lines walked both ways.
    """
    contours = external_contours(mask)
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


def _rle_counts(text: str) -> list[int]:
    """pycocotools' rleFrString: the inverse of `_rle_string`."""
    counts: list[int] = []
    i = 0
    while i < len(text):
        x, k, more = 0, 0, True
        while more:
            c = ord(text[i]) - 48
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            i += 1
            k += 1
            if not more and c & 0x10:
                x |= -1 << (5 * k)
        if len(counts) > 2:
            x += counts[-2]
        counts.append(x)
    return counts


def decode_rle(rle: dict) -> np.ndarray:
    """A COCO RLE dict {"size": [h, w], "counts": str or bytes} (compressed, as `encode_rle` and pycocotools write
    it) as an (h, w) bool mask."""
    h, w = (int(v) for v in rle["size"])
    text = rle["counts"].decode() if isinstance(rle["counts"], bytes) else rle["counts"]
    counts = _rle_counts(text)
    if sum(counts) != h * w or any(c < 0 for c in counts):
        raise ValueError(f"RLE counts cover {sum(counts)} pixels, not {h}x{w}")
    values = np.zeros(len(counts), dtype=bool)
    values[1::2] = True
    flat = np.repeat(values, counts)
    return flat.reshape(w, h).T


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
