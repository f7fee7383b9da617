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
from collections.abc import Sequence
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

TASKS_WITH_BOXES = ("detect", "segment", "pose", "obb")


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _device(device: str | torch.device | None) -> torch.device:
    """The device asked for (a CUDA GPU where there is one by default), checked to exist."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise EngineConfigError(f"device {device!r}: expected 'cuda', 'cuda:N' or 'cpu'") from e
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise EngineConfigError(f"device {device}: no CUDA GPU is visible here; use device='cpu'")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise EngineConfigError(f"device {device}: this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    elif device.type != "cpu":
        raise EngineConfigError(f"device {device}: yolojet runs on 'cuda' or 'cpu'")
    return device


def _image_size(imgsz: object) -> int | tuple[int, int]:
    """An int, or an (h, w) pair of ints, each at least 1."""
    values = list(imgsz) if isinstance(imgsz, (tuple, list)) else [imgsz]
    if len(values) not in (1, 2) or any(
        isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1 for v in values
    ):
        raise EngineConfigError(f"imgsz {imgsz!r}: expected a positive int or an (h, w) pair of them")
    if not isinstance(imgsz, (tuple, list)):
        return int(values[0])
    return int(values[0]), int(values[-1])  # a one-element list is a square


def _integral(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def _real(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating))


class Engine:
    """A model ready to run. Build with `Engine.load`."""

    def __init__(self, network: TritonNetwork | ReferenceExecutor, max_batch: int) -> None:
        self.network = network
        self.max_batch = max_batch
        self.device = network.device
        self._head = None
        if isinstance(network, TritonNetwork):
            from yolojet.runtime.gpu_head import ClassifyHead, DetectionHead

            self._head = ClassifyHead(network) if self.meta.task == "classify" else DetectionHead(network)
        self._frames: list[Frame | None] = [None] * max_batch
        self._found: list[dict[str, Any] | None] = [None] * max_batch
        self._ran = [False] * max_batch  # whether a run has found results for the frame now in each slot
        self._options: dict[str, Any] = {}
        self.configure()

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
        pdl: bool | None = None,
        branches: bool | None = None,
    ) -> Engine:
        """Load a model directory, `.pt`, ultralytics name or `.yaml` (exported on first use and cached).

        backend "triton" runs our kernels (a CUDA device, or the CPU when TRITON_INTERPRET=1); "reference"
        the float32 torch executor. The default is "triton" where it can run, else "reference" with a notice.
        `tune=None` tunes conv tiles unless YOLOJET_NOTUNE=1. `buckets` overrides the batch sizes a CUDA
        graph is captured for (default 1, 2, 4, ..., max_batch). `pdl=None` launches the network's kernels with
        programmatic dependent launch where the GPU supports it (Hopper and later) unless YOLOJET_PDL=0.
        `branches=None` runs independent launches, such as the head's per-level chains, on parallel streams inside
        the captured graph on a CUDA device unless YOLOJET_BRANCHES=0; `branches=False` runs them in order.
        """
        device = _device(device)
        if isinstance(max_batch, bool) or not isinstance(max_batch, (int, np.integer)) or max_batch < 1:
            raise EngineConfigError(f"max_batch {max_batch!r}: expected an int of at least 1")
        max_batch = int(max_batch)
        if imgsz is not None:
            imgsz = _image_size(imgsz)
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
            buckets=buckets, pdl=pdl, branches=branches,
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

    # -- images in, results out ------------------------------------------------------------

    def configure(
        self,
        conf: float = 0.25,
        iou: float = 0.7,
        max_det: int = 300,
        classes: Sequence[int] | None = None,
        agnostic: bool = False,
        retina_masks: bool = False,
    ) -> None:
        """Set the options the next `run` uses (no re-capture on the GPU path: they are read on the device).

        conf, iou, max_det, classes and agnostic act as in ultralytics' predict; retina_masks builds segment
        masks at the original resolution. Classification ignores them all.
        """
        for name, value in (("conf", conf), ("iou", iou)):
            if not _real(value) or not 0 <= value <= 1:
                raise EngineConfigError(f"{name} {value!r}: expected a number in [0, 1]")
        capacity = self._head.capacity if self._head is not None else 300
        if not _integral(max_det) or not 1 <= max_det <= capacity:
            raise EngineConfigError(f"max_det {max_det!r}: expected an int in 1..{capacity}")
        if classes is not None:
            classes = [classes] if _integral(classes) else classes  # one class id, as ultralytics takes it
            if isinstance(classes, (str, bytes)) or not isinstance(classes, Sequence | np.ndarray):
                raise EngineConfigError(f"classes {classes!r}: expected a class id or a list of them")
            if any(not _integral(c) or not 0 <= c < self.meta.nc for c in classes):
                raise EngineConfigError(f"classes {list(classes)}: class ids are ints from 0 to {self.meta.nc - 1}")
            classes = [int(c) for c in classes]
        max_det = int(max_det)
        self._options = {"conf": conf, "iou": iou, "max_det": max_det, "classes": classes, "agnostic": agnostic,
                         "retina_masks": retina_masks}  # fmt: skip
        if self._head is not None:
            self._head.set_options(conf, iou, max_det, classes, agnostic)

    def preprocess(self, frame: Any, slot: int = 0) -> None:
        """Stage one image (any accepted kind; a CUDA tensor stays on the GPU) in batch slot `slot`."""
        if not 0 <= slot < self.max_batch:
            raise EngineConfigError(f"slot {slot}: this engine has slots 0..{self.max_batch - 1}")
        decoded = load_frame(frame, self.device if self.device.type == "cuda" else None)
        self._frames[slot] = decoded
        self._ran[slot] = False
        if self._head is not None:
            self._head.stage(slot, decoded)

    def run_async(self, batch: int = 1) -> None:
        """Start the whole path on slots [0, batch); on a GPU this is one graph launch and returns at once."""
        if not _integral(batch) or not 1 <= batch <= self.max_batch:
            raise EngineConfigError(f"run({batch!r}): this engine runs 1..{self.max_batch} frames (max_batch)")
        if any(f is None for f in self._frames[:batch]):
            raise EngineConfigError(f"run({batch}): stage a frame into each of slots 0..{batch - 1} first")
        if self._on_head():
            self._head.launch(batch)
        else:
            self._found[:batch] = self._run_torch_path(self._frames[:batch])
        self._ran[:batch] = [True] * batch

    def sync(self) -> None:
        """Wait for the last `run_async`."""
        if self._on_head():
            self._head.wait()

    def _on_head(self) -> bool:
        """Whether runs go through the captured GPU path (retina masks are built by the torch path)."""
        return self._head is not None and not self._options.get("retina_masks", False)

    def run(self, batch: int = 1) -> None:
        self.run_async(batch)
        self.sync()

    def get(self, slot: int = 0) -> Results:
        """What the last run found in slot `slot`, in its original image's pixels."""
        if not _integral(slot) or not 0 <= slot < self.max_batch:
            raise EngineConfigError(f"slot {slot!r}: this engine has slots 0..{self.max_batch - 1}")
        if not self._ran[slot]:
            raise EngineConfigError(f"slot {slot}: no results for the frame staged there; run() after preprocess()")
        frame = self._frames[slot]
        found = self._head.found(slot) if self._on_head() else self._found[slot]
        image = torch_pipeline.rgb_pixels(frame).flip(-1).cpu().numpy()  # BGR, as ultralytics' orig_img
        return make_results(self.meta, found, frame, image)

    def __call__(self, images: Any, **options: Any) -> list[Results]:
        """Detect objects in one image or a list (paths, bytes, numpy BGR, PIL, torch tensors).

        Options as `configure` (conf, iou, max_det, classes, agnostic, retina_masks): those given here hold for
        this call, the others are the last `configure`'s (ultralytics' defaults unless configured). An image that
        cannot be read gets a `Results` whose `error` says why; the others are still detected.
        """
        if "agnostic_nms" in options:  # ultralytics' name for it
            options["agnostic"] = options.pop("agnostic_nms")
        unknown = sorted(set(options) - set(self._options))
        if unknown:
            raise EngineConfigError(f"unknown option(s) {', '.join(unknown)}: expected {', '.join(self._options)}")
        configured = dict(self._options)
        self.configure(**{**configured, **options})
        try:
            return self._detect(images)
        finally:
            if options:
                self.configure(**configured)

    def _detect(self, images: Any) -> list[Results]:
        sources = list(images) if isinstance(images, (list, tuple)) else [images]
        results: list[Results] = []
        pending: list[int] = []
        for i, source in enumerate(sources):
            try:
                self.preprocess(source, len(pending))
            except YolojetError as e:
                results.append(Results(names=self.names, path=str(source) if isinstance(source, (str, Path)) else "",
                                       error=str(e)))  # fmt: skip
                continue
            results.append(None)  # type: ignore[arg-type]
            pending.append(i)
            if len(pending) == self.max_batch:
                self._finish(pending, results)
        if pending:
            self._finish(pending, results)
        return results

    def _finish(self, pending: list[int], results: list[Results]) -> None:
        self.run(len(pending))
        for slot, index in enumerate(pending):
            results[index] = self.get(slot)
        pending.clear()

    def _run_torch_path(self, frames: list[Frame]) -> list[dict[str, Any]]:
        """Pre-processing, network and post-processing with torch ops around `raw`: the reference backend's
        path, and the Triton backend's for segment with retina masks."""
        o = self._options
        if self.meta.task == "classify":
            from yolojet.runtime.postprocess.classify import classify_preprocess

            h, w = self.meta.imgsz
            batch = torch.stack([classify_preprocess(f, h if h == w else (h, w)) for f in frames]).to(self.device)
            return [{"probs": p.float().cpu()} for p in self.raw(batch)]
        boxes, inputs = [], []
        for frame in frames:
            x, box = torch_pipeline.letterbox(frame, self.meta.imgsz)
            inputs.append(x.to(self.device))
            boxes.append(box)
        raw = self.raw(torch.stack(inputs))
        classes = list(o["classes"]) if o["classes"] is not None else None
        common = {"conf": o["conf"], "iou": o["iou"], "max_det": o["max_det"], "classes": classes,
                  "agnostic": o["agnostic"], "end2end": self.meta.end2end}  # fmt: skip
        task = self.meta.task
        if task == "segment":
            from yolojet.runtime.postprocess.segment import segment_postprocess

            found = segment_postprocess(raw[0], raw[1], boxes, self.meta.imgsz, nc=self.meta.nc,
                                        retina_masks=o["retina_masks"], **common)  # fmt: skip
            return [{"boxes": rows.cpu(), "masks": masks.cpu()} for rows, masks in found]
        if task == "pose":
            from yolojet.runtime.postprocess.pose import pose_postprocess

            found = pose_postprocess(raw, boxes, nc=self.meta.nc, kpt_shape=self.meta.kpt_shape, **common)
            return [{"boxes": rows.cpu(), "keypoints": kpts.cpu()} for rows, kpts in found]
        if task == "obb":
            from yolojet.runtime.postprocess.obb import obb_postprocess

            return [{"obb": rows.cpu()} for rows in obb_postprocess(raw, boxes, nc=self.meta.nc, **common)]
        if self.meta.end2end:
            found = torch_pipeline.select_end2end(raw, o["conf"], o["max_det"], classes)
        else:
            found = torch_pipeline.non_max_suppression(
                raw, self.meta.nc, o["conf"], o["iou"], o["max_det"], agnostic=o["agnostic"], classes=classes
            )
        return [
            {"boxes": torch_pipeline.scale_boxes(rows.clone(), box).cpu()}
            for rows, box in zip(found, boxes, strict=True)
        ]


def make_results(meta: ModelMeta, found: dict[str, Any], frame: Frame, image: np.ndarray) -> Results:
    """A `Results` from one image's task outputs (torch tensors on the CPU)."""
    shape = frame.shape
    parts: dict[str, Any] = {}
    if "boxes" in found:
        parts["boxes"] = Boxes(found["boxes"][:, :6].numpy().astype(np.float32), shape)
    if "masks" in found:
        from yolojet.tasks.segment import Masks

        parts["masks"] = Masks(found["masks"].numpy().astype(bool))
    if "keypoints" in found:
        from yolojet.tasks.pose import Keypoints

        parts["keypoints"] = Keypoints(found["keypoints"].numpy().astype(np.float32), shape)
    if "obb" in found:
        from yolojet.tasks.obb import OBB

        parts["obb"] = OBB(found["obb"].numpy().astype(np.float32), shape)
    if "probs" in found:
        from yolojet.tasks.classify import Probs

        parts["probs"] = Probs(found["probs"].numpy().astype(np.float32))
    return Results(names=meta.names, path=frame.path, orig_img=image, orig_shape=shape, **parts)
