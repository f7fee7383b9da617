"""Keypoints of one image, with ultralytics' attribute names (`keypoints.xy`, `keypoints.conf`, `keypoints.xyn`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from yolojet.tasks.arrays import HostData, host


@dataclass
class Keypoints(HostData):
    """n instances' keypoints as (n, k, 2) [x, y] or (n, k, 3) [x, y, visibility] in original-image pixels.

    Keypoints lie inside the image: ones predicted outside are clipped to its border, as ultralytics does.
    """

    data: np.ndarray
    orig_shape: tuple[int, int]

    def __post_init__(self) -> None:
        if self.data.ndim != 3 or self.data.shape[2] not in (2, 3):
            raise ValueError(f"Keypoints data: expected (n, keypoints, 2 or 3), got {self.data.shape}")
        self.data = host(self.data)

    def __len__(self) -> int:
        return len(self.data)

    @property
    def has_visible(self) -> bool:
        return self.data.shape[2] == 3

    @property
    def xy(self) -> np.ndarray:
        """(n, k, 2) keypoint coordinates."""
        return self.data[..., :2]

    @property
    def xyn(self) -> np.ndarray:
        """Coordinates divided by the original image's width and height."""
        h, w = self.orig_shape
        return self.xy / np.array([w, h], dtype=self.data.dtype)

    @property
    def conf(self) -> np.ndarray | None:
        """(n, k) visibility scores, or None for a model whose keypoints are x, y only."""
        return self.data[..., 2] if self.has_visible else None
