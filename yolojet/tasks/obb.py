"""Oriented boxes of one image, with ultralytics' attribute names (`obb.xywhr`, `obb.xyxyxyxy`, `obb.conf`, ...)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from yolojet.tasks.arrays import HostData, host


def xywhr_to_corners(xywhr: np.ndarray) -> np.ndarray:
    """(..., 5) boxes [cx, cy, w, h, angle] → (..., 4, 2) corners, as ultralytics' ops.xywhr2xyxyxyxy.

    The corners start at (+w/2, +h/2) in the box frame and wind through (+w/2, −h/2), (−w/2, −h/2), (−w/2, +h/2).
    """
    centre = xywhr[..., :2]
    w, h, angle = (xywhr[..., i : i + 1] for i in range(2, 5))
    cos, sin = np.cos(angle), np.sin(angle)
    along = np.concatenate([w / 2 * cos, w / 2 * sin], -1)
    across = np.concatenate([-h / 2 * sin, h / 2 * cos], -1)
    return np.stack(
        [centre + along + across, centre + along - across, centre - along - across, centre - along + across], -2
    )


@dataclass
class OBB(HostData):
    """n oriented boxes as rows [cx, cy, w, h, angle, conf, cls] in original-image pixels, the angle in radians.

    The angle is the head's prediction as is (not regularized), so `w` may be the short side; use `xyxyxyxy`
    when only the geometry matters.
    """

    data: np.ndarray
    orig_shape: tuple[int, int]

    def __post_init__(self) -> None:
        if self.data.ndim != 2 or self.data.shape[1] != 7:
            raise ValueError(f"OBB data: expected (n, 7) rows [cx, cy, w, h, angle, conf, cls], got {self.data.shape}")
        self.data = host(self.data)

    def __len__(self) -> int:
        return len(self.data)

    @property
    def xywhr(self) -> np.ndarray:
        return self.data[:, :5]

    @property
    def conf(self) -> np.ndarray:
        return self.data[:, 5]

    @property
    def cls(self) -> np.ndarray:
        return self.data[:, 6]

    @property
    def xyxyxyxy(self) -> np.ndarray:
        """(n, 4, 2) corner points."""
        return host(xywhr_to_corners(self.xywhr))

    @property
    def xyxyxyxyn(self) -> np.ndarray:
        """Corner points divided by the original image's width and height."""
        h, w = self.orig_shape
        return self.xyxyxyxy / np.array([w, h], dtype=self.data.dtype)

    @property
    def xyxy(self) -> np.ndarray:
        """(n, 4) axis-aligned bounds [x1, y1, x2, y2] of the corners (not clipped to the image)."""
        corners = self.xyxyxyxy
        return host(np.concatenate([corners.min(1), corners.max(1)], 1))
