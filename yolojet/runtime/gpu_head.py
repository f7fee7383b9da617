"""The predict path around the network on our kernels, captured whole in one CUDA graph: `DetectionHead` for the
tasks with boxes, `ClassifyHead` for classification.

One graph per (batch bucket, frame sizes, frame location) holds: the copy of each staged frame from
pinned host memory (skipped for frames already on the GPU), the copy of the pinned options
(conf, iou, max_det, agnostic, class filter) to the device, the letterbox kernel per slot, every
network launch, decode, NMS (or the YOLO26 one-to-one selection), the box mapping, and the copy of
the fixed-size results back into pinned host memory. Running a batch is one graph launch and one
event wait; changing thresholds only rewrites pinned memory, so nothing is captured again. Video
streams keep one frame size, so they keep one graph. Under Triton's interpreter (no CUDA) the same
steps run in order without a graph. Classification is the same frame (pinned or on the GPU), Pillow's resize and
centre crop on our resample kernel, the network with its softmax, and the copy of the probabilities.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from yolojet.errors import EngineConfigError
from yolojet.images import Frame
from yolojet.kernels.boxes import scale_boxes, select_rows
from yolojet.kernels.keypoints import scale_keypoints
from yolojet.kernels.masks import assemble_masks, masks_to_original
from yolojet.kernels.nms import NmsScratch, non_max_suppression
from yolojet.kernels.preprocess import preprocess_letterbox
from yolojet.kernels.rotated_nms import RotatedNmsScratch, rotated_non_max_suppression, scale_rotated_boxes
from yolojet.runtime.network import TritonNetwork
from yolojet.runtime.postprocess.classify import DeviceResamplePlan, classify_plan
from yolojet.runtime.torch_pipeline import Letterbox

MAX_NMS = 30000  # ultralytics' default cap on candidates entering NMS
MAX_GRAPHS = 8  # captured (bucket, frame sizes) combinations kept; the oldest is dropped past this
_OPTIONS_BYTES = 20  # thresholds (2 float32) and limits (3 int32) ahead of the class mask


def _count_elements(batch: int) -> int:
    return -(-batch // 4) * 4  # the rows after the counts start 16-byte aligned


def _result_views(results: torch.Tensor, batch: int, capacity: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(count (batch,) int32, rows (batch, capacity, width) float32) of one results buffer."""
    counts = _count_elements(batch)
    return results[:batch].view(torch.int32), results[counts:].view(batch, capacity, width)


def _option_views(buffer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(thresholds float32 [2], limits int32 [3], class mask uint8 [nc]) viewing one uint8 options buffer."""
    return buffer[:8].view(torch.float32), buffer[8:20].view(torch.int32), buffer[20:]


@dataclass
class _Slot:
    """A staged frame: its pixels (pinned host or device staging) and how it becomes the network input (a
    `Letterbox`, or a classification `DeviceResamplePlan`)."""

    shape: tuple[int, int, int]
    on_device: bool
    bgr: bool
    placement: Any


class CapturedPath(ABC):
    """Staging of frames into batch slots and one captured graph per (bucket, frame shapes, frame locations) for a
    path built by `_steps`; subclasses say how a frame shape is placed and what the path does."""

    capacity = 300  # the largest max_det the engine accepts

    def __init__(self, network: TritonNetwork) -> None:
        self.network = network
        self.meta = network.graph.meta
        self.cuda = network.device.type == "cuda"
        self.slots: list[_Slot | None] = [None] * network.max_batch
        self.staging: dict[tuple, Any] = {}
        self.graphs: OrderedDict[tuple, tuple[torch.cuda.CUDAGraph, Callable[[], None]]] = OrderedDict()
        self.captured_with = network.captures  # a new network capture may move the scratch these graphs hold
        self.done = torch.cuda.Event() if self.cuda else None

    @abstractmethod
    def _placement(self, slot: int, shape: tuple[int, ...]) -> Any:
        """How a frame of this shape becomes the network input (kept for as long as graphs use it)."""

    def _variant(self) -> Any:
        """Anything besides the frames that changes what is captured."""
        return None

    @abstractmethod
    def _steps(self, batch: int, slots: list[_Slot]) -> Callable[[], None]:
        """The whole path for these staged slots, as one callable (run once eagerly, then captured)."""

    def _staging(self, slot: int, shape: tuple[int, ...], where: str) -> torch.Tensor:
        """The slot's staging buffer for frames (or original-size masks) of this shape; kept for as long as the
        engine, because captured graphs hold its address."""
        key = (slot, shape, where)
        if key not in self.staging:
            device = self.network.device if where in ("device", "masks") else torch.device("cpu")
            pinned = where == "host" and self.cuda
            self.staging[key] = torch.empty(shape, dtype=torch.uint8, device=device, pin_memory=pinned)
        return self.staging[key]

    def stage(self, slot: int, frame: Frame) -> None:
        """Put a frame in a batch slot: into pinned host staging, or device staging for a frame on the GPU."""
        if not 0 <= slot < len(self.slots):
            raise EngineConfigError(f"slot {slot}: this engine has slots 0..{len(self.slots) - 1}")
        pixels = frame.pixels
        on_device = pixels.device.type == "cuda" or not self.cuda
        shape = tuple(int(d) for d in pixels.shape)
        placement = self._placement(slot, shape)
        self._staging(slot, shape, "device" if on_device else "host").copy_(pixels)
        self.slots[slot] = _Slot(shape, on_device, frame.bgr, placement)

    def launch(self, batch: int) -> None:
        """Run slots [0, batch) through the whole path; returns at once on a GPU (see `wait`)."""
        slots = self.slots[:batch]
        if batch < 1 or any(s is None for s in slots):
            raise EngineConfigError(f"run({batch}): stage a frame into each of slots 0..{batch - 1} first")
        if not self.cuda:
            self._steps(batch, slots)()
            return
        if self.captured_with != self.network.captures:
            self.graphs.clear()
            self.captured_with = self.network.captures
        key = (self.network.bucket_for(batch), batch, tuple((s.shape, s.on_device, s.bgr) for s in slots),
               self._variant())  # fmt: skip
        if key not in self.graphs:
            self.graphs[key] = self._capture(batch, slots)
            while len(self.graphs) > MAX_GRAPHS:
                self.graphs.popitem(last=False)
        self.graphs.move_to_end(key)
        self.graphs[key][0].replay()
        self.done.record()

    def wait(self) -> None:
        if self.done is not None:
            self.done.synchronize()

    def _frame_copies(self, slots: list[_Slot]) -> tuple[list[torch.Tensor], Callable[[], None]]:
        """The device frames of the slots, and the step that copies the pinned ones in."""
        frames = [self._staging(i, s.shape, "device") for i, s in enumerate(slots)]
        copies = [(frames[i], self._staging(i, s.shape, "host")) for i, s in enumerate(slots) if not s.on_device]

        def copy_in() -> None:
            for device_frame, host_frame in copies:
                device_frame.copy_(host_frame, non_blocking=True)

        return frames, copy_in

    def _capture(self, batch: int, slots: list[_Slot]) -> tuple[torch.cuda.CUDAGraph, Callable[[], None]]:
        """The path captured; the closure is kept with the graph, which holds the addresses of what it owns."""
        run = self._steps(batch, slots)
        side = self.network.capture_stream  # the warm-up too: none of the branch streams
        side.wait_stream(torch.cuda.current_stream(self.network.device))
        with torch.cuda.stream(side):
            run()  # compiles any kernel not yet compiled, outside the capture
        torch.cuda.current_stream(self.network.device).wait_stream(side)
        torch.cuda.synchronize(self.network.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.network.capture_stream):
            run()
        return graph, run


class DetectionHead(CapturedPath):
    """The detect, segment, pose and OBB heads on our kernels: NMS (rotated for OBB) or the one-to-one selection,
    then per task mask assembly, keypoint or rotated-box mapping, and the box mapping."""

    TASKS = ("detect", "segment", "pose", "obb")

    def __init__(self, network: TritonNetwork, capacity: int = 300) -> None:
        super().__init__(network)
        graph, device, batch = network.graph, network.device, network.max_batch
        self.output = graph.outputs[0]
        self.task = self.meta.task
        self.segment = self.task == "segment"
        if self.segment:
            # Masks at input resolution for every slot and row: capacity x H x W bytes an image.
            self.masks_input = torch.zeros(batch, capacity, *self.meta.imgsz, dtype=torch.uint8, device=device)
        shape = graph.values[self.output].shape
        self.end2end = self.meta.end2end
        width = shape[2] if self.end2end else 6 + shape[1] - 4 - self.meta.nc  # OBB: 7, the angle is the extra
        self.capacity = capacity
        pin = self.cuda
        # Counts, then rows, in one float32 buffer, so that a run's results reach pinned memory in one copy.
        size = _count_elements(batch) + batch * capacity * width
        self.results = torch.zeros(size, dtype=torch.float32, device=device)
        self.results_host = torch.zeros(self.results.numel(), dtype=torch.float32, pin_memory=pin)
        self.count, self.rows = _result_views(self.results, batch, capacity, width)
        self.count_host, self.rows_host = _result_views(self.results_host, batch, capacity, width)
        # The options in one byte buffer, pinned and on the device, so that the graph copies them in one go:
        # float32 [conf, iou] at byte 0, int32 [max_det, max_nms, agnostic] at byte 8, the uint8 class mask at 20.
        self.options = torch.zeros(_OPTIONS_BYTES + self.meta.nc, dtype=torch.uint8, device=device)
        self.options_host = torch.zeros(_OPTIONS_BYTES + self.meta.nc, dtype=torch.uint8, pin_memory=pin)
        self.thresholds, self.limits, self.class_mask = _option_views(self.options)
        self.thresholds_host, self.limits_host, self.class_mask_host = _option_views(self.options_host)
        scratch_type = RotatedNmsScratch if self.task == "obb" else NmsScratch
        self.scratch = None if self.end2end else scratch_type.allocate(batch, int(shape[2]), device)
        self.filtered = False
        self.set_options(0.25, 0.7, capacity, None, False)

    # -- options ------------------------------------------------------------------------------

    def set_options(self, conf: float, iou: float, max_det: int, classes: Iterable[int] | None, agnostic: bool) -> None:
        """Write the options where the next run reads them (pinned memory copied in by the graph)."""
        self.thresholds_host.copy_(torch.tensor([conf, iou], dtype=torch.float32))
        self.limits_host.copy_(torch.tensor([max_det, MAX_NMS, int(agnostic)], dtype=torch.int32))
        self.class_mask_host.fill_(0 if classes is not None else 1)
        if classes is not None:
            self.class_mask_host[list(classes)] = 1
        self.filtered = classes is not None

    # -- staging and results ------------------------------------------------------------------

    def _placement(self, slot: int, shape: tuple[int, ...]) -> Letterbox:
        return Letterbox.fit((shape[0], shape[1]), self.meta.imgsz)

    def _variant(self) -> bool:
        return self.filtered  # a class filter adds a launch

    def _mask_buffer(self, slot: int) -> torch.Tensor:
        h0, w0 = self.slots[slot].shape[:2]
        return self._staging(slot, (self.capacity, h0, w0), "masks")

    def rows_of(self, slot: int) -> torch.Tensor:
        """The last run's detections of a slot, [x1, y1, x2, y2, conf, cls, extras] in original pixels."""
        return self.rows_host[slot, : int(self.count_host[slot])]

    def found(self, slot: int) -> dict[str, torch.Tensor]:
        """The last run's results of a slot: boxes, and for segment the original-size masks of the instances whose
        mask is not empty (ultralytics drops the others)."""
        rows = self.rows_of(slot)
        if self.task == "obb":
            return {"obb": rows}
        if self.task == "pose":
            return {"boxes": rows[:, :6], "keypoints": rows[:, 6:].reshape(len(rows), *self.meta.kpt_shape)}
        if not self.segment:
            return {"boxes": rows}
        masks = self._mask_buffer(slot)[: len(rows)].bool()
        keep = masks.flatten(1).any(1).cpu()
        return {"boxes": rows[keep], "masks": masks[keep.to(masks.device)].cpu()}

    # -- building the path --------------------------------------------------------------------

    def _box_params(self, slots: list[_Slot]) -> torch.Tensor:
        params = torch.tensor([s.placement.box_params() for s in slots], dtype=torch.float32)
        return params.to(self.network.device)

    def _steps(self, batch: int, slots: list[_Slot]) -> Callable[[], None]:
        network = self.network
        box_params = self._box_params(slots)
        bucket = network.bucket_for(batch)
        images = network.input_view(bucket)
        preds = network.value_view(self.output, bucket)[:batch]
        rows, count = self.rows[:batch], self.count[:batch]
        used = _count_elements(network.max_batch) + rows.numel()  # every count, and the rows of `batch` images
        frames, copy_in = self._frame_copies(slots)
        scratch = self.scratch.first(batch) if self.scratch is not None else None
        if self.segment:
            proto = network.value_view(network.graph.outputs[1], bucket)[:batch]
            masks_input = self.masks_input[:batch]
            masks_out = [self._mask_buffer(i) for i in range(batch)]

        def run() -> None:
            self.options.copy_(self.options_host, non_blocking=True)
            copy_in()
            for i, (s, pixels) in enumerate(zip(slots, frames, strict=True)):
                preprocess_letterbox(images[i], pixels, bgr=s.bgr, params=s.placement.kernel_params())
            network.run_launches(bucket)
            mask = self.class_mask if self.filtered else None
            options = {"thresholds": self.thresholds, "limits": self.limits, "class_mask": mask}
            if self.end2end:
                select_rows(rows, count, preds, self.thresholds, self.limits, mask)
            elif self.task == "obb":
                rotated_non_max_suppression(rows, count, preds, nc=self.meta.nc, scratch=scratch, **options)
            else:
                non_max_suppression(rows, count, preds, nc=self.meta.nc, scratch=scratch, **options)
            if self.segment:  # masks from the boxes in input pixels, so before they are mapped back
                assemble_masks(masks_input, rows, count, proto, input_hw=self.meta.imgsz)
                masks_to_original(masks_out, masks_input, count, box_params, rows=rows)
            if self.task == "obb":
                scale_rotated_boxes(rows, count, box_params)
            elif self.task == "pose":  # boxes and keypoints in one launch
                scale_keypoints(rows, count, box_params, kpt_shape=self.meta.kpt_shape, first_column=6, boxes=True)
            else:
                scale_boxes(rows, count, box_params)
            self.results_host[:used].copy_(self.results[:used], non_blocking=True)

        return run


class ClassifyHead(CapturedPath):
    """Classification on our kernels: Pillow's resize and centre crop (ultralytics' classify transforms, bit for
    bit) into the input slot, the network with its softmax, the probabilities copied to pinned memory."""

    def __init__(self, network: TritonNetwork) -> None:
        super().__init__(network)
        h, w = self.meta.imgsz
        self.imgsz = h if h == w else (h, w)
        self.output = network.graph.outputs[0]
        self.probs_host = torch.zeros(network.max_batch, self.meta.nc, dtype=torch.float32, pin_memory=self.cuda)

    def _placement(self, slot: int, shape: tuple[int, ...]) -> DeviceResamplePlan:
        key = (slot, shape, "resample")
        if key not in self.staging:  # kept: captured graphs hold the taps' and intermediates' addresses
            plan = classify_plan(shape[0], shape[1], self.imgsz)
            self.staging[key] = DeviceResamplePlan(plan, shape[2], self.network.device)
        return self.staging[key]

    def _steps(self, batch: int, slots: list[_Slot]) -> Callable[[], None]:
        network = self.network
        bucket = network.bucket_for(batch)
        images = network.input_view(bucket)
        probs = network.value_view(self.output, bucket)[:batch]
        frames, copy_in = self._frame_copies(slots)
        # On a GPU the softmax stores the probabilities into pinned memory itself where it can: no copy after the
        # network. Only this path's graphs hold that store.
        host_rows = self.probs_host[:bucket] if self.cuda else None

        def run() -> None:
            copy_in()
            for i, (s, pixels) in enumerate(zip(slots, frames, strict=True)):
                s.placement(images[i], pixels, bgr=s.bgr)
            with network.copying_output(bucket, self.output, host_rows) as copied:
                network.run_launches(bucket)
            if not copied:
                self.probs_host[:batch].copy_(probs, non_blocking=True)

        return run

    def set_options(self, conf: float, iou: float, max_det: int, classes: Iterable[int] | None, agnostic: bool) -> None:
        """Classification reads none of the predict options (as ultralytics' classify predictor)."""
        return

    def found(self, slot: int) -> dict[str, torch.Tensor]:
        return {"probs": self.probs_host[slot].clone()}
