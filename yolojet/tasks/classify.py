"""Class probabilities of one image, with ultralytics' attribute names (`probs.top1`, `probs.top5`, ...)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from yolojet.tasks.arrays import host


@dataclass
class Probs:
    """Softmax probabilities over the model's nc classes, as ultralytics' `Results.probs`.

    `top5` lists the (up to) five most probable class ids, highest first; equal probabilities rank by class
    id, so `top5[0] == top1` always. Confidences are plain floats / float32 numpy, not tensors.
    """

    data: np.ndarray  # (nc,) float32

    def __post_init__(self) -> None:
        data = np.asarray(self.data)
        if data.ndim != 1 or data.shape[0] == 0:
            raise ValueError(f"class probabilities of shape {data.shape}: expected (nc,) with nc >= 1")
        if not np.issubdtype(data.dtype, np.number) or np.issubdtype(data.dtype, np.complexfloating):
            raise ValueError(f"class probabilities of dtype {data.dtype}: expected real numbers")
        self.data = host(data.astype(np.float32, copy=False))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    def __len__(self) -> int:
        return int(self.data.shape[0])

    def cpu(self) -> Probs:
        return self

    def numpy(self) -> Probs:
        return self

    @property
    def top1(self) -> int:
        return int(self.data.argmax())

    @property
    def top5(self) -> list[int]:
        return np.argsort(-self.data, kind="stable")[:5].tolist()

    @property
    def top1conf(self) -> float:
        return float(self.data[self.top1])

    @property
    def top5conf(self) -> np.ndarray:
        return self.data[self.top5]
