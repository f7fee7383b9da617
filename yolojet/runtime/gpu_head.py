"""The predict path around the network on our kernels: letterbox in, NMS and box mapping out, all on the GPU.

Buffers are allocated once per engine; thresholds, max_det, the class filter and the per-image
box mapping live in small device tensors that the kernels read, so changing them needs no new
kernel arguments (and no re-capture once the whole path is captured).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from yolojet.images import Frame
from yolojet.kernels.boxes import scale_boxes, select_rows
from yolojet.kernels.nms import NmsScratch, non_max_suppression
from yolojet.kernels.preprocess import preprocess_letterbox
from yolojet.runtime.network import TritonNetwork
from yolojet.runtime.torch_pipeline import Letterbox

MAX_NMS = 30000  # ultralytics' default cap on candidates entering NMS


class DetectionHead:
    def __init__(self, network: TritonNetwork, capacity: int = 300) -> None:
        self.network = network
        graph, device, batch = network.graph, network.device, network.max_batch
        self.meta = graph.meta
        self.output = graph.outputs[0]
        shape = graph.values[self.output].shape
        self.end2end = self.meta.end2end
        width = shape[2] if self.end2end else 6 + shape[1] - 4 - self.meta.nc
        self.capacity = capacity
        self.rows = torch.zeros(batch, capacity, width, dtype=torch.float32, device=device)
        self.count = torch.zeros(batch, dtype=torch.int32, device=device)
        self.thresholds = torch.zeros(2, dtype=torch.float32, device=device)
        self.limits = torch.zeros(3, dtype=torch.int32, device=device)
        self.class_mask = torch.ones(self.meta.nc, dtype=torch.uint8, device=device)
        self.box_params = torch.zeros(batch, 6, dtype=torch.float32, device=device)
        self.scratch = None if self.end2end else NmsScratch.allocate(batch, int(shape[2]), device)

    def _set_options(
        self, conf: float, iou: float, max_det: int, classes: Iterable[int] | None, agnostic: bool
    ) -> None:
        self.thresholds.copy_(torch.tensor([conf, iou], dtype=torch.float32))
        self.limits.copy_(torch.tensor([max_det, MAX_NMS, int(agnostic)], dtype=torch.int32))
        mask = torch.ones(self.meta.nc, dtype=torch.uint8)
        if classes is not None:
            mask.zero_()
            mask[list(classes)] = 1
        self.class_mask.copy_(mask)

    def detect(
        self, frames: list[Frame], conf: float, iou: float, max_det: int, classes: Iterable[int] | None, agnostic: bool
    ) -> list[torch.Tensor]:
        network, n = self.network, len(frames)
        bucket = network.bucket_for(n)
        images = network.input_view(bucket)
        params = []
        for slot, frame in enumerate(frames):
            box = Letterbox.fit(frame.shape, self.meta.imgsz)
            pixels = frame.pixels.to(network.device, non_blocking=True)
            preprocess_letterbox(images[slot], pixels, bgr=frame.bgr, params=box.kernel_params())
            params.append(box.box_params())
        self.box_params[:n].copy_(torch.tensor(params, dtype=torch.float32))
        self._set_options(conf, iou, max_det, classes, agnostic)
        network.execute(bucket)
        preds = network.value_view(self.output, bucket)[:n]
        rows, count = self.rows[:n], self.count[:n]
        class_mask = self.class_mask if classes is not None else None
        if self.end2end:
            select_rows(rows, count, preds, self.thresholds, self.limits, class_mask)
        else:
            non_max_suppression(
                rows, count, preds, nc=self.meta.nc, thresholds=self.thresholds, limits=self.limits,
                class_mask=class_mask, scratch=self.scratch,
            )  # fmt: skip
        scale_boxes(rows, count, self.box_params[:n])
        counts, found = count.cpu().tolist(), rows.cpu()
        return [found[i, : counts[i]] for i in range(n)]
