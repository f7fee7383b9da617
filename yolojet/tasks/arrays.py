"""Arrays and result parts that answer the torch calls ultralytics-style code makes on results.

ultralytics' results hold torch tensors, so code written for them says `r.boxes.xyxy.cpu().numpy()`,
`r.boxes.cls.tolist()`, `r.boxes.cpu()` or `for box in r.boxes: box.xyxy[0]`. yolojet's results are already numpy
arrays in host memory; these make those calls work unchanged: `.cpu()` is the array itself, `.numpy()` the plain
numpy array, `.cuda()` a torch tensor on the GPU, and `.tolist()`, `.item()` and indexing are numpy's own.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeVar

import numpy as np


class HostArray(np.ndarray):
    """A numpy array (results are in host memory) with torch's `.cpu()` and `.numpy()`."""

    def cpu(self) -> HostArray:
        return self

    def numpy(self) -> np.ndarray:
        return self.view(np.ndarray)

    def cuda(self, device: Any = None) -> Any:
        """The values as a torch tensor on a CUDA device (torch's `.cuda()`), for code that goes on in torch.

        torch is imported here, when asked, so that results and everything reading them stay torch-free."""
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("`.cuda()` needs a CUDA GPU; results are in host memory: use the array as it is")
        return torch.from_numpy(np.ascontiguousarray(self.view(np.ndarray))).cuda(device)


def host(values: Any) -> HostArray:
    """`values` as a HostArray, without a copy where it is an array already."""
    return np.asarray(values).view(HostArray)


Part = TypeVar("Part", bound="HostData")


class HostData:
    """A result part holding its rows in `data` (boxes, keypoints, masks, oriented boxes), as ultralytics' BaseTensor:
    `.cpu()` / `.numpy()` give the part itself, `.shape` its rows' shape, and `part[i]` the part of row i (a one-row
    part, so iterating gives one-instance parts whose `.xyxy[0]` is that instance's box)."""

    data: np.ndarray

    def cpu(self: Part) -> Part:
        return self

    def numpy(self: Part) -> Part:
        return self

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    def __getitem__(self: Part, index: Any) -> Part:
        rows = self.data[index]
        if rows.ndim < self.data.ndim:
            rows = rows[None]
        return replace(self, data=rows)  # type: ignore[type-var]

    def __iter__(self: Part) -> Any:
        return (self[i] for i in range(len(self.data)))
