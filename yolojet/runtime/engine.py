"""The public engine: images in, detections out, on our kernels where there is a GPU.

`Engine.load` resolves the model, then builds the network on our Triton kernels (a CUDA device, or
the CPU under TRITON_INTERPRET=1) or, on a machine without a GPU, on the float32 reference
executor with a one-line notice. `engine(images)` runs the whole predict path — letterbox, network,
decode, NMS (or the YOLO26 one-to-one selection), boxes back to original pixels — and returns one
`Results` per image; an image that cannot be read gets a `Results` carrying its error, and the
others are still detected. `engine.raw(x)` returns the raw head outputs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from yolojet.errors import EngineConfigError, YolojetError
from yolojet.images import Frame, load_frame
from yolojet.ir import Graph, ModelMeta
from yolojet.runtime import torch_pipeline
from yolojet.runtime.models import resolve_graph
from yolojet.runtime.network import TritonNetwork
from yolojet.runtime.reference import ReferenceExecutor
from yolojet.tasks import Boxes, Results

DETECTION_TASKS = ("detect",)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


class Engine:
    """A model ready to run. Build with `Engine.load`."""

    def __init__(self, network: TritonNetwork | ReferenceExecutor, max_batch: int) -> None:
        self.network = network
        self.max_batch = max_batch
        self.device = network.device
        self._head = None
        if isinstance(network, TritonNetwork) and self.meta.task in DETECTION_TASKS:
            from yolojet.runtime.gpu_head import DetectionHead

            self._head = DetectionHead(network)

    @classmethod
    def load(
        cls,
        model: str | Path,
        device: str | torch.device | None = None,
        half: bool = True,
        max_batch: int = 1,
        imgsz: int | tuple[int, int] | None = None,
        backend: str | None = None,
        tune: bool | None = None,
        fuse: bool = True,
        verbose: bool = False,
        buckets: list[int] | None = None,
    ) -> Engine:
        """Load a model directory, `.pt`, ultralytics name or `.yaml` (exported on first use and cached).

        backend "triton" runs our kernels (a CUDA device, or the CPU when TRITON_INTERPRET=1); "reference"
        the float32 torch executor. The default is "triton" where it can run, else "reference" with a notice.
        `tune=None` tunes conv tiles unless YOLOJET_NOTUNE=1. `buckets` overrides the batch sizes a CUDA
        graph is captured for (default 1, 2, 4, ..., max_batch).
        """
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if max_batch < 1:
            raise EngineConfigError(f"max_batch {max_batch}: must be at least 1")
        triton_possible = device.type == "cuda" or (device.type == "cpu" and _interpreting())
        if backend is None:
            backend = "triton" if triton_possible else "reference"
            if backend == "reference":
                print(
                    "yolojet: no CUDA GPU here; running the float32 reference executor on the CPU (slow)",
                    file=sys.stderr,
                )
        if backend not in ("triton", "reference"):
            raise EngineConfigError(f"backend {backend!r}: expected 'triton' or 'reference'")
        if backend == "triton" and not triton_possible:
            raise EngineConfigError(
                f"the triton backend runs on a CUDA device, not {device}; on the CPU set TRITON_INTERPRET=1 "
                "(slow, for tests) or use backend='reference'"
            )
        graph = resolve_graph(model, imgsz)
        if backend == "reference":
            return cls(ReferenceExecutor(graph, device), max_batch)
        if tune is None:
            tune = os.environ.get("YOLOJET_NOTUNE") != "1"
        network = TritonNetwork(
            graph, device, half=half, max_batch=max_batch, tune_layers=tune, fuse=fuse, verbose=verbose,
            buckets=buckets,
        )  # fmt: skip
        return cls(network, max_batch)

    # -- what the model is --------------------------------------------------------------------

    @property
    def graph(self) -> Graph:
        return self.network.graph

    @property
    def meta(self) -> ModelMeta:
        return self.network.graph.meta

    @property
    def names(self) -> dict[int, str]:
        return self.meta.names

    @property
    def backend(self) -> str:
        return "triton" if isinstance(self.network, TritonNetwork) else "reference"

    # -- raw network --------------------------------------------------------------------------

    def raw(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Raw head outputs for a float NCHW batch in [0, 1], in the reference executor's form."""
        if isinstance(self.network, TritonNetwork):
            return self.network.raw(x)
        return self.network(x.to(self.device))

    def dump(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.network.dump(x)

    # -- images in, results out ---------------------------------------------------------------

    def __call__(
        self,
        images: Any,
        conf: float = 0.25,
        iou: float = 0.7,
        max_det: int = 300,
        classes: Sequence[int] | None = None,
        agnostic: bool = False,
    ) -> list[Results]:
        """Detect objects in one image or a list of them (paths, bytes, numpy BGR, PIL, torch tensors)."""
        if self.meta.task not in DETECTION_TASKS:
            raise EngineConfigError(f"{self.meta.task} models are not served by engine(images) yet; use raw()")
        self._check_options(conf, iou, max_det, classes)
        sources = list(images) if isinstance(images, (list, tuple)) else [images]
        results: list[Results | None] = [None] * len(sources)
        frames: list[tuple[int, Frame]] = []
        decode_on = self.device if self.device.type == "cuda" else None
        for i, source in enumerate(sources):
            try:
                frames.append((i, load_frame(source, decode_on)))
            except YolojetError as e:
                results[i] = Results(Boxes(np.zeros((0, 6), np.float32), (0, 0)), self.names, error=str(e))
        options = {"conf": conf, "iou": iou, "max_det": max_det, "classes": classes, "agnostic": agnostic}
        for start in range(0, len(frames), self.max_batch):
            chunk = frames[start : start + self.max_batch]
            rows = self._detect([f for _, f in chunk], **options)
            for (i, frame), found in zip(chunk, rows, strict=True):
                image = torch_pipeline.rgb_pixels(frame).cpu().numpy()
                boxes = Boxes(found[:, :6].cpu().numpy().astype(np.float32), frame.shape)
                results[i] = Results(boxes, self.names, path=frame.path, orig_img=image)
        return results  # type: ignore[return-value]

    def _check_options(self, conf: float, iou: float, max_det: int, classes: Sequence[int] | None) -> None:
        if not 0 <= conf <= 1 or not 0 <= iou <= 1:
            raise EngineConfigError(f"conf {conf} and iou {iou} must lie in [0, 1]")
        if max_det < 1:
            raise EngineConfigError(f"max_det {max_det}: must be at least 1")
        if self._head is not None and max_det > self._head.capacity:
            raise EngineConfigError(f"max_det {max_det}: this engine keeps at most {self._head.capacity} boxes")
        if classes is not None and any(not 0 <= int(c) < self.meta.nc for c in classes):
            raise EngineConfigError(f"classes {list(classes)}: class ids run from 0 to {self.meta.nc - 1}")

    def _detect(self, frames: list[Frame], **options: Any) -> list[torch.Tensor]:
        if self._head is not None:
            return self._head.detect(frames, **options)
        return self._detect_reference(frames, **options)

    def _detect_reference(
        self, frames: list[Frame], conf: float, iou: float, max_det: int, classes: Iterable[int] | None, agnostic: bool
    ) -> list[torch.Tensor]:
        boxes, inputs = [], []
        for frame in frames:
            x, box = torch_pipeline.letterbox(frame, self.meta.imgsz)
            inputs.append(x.to(self.device))
            boxes.append(box)
        preds = self.raw(torch.stack(inputs))
        preds = preds[0] if isinstance(preds, tuple) else preds
        classes = list(classes) if classes is not None else None
        if self.meta.end2end:
            found = torch_pipeline.select_end2end(preds, conf, max_det, classes)
        else:
            found = torch_pipeline.non_max_suppression(
                preds, self.meta.nc, conf, iou, max_det, agnostic=agnostic, classes=classes
            )
        return [torch_pipeline.scale_boxes(rows.clone(), box) for rows, box in zip(found, boxes, strict=True)]
