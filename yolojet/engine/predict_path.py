"""The predict path around the network on our kernels, captured whole in one CUDA graph: `DetectionHead` for the
tasks with boxes, `ClassifyHead` for classification.

A detection graph holds: the copy of the run's inputs from pinned memory (options, and a table of the batch's frames:
their addresses, sizes and placements), the letterbox of every slot in one launch, every network launch, decode,
NMS (or the YOLO26 one-to-one selection), the box mapping, and the copy of the fixed-size results back into pinned
memory. Frames are read where they lie on the GPU (decoded there, copied there, or the caller's tensors), so one
graph per (batch bucket, class filter on or off, parity) serves frames of every size: nothing is captured again
when the sizes change, and new thresholds only rewrite pinned memory. A batch smaller than its bucket runs the whole
bucket, its last frame repeated in the spare slots (whose results nobody reads): the network runs the bucket anyway,
and a server, whose batches take every size up to max_batch, then captures a graph a bucket, not a graph a size
(the first batch of each size waited 41 ms for its capture, with yolo11n on an H200, where the replay takes 2-6 ms).

Two parities: two sets of pinned inputs and results, so that batch k + 1 can be staged and launched while batch k's
results still wait to be read; a parity is reused only once its last batch has been collected. Segment masks at the
input resolution are built inside the graph; taking them to each image's original size (a size per image) runs after
it, eagerly, when the batch is collected, so a segment batch is collected before the next one is launched.

Classification is the same frame, Pillow's resize and centre crop on our resample kernel (a plan per frame shape),
the network with its softmax, and the copy of the probabilities; its graphs are keyed by the frames' shapes too, and a
combination of shapes is captured once it has been seen twice (before that it runs eagerly, launch by launch).

Under Triton's interpreter (no CUDA) the same steps run in order without a graph.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch

from yolojet.engine.classify_input import DeviceResamplePlan
from yolojet.engine.network import TritonNetwork
from yolojet.engine.plan import INPUT_ROW
from yolojet.errors import EngineConfigError
from yolojet.geometry import Letterbox
from yolojet.images import Frame
from yolojet.kernels.boxes import scale_boxes, select_rows
from yolojet.kernels.keypoints import scale_keypoints
from yolojet.kernels.masks import assemble_masks, masks_to_original
from yolojet.kernels.nms import BestClassTargets, NmsScratch, non_max_suppression
from yolojet.kernels.preprocess import FRAME_FIELDS, frame_row, letterbox_frames
from yolojet.kernels.rotated_nms import RotatedNmsScratch, rotated_non_max_suppression, scale_rotated_boxes
from yolojet.reference.classify import classify_plan

MAX_NMS = 30000  # ultralytics' default cap on candidates entering NMS
MIN_GRAPHS = 16  # captured paths kept at least; the least recently used is dropped past a path's `max_graphs`
# A classifier's frame buffers and resize plans, kept per frame shape (its graphs hold their addresses): past this many
# bytes of frames, a new shape lets all of them go with their graphs, so a folder of photos of many sizes does not
# hold a buffer for every size it met.
CLASSIFY_STAGING_BYTES = 1 << 30
PARITIES = 2
_OPTIONS_BYTES = 20  # thresholds (2 float32) and limits (3 int32) ahead of the class mask
_BOX_PARAMS = 6  # [pad_x, pad_y, gain_x, gain_y, w0, h0] a slot (Letterbox.box_params)


@dataclass(frozen=True)
class PredictOptions:
    """The options of one run, as ultralytics' predict names them."""

    conf: float = 0.25
    iou: float = 0.7
    max_det: int = 300
    classes: tuple[int, ...] | None = None
    agnostic: bool = False
    retina_masks: bool = False


def _count_elements(batch: int) -> int:
    return -(-batch // 4) * 4  # the rows after the counts start 16-byte aligned


def _result_views(results: torch.Tensor, batch: int, capacity: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(count (batch,) int32, rows (batch, capacity, width) float32) of one results buffer."""
    counts = _count_elements(batch)
    return results[:batch].view(torch.int32), results[counts:].view(batch, capacity, width)


class RunInputs:
    """What a run reads from the host besides pixels, laid out in one byte buffer so that one copy brings it to the
    device: float32 [conf, iou] at byte 0, int32 [max_det, max_nms, agnostic] at byte 8, the uint8 class mask at
    20, then (16-byte aligned) the frame table, int64 (max_batch, FRAME_FIELDS), and the box parameters, float32
    (max_batch, 6). One pinned buffer per parity, one on the device."""

    def __init__(self, nc: int, max_batch: int, device: torch.device, pinned: bool) -> None:
        self.nc = nc
        table_at = -(-(_OPTIONS_BYTES + nc) // 16) * 16
        boxes_at = table_at + max_batch * FRAME_FIELDS * 8
        size = boxes_at + max_batch * _BOX_PARAMS * 4
        self._layout = (table_at, boxes_at, max_batch)
        self.device = torch.zeros(size, dtype=torch.uint8, device=device)
        self.host = [torch.zeros(size, dtype=torch.uint8, pin_memory=pinned) for _ in range(PARITIES)]
        # numpy views of the pinned buffers, made once: writing a batch through them takes microseconds, where
        # torch's views and small tensors took most of staging a batch of new frames (with letterboxes worked out
        # once a size, staging went from 192 to 32 us for one new frame and from 347 to 159 us for 16, measured on a
        # 2-core machine).
        self._host_arrays = [{k: v.numpy() for k, v in self.views(buffer).items()} for buffer in self.host]

    def views(self, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
        table_at, boxes_at, max_batch = self._layout
        return {
            "thresholds": buffer[:8].view(torch.float32),
            "limits": buffer[8:20].view(torch.int32),
            "class_mask": buffer[20 : 20 + self.nc],
            "table": buffer[table_at:boxes_at].view(torch.int64).view(max_batch, FRAME_FIELDS),
            "box_params": buffer[boxes_at:].view(torch.float32).view(max_batch, _BOX_PARAMS),
        }

    def write(self, parity: int, options: PredictOptions, capacity: int) -> dict[str, np.ndarray]:
        """Write a run's options into the parity's pinned buffer; returns its (numpy) views for the frames."""
        host = self._host_arrays[parity]
        host["thresholds"][:] = (options.conf, options.iou)
        host["limits"][:] = (min(options.max_det, capacity), MAX_NMS, int(options.agnostic))
        mask = host["class_mask"]
        mask[:] = 0 if options.classes is not None else 1
        if options.classes is not None:
            mask[list(options.classes)] = 1
        return host


class CapturedPath(ABC):
    """The graph cache of a predict path: one captured graph per key (`_key`), replayed on the path's run stream;
    a key that `_capture_at_once` declines is run eagerly until it is seen again."""

    capacity = 300  # the largest max_det the engine accepts
    # Batches in flight at once: 2 lets batch k + 1 launch while batch k's results are read; 1 where collecting a
    # batch still needs its device buffers (segment masks).
    depth = PARITIES

    def __init__(self, network: TritonNetwork) -> None:
        self.network = network
        self.meta = network.graph.meta
        self.cuda = network.device.type == "cuda"
        self.graphs: OrderedDict[tuple, tuple[torch.cuda.CUDAGraph, Callable[[], None]]] = OrderedDict()
        # Every run size of both parities, with and without a class filter: a smaller cache recaptured a graph for
        # nearly every batch of a server (an eager run and a capture: 41 ms a batch of yolo11n on an H200).
        self.max_graphs = max(MIN_GRAPHS, 2 * PARITIES * network.max_batch)
        self.seen: OrderedDict[tuple, None] = OrderedDict()
        self.captured_with = network.captures  # a new network capture may move the scratch these graphs hold
        self.done = [torch.cuda.Event() for _ in range(PARITIES)] if self.cuda else []
        # Each parity's frames, kept from `stage` until the batch is collected: the GPU reads them after `stage`
        # returns, and a frame let go before then could have its memory handed to another stream's next allocation.
        self.staged: list[list[Frame]] = [[] for _ in range(PARITIES)]

    @abstractmethod
    def _key(self, batch: int, parity: int) -> tuple:
        """What a captured graph of this run depends on."""

    def _capture_at_once(self, key: tuple) -> bool:
        return True

    def run_size(self, batch: int) -> int:
        """How many slots a run of `batch` staged frames computes."""
        return batch

    @abstractmethod
    def _steps(self, batch: int, parity: int) -> Callable[[], None]:
        """The whole path for the staged batch, as one callable (run once eagerly, then captured)."""

    def wait_for(self, events: Sequence[torch.cuda.Event] = (), stream: torch.cuda.Stream | None = None) -> None:
        """Runs queued from now on, on the caller's current stream (`stream` where the caller has it at hand), start
        once every event (a batch's decode) has passed."""
        if self.cuda and events:
            stream = stream if stream is not None else torch.cuda.current_stream(self.network.device)
            for event in events:
                stream.wait_event(event)

    def launch(self, batch: int, parity: int, stream: torch.cuda.Stream | None = None) -> None:
        """Run the staged batch through the whole path on the caller's current stream (after `wait_for`; `stream`:
        that stream, where the caller has it at hand); returns at once on a GPU (`collect` waits)."""
        if not self.cuda:
            self._steps(self.run_size(batch), parity)()
            return
        if self.captured_with != self.network.captures:
            self.graphs.clear()
            self.captured_with = self.network.captures
        batch = self.run_size(batch)
        key = self._key(batch, parity)
        graph = self.graphs.get(key)
        if graph is not None:
            self.graphs.move_to_end(key)
            graph[0].replay()
        elif key in self.seen or self._capture_at_once(key):
            self.graphs[key] = self._capture(batch, parity)
            while len(self.graphs) > self.max_graphs:
                self.graphs.popitem(last=False)
            self.graphs[key][0].replay()
        else:
            self.seen[key] = None
            while len(self.seen) > 4 * self.max_graphs:
                self.seen.popitem(last=False)
            self._steps(batch, parity)()
        self.done[parity].record(stream if stream is not None else torch.cuda.current_stream(self.network.device))

    def wait(self, parity: int) -> None:
        if self.cuda:
            self.done[parity].synchronize()

    def _capture(self, batch: int, parity: int) -> tuple[torch.cuda.CUDAGraph, Callable[[], None]]:
        """The path captured on the network's capture stream (none of its branch streams); the closure is kept with
        the graph, which holds the addresses of what it owns."""
        run = self._steps(batch, parity)
        stream = self.network.capture_stream
        stream.wait_stream(torch.cuda.current_stream(self.network.device))
        with torch.cuda.stream(stream):
            run()  # compiles any kernel not yet compiled, outside the capture
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        # Thread-local: decoder threads keep copying frames to the device and allocating pinned memory meanwhile.
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
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
            self.depth = 1
            # Masks at input resolution for every slot and row: capacity x H x W bytes an image (shared by the paths
            # of every input size, which a segment batch never overlaps); and the kept boxes in input pixels, which
            # taking the masks to the original image reads after the graph has mapped the rows.
            h, w = self.meta.imgsz
            masks = network.arenas.take("masks", batch * capacity * h * w, torch.uint8)
            self.masks_input = masks.view(batch, capacity, h, w)
            self.boxes_input = torch.zeros(batch, capacity, 4, dtype=torch.float32, device=device)
        shape = graph.values[self.output].shape
        self.end2end = self.meta.end2end
        width = shape[2] if self.end2end else 6 + shape[1] - 4 - self.meta.nc  # OBB: 7, the angle is the extra
        self.capacity, self.width = capacity, width
        # Counts, then rows, in one float32 buffer, so that a run's results reach pinned memory in one copy.
        size = _count_elements(batch) + batch * capacity * width
        self.results = torch.zeros(size, dtype=torch.float32, device=device)
        self.results_host = [torch.zeros(size, dtype=torch.float32, pin_memory=self.cuda) for _ in range(PARITIES)]
        self._results_arrays = [buffer.numpy() for buffer in self.results_host]  # made once, as RunInputs' views
        self.count, self.rows = _result_views(self.results, batch, capacity, width)
        self.inputs = RunInputs(self.meta.nc, batch, device, pinned=self.cuda)
        scratch_type = RotatedNmsScratch if self.task == "obb" else NmsScratch
        self.scratch = None if self.end2end else scratch_type.allocate(batch, int(shape[2]), device)
        self.filtered = [False] * PARITIES
        # Runs fill their batch bucket where they are captured (on a GPU); under the interpreter, which captures
        # nothing, the spare slots would only cost time.
        self.fill_bucket = self.cuda
        # What each parity's pinned inputs hold, so that running the same staged frames again (the low-latency
        # trio's loop) writes nothing.
        self.written: list[tuple | None] = [None] * PARITIES

    # -- staging and results ------------------------------------------------------------------

    def stage(
        self,
        parity: int,
        frames: Sequence[Frame],
        options: PredictOptions,
        placements: Sequence[Letterbox] | None = None,
    ) -> None:
        """Write a batch's options and frame table into the parity's pinned inputs. Frames must lie on the engine's
        device, and stay there unchanged until the batch is collected. `placements`: where each frame goes in the
        input (default: fitted to it, centred); boxes map back as ultralytics' scale_boxes does, from the sizes."""
        if not 1 <= len(frames) <= self.network.max_batch:
            raise EngineConfigError(f"run({len(frames)}): this engine runs 1..{self.network.max_batch} frames")
        # A table row holds where a frame lies and how it is laid out: the same rows for frames at the same address.
        held = (
            tuple((f.pixels.data_ptr(), f.pixels.shape, f.pixels.stride(), f.bgr) for f in frames),
            options,
            tuple(placements) if placements is not None else None,
            self.run_size(len(frames)),
        )
        self.filtered[parity] = options.classes is not None
        self.staged[parity] = list(frames)
        if self.written[parity] == held:
            return
        self.written[parity] = None  # half-written inputs match nothing
        host = self.inputs.write(parity, options, self.capacity)
        fitted = [Letterbox.fit(frame.shape, self.meta.imgsz) for frame in frames]
        placed = fitted if placements is None else list(placements)
        rows = [frame_row(f.pixels, bgr=f.bgr, placement=p) for f, p in zip(frames, placed, strict=True)]
        params = [p.box_params() for p in fitted]
        spare = self.run_size(len(frames)) - len(frames)  # slots the run computes beyond the frames: the last again
        host["table"][: len(frames) + spare] = rows + rows[-1:] * spare
        host["box_params"][: len(frames) + spare] = params + params[-1:] * spare
        self.written[parity] = held

    def run_size(self, batch: int) -> int:
        return self.network.bucket_for(batch) if self.fill_bucket else batch

    def _key(self, batch: int, parity: int) -> tuple:
        # A class filter adds a launch; the pinned inputs and results differ by parity.
        return batch, self.filtered[parity], parity

    def collect(self, parity: int) -> list[dict[str, np.ndarray]]:
        """The batch's results per slot, on the host: boxes (original pixels), and per task keypoints, rotated boxes,
        or the original-size masks of the instances whose mask is not empty (ultralytics drops the others)."""
        self.wait(parity)
        frames = self.staged[parity]
        batch = len(frames)
        counts_at = _count_elements(self.network.max_batch)
        used = counts_at + batch * self.capacity * self.width
        copied = self._results_arrays[parity][:used].copy()  # one copy: the pinned buffer is reused
        counts = copied[:batch].view(np.int32)
        rows = copied[counts_at:].reshape(batch, self.capacity, self.width)
        found = []
        for slot in range(batch):
            kept = rows[slot, : counts[slot]]
            if self.task == "obb":
                found.append({"obb": kept})
            elif self.task == "pose":
                points = kept[:, 6:].reshape(len(kept), *(self.meta.kpt_shape or ()))
                found.append({"boxes": kept[:, :6], "keypoints": points})
            elif self.segment:
                found.append(self._original_masks(slot, frames[slot], kept))
            else:
                found.append({"boxes": kept})
        self.staged[parity] = []
        return found

    def _original_masks(self, slot: int, frame: Frame, kept: np.ndarray) -> dict[str, np.ndarray]:
        """A slot's masks taken to its original size on the device (eagerly, after the graph), then to the host."""
        n = len(kept)
        h0, w0 = frame.shape
        if n == 0:
            return {"boxes": kept, "masks": np.zeros((0, h0, w0), dtype=bool)}
        device = self.network.device
        box_params = self.inputs.views(self.inputs.device)["box_params"][slot : slot + 1]
        count = torch.tensor([n], dtype=torch.int32, device=device)
        out = torch.empty(n, h0, w0, dtype=torch.uint8, device=device)
        masks_to_original(
            [out], self.masks_input[slot : slot + 1, :n], count, box_params, rows=self.boxes_input[slot : slot + 1, :n]
        )
        masks = out.bool().cpu().numpy()
        keep = masks.reshape(n, -1).any(1)
        return {"boxes": kept[keep], "masks": masks[keep]}

    # -- building the path --------------------------------------------------------------------

    def _steps(self, batch: int, parity: int) -> Callable[[], None]:
        network = self.network
        bucket = network.bucket_for(batch)
        images = network.input_view(bucket)[:batch]
        # The image's rows of 4 (plan.INPUT_ROW): the fourth channel is padding, written with the pixel in one store.
        pad_row = images.stride(2) == INPUT_ROW
        preds = network.value_view(self.output, bucket)[:batch]
        rows, count = self.rows[:batch], self.count[:batch]
        used = _count_elements(network.max_batch) + rows.numel()  # every count, and the rows of `batch` images
        scratch = self.scratch.first(batch) if self.scratch is not None else None
        inputs = self.inputs.views(self.inputs.device)
        pinned = self.inputs.host[parity]
        results_host = self.results_host[parity]
        table, box_params = inputs["table"][:batch], inputs["box_params"][:batch]
        mask = inputs["class_mask"] if self.filtered[parity] else None
        thresholds, limits = inputs["thresholds"], inputs["limits"]
        kpt_shape = self.meta.kpt_shape or ()
        # The decode (or the head's score convs) writes the best-class pass for the bucket's images, saving NMS a
        # launch, and then not the class scores, which NMS reads only in that pass. A single class takes the pass too,
        # for 8 bytes an anchor where NMS would read its 4-byte score row: with it the head's convs fold the decode's
        # work (engine/fusion.py), so that its decode does not launch.
        best = None
        if self.scratch is not None:
            bucket_scratch = self.scratch.first(bucket)
            best = BestClassTargets(
                bucket_scratch.best_score, bucket_scratch.best_class, thresholds, mask, store_scores=False
            )
        # A detector's greedy NMS pass maps its kept boxes itself (segment's masks need them in input pixels first).
        boxes_mapped_in_nms = self.task == "detect" and not self.end2end
        if self.segment:
            proto = network.value_view(network.graph.outputs[1], bucket)[:batch]
            masks_input, boxes_input = self.masks_input[:batch], self.boxes_input[:batch]

        def run() -> None:
            self.inputs.device.copy_(pinned, non_blocking=True)
            letterbox_frames(images, table, pad_row=pad_row)
            best_ready = False
            if best is None:
                network.run_launches(bucket)
            else:
                with network.writing_best_class(bucket, best) as best_ready:
                    network.run_launches(bucket)
            if self.end2end:
                select_rows(rows, count, preds, thresholds, limits, mask)
            elif self.task == "obb":
                rotated_non_max_suppression(
                    rows,
                    count,
                    preds,
                    nc=self.meta.nc,
                    thresholds=thresholds,
                    limits=limits,
                    class_mask=mask,
                    scratch=cast(RotatedNmsScratch, scratch),
                    best_ready=best_ready,
                )
            else:
                non_max_suppression(
                    rows,
                    count,
                    preds,
                    nc=self.meta.nc,
                    thresholds=thresholds,
                    limits=limits,
                    class_mask=mask,
                    scratch=cast(NmsScratch, scratch),
                    best_ready=best_ready,
                    box_params=box_params if boxes_mapped_in_nms else None,
                )
            if self.segment:  # masks from the boxes in input pixels, so before they are mapped back
                assemble_masks(masks_input, rows, count, proto, input_hw=self.meta.imgsz)
                boxes_input.copy_(rows[..., :4])
            if self.task == "obb":
                scale_rotated_boxes(rows, count, box_params)
            elif self.task == "pose":  # boxes and keypoints in one launch
                scale_keypoints(rows, count, box_params, kpt_shape=kpt_shape, first_column=6, boxes=True)
            elif not boxes_mapped_in_nms:
                scale_boxes(rows, count, box_params)
            results_host[:used].copy_(self.results[:used], non_blocking=True)

        return run


@dataclass
class _ClassifySlot:
    """A staged classification frame: its shape and channel order, and its resize plan on the device."""

    shape: tuple[int, int, int]
    bgr: bool
    plan: DeviceResamplePlan


class ClassifyHead(CapturedPath):
    """Classification on our kernels: Pillow's resize and centre crop (ultralytics' classify transforms, bit for
    bit) into the input slot, the network with its softmax, the probabilities copied to pinned memory."""

    def __init__(self, network: TritonNetwork) -> None:
        super().__init__(network)
        h, w = self.meta.imgsz
        self.imgsz = h if h == w else (h, w)
        self.output = network.graph.outputs[0]
        size = (network.max_batch, self.meta.nc)
        self.probs_host = [torch.zeros(size, dtype=torch.float32, pin_memory=self.cuda) for _ in range(PARITIES)]
        # Frames are copied into staging buffers per (slot, shape, parity), and resize plans kept per (slot, shape):
        # captured graphs hold their addresses. A plan's intermediates are written by one batch at a time.
        self.staging: dict[tuple, torch.Tensor] = {}
        self.staging_bytes = 0
        self.plans: dict[tuple, DeviceResamplePlan] = {}
        self.slots: list[list[_ClassifySlot]] = [[] for _ in range(PARITIES)]
        self.depth = 1  # the resize plans' intermediates are shared by both parities

    def _staging(self, slot: int, shape: tuple[int, int, int], parity: int) -> torch.Tensor:
        key = (slot, shape, parity)
        if key not in self.staging:
            self.staging[key] = torch.empty(shape, dtype=torch.uint8, device=self.network.device)
            self.staging_bytes += self.staging[key].numel()
        return self.staging[key]

    def _plan(self, slot: int, shape: tuple[int, int, int]) -> DeviceResamplePlan:
        key = (slot, shape)
        if key not in self.plans:
            plan = classify_plan(shape[0], shape[1], self.imgsz)
            self.plans[key] = DeviceResamplePlan(plan, shape[2], self.network.device)
        return self.plans[key]

    def stage(self, parity: int, frames: Sequence[Frame], options: PredictOptions) -> None:
        """Copy a batch's frames into the parity's staging (classification reads none of the predict options, as
        ultralytics' classify predictor)."""
        if not 1 <= len(frames) <= self.network.max_batch:
            raise EngineConfigError(f"run({len(frames)}): this engine runs 1..{self.network.max_batch} frames")
        shapes = [cast(tuple[int, int, int], tuple(int(d) for d in frame.pixels.shape)) for frame in frames]
        new = sum(math.prod(shape) for slot, shape in enumerate(shapes) if (slot, shape, parity) not in self.staging)
        if new and self.staging_bytes + new > CLASSIFY_STAGING_BYTES:
            # Nothing of this path is in flight (depth 1: the engine collects it before staging anything).
            self.staging.clear()
            self.plans.clear()
            self.graphs.clear()
            self.staging_bytes = 0
        slots = []
        for slot, (frame, shape) in enumerate(zip(frames, shapes, strict=True)):
            self._staging(slot, shape, parity).copy_(frame.pixels)
            slots.append(_ClassifySlot(shape, frame.bgr, self._plan(slot, shape)))
        self.slots[parity] = slots
        self.staged[parity] = list(frames)

    def _key(self, batch: int, parity: int) -> tuple:
        shapes = tuple((s.shape, s.bgr) for s in self.slots[parity][:batch])
        return self.network.bucket_for(batch), batch, shapes, parity

    def _capture_at_once(self, key: tuple) -> bool:
        return False  # a folder of photos of many sizes would capture a graph a batch: capture shapes that recur

    def _steps(self, batch: int, parity: int) -> Callable[[], None]:
        network = self.network
        bucket = network.bucket_for(batch)
        images = network.input_view(bucket)
        probs = network.value_view(self.output, bucket)[:batch]
        slots = self.slots[parity][:batch]
        frames = [self._staging(i, s.shape, parity) for i, s in enumerate(slots)]
        # On a GPU the softmax stores the probabilities into pinned memory itself where it can: no copy after the
        # network. Only this path's graphs hold that store.
        probs_host = self.probs_host[parity]
        host_rows = probs_host[:bucket] if self.cuda else None

        def run() -> None:
            for i, (s, pixels) in enumerate(zip(slots, frames, strict=True)):
                s.plan(images[i], pixels, bgr=s.bgr)
            with network.copying_output(bucket, self.output, host_rows) as copied:
                network.run_launches(bucket)
            if not copied:
                probs_host[:batch].copy_(probs, non_blocking=True)

        return run

    def collect(self, parity: int) -> list[dict[str, np.ndarray]]:
        self.wait(parity)
        batch = len(self.slots[parity])
        probs = self.probs_host[parity][:batch].numpy().copy()
        self.staged[parity] = []
        return [{"probs": p} for p in probs]


PredictPath = DetectionHead | ClassifyHead


def predict_path(network: TritonNetwork) -> PredictPath:
    return ClassifyHead(network) if network.graph.meta.task == "classify" else DetectionHead(network)
