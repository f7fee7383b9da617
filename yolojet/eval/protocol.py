"""ultralytics' validation protocol (`yolo val`), so that the same weights score the same through both.

What its validators do, step by step, reproduced on an engine's raw outputs:
- batches: the dataset's images sorted by aspect ratio (height / width) and cut into batches; each batch has one
  input shape, the smallest that holds its widest or tallest image at imgsz, plus half a stride, in stride
  multiples (`BaseDataset.set_rectangle`, pad 0.5): 640 images of 4:3 photos run at 512x672;
- each image read with OpenCV, its long side resized to imgsz (`load_image`: sides rounded up, bilinear), then
  placed in the batch's shape, centred, grey 114 around it (`LetterBox(auto=False, scaleup=False)`);
- the network of that shape (`Engine.raw`: on our kernels where the engine runs them);
- NMS with every class over conf per box (`multi_label=True`), or the one-to-one rows of an end-to-end head;
  boxes, keypoints and oriented boxes mapped back with the batch's ratio and padding (`scale_boxes(ratio_pad=)`);
  masks assembled at the input size (`process_mask_native`), cropped to the image and resized to the original
  size, a pixel kept where the resized mask is whole (`scale_masks(...).byte()`, as its COCO JSON is written).

The engine's predict path (`Engine.__call__`) differs by design: it letterboxes each image to its own rectangle
and keeps one label per box, as ultralytics' predict does. `yolojet val --protocol predict` scores that instead.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from yolojet.errors import ImageReadError
from yolojet.eval.datasets import EvalImage, wrong_size
from yolojet.geometry import Letterbox
from yolojet.reference.pipeline import non_max_suppression, scale_boxes, select_end2end
from yolojet.tasks import Boxes, Results

RECT_PAD = 0.5  # ultralytics' validation datasets pad each batch shape by half a stride
GREY = 114


@dataclass
class ValBatch:
    images: list[EvalImage]
    shape: tuple[int, int]  # (height, width) every image of the batch is letterboxed to


def rect_batches(images: Sequence[EvalImage], batch: int, imgsz: int, stride: int) -> list[ValBatch]:
    """The validator's batches: images by aspect ratio, one input shape a batch (`set_rectangle`)."""
    ratios = np.array([image.height / image.width for image in images])
    order = ratios.argsort()
    ratios = ratios[order]
    batches = []
    for start in range(0, len(images), batch):
        low, high = ratios[start : start + batch].min(), ratios[start : start + batch].max()
        scale = [high, 1] if high < 1 else [1, 1 / low] if low > 1 else [1, 1]
        h, w = (np.ceil(np.array(scale) * imgsz / stride + RECT_PAD).astype(int) * stride).tolist()
        batches.append(ValBatch([images[i] for i in order[start : start + batch]], (int(h), int(w))))
    return batches


def read_bgr(image: EvalImage) -> np.ndarray:
    """The image as OpenCV reads it (BGR, EXIF orientation applied), as ultralytics' `imread`."""
    import cv2

    try:
        encoded = np.fromfile(image.path, np.uint8)
    except OSError as e:
        raise ImageReadError(f"{image.path}: {e.strerror or e}") from e
    pixels = cv2.imdecode(encoded, cv2.IMREAD_COLOR) if encoded.size else None
    if pixels is None:
        raise ImageReadError(f"{image.path}: OpenCV cannot decode it as an image")
    return pixels


def letterboxed(bgr: np.ndarray, imgsz: int, shape: tuple[int, int]) -> tuple[np.ndarray, Letterbox]:
    """`load_image` (long side to imgsz) then `LetterBox(shape, auto=False, scaleup=False)`: the (H, W, 3) BGR input
    and where the image lies in it (its gains map boxes back as the validator's ratio_pad)."""
    import cv2

    h0, w0 = bgr.shape[:2]
    r = imgsz / max(h0, w0)
    if r != 1:
        size = (min(math.ceil(w0 * r), imgsz), min(math.ceil(h0 * r), imgsz))
        bgr = cv2.resize(bgr, size, interpolation=cv2.INTER_LINEAR)
    h, w = bgr.shape[:2]
    fit = min(shape[0] / h, shape[1] / w, 1.0)
    new_w, new_h = max(round(w * fit), 1), max(round(h * fit), 1)
    if (new_w, new_h) != (w, h):
        bgr = cv2.resize(bgr, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    dh, dw = (shape[0] - new_h) / 2, (shape[1] - new_w) / 2
    top, bottom, left, right = round(dh - 0.1), round(dh + 0.1), round(dw - 0.1), round(dw + 0.1)
    padded = cv2.copyMakeBorder(bgr, top, bottom, left, right, cv2.BORDER_CONSTANT, value=(GREY,) * 3)
    return padded, Letterbox(h0, w0, new_h, new_w, top, left)


def val_masks(proto: torch.Tensor, rows: torch.Tensor, input_hw: tuple[int, int], box: Letterbox) -> np.ndarray:
    """(k, h0, w0) bool masks of one image's rows (boxes still in input pixels, coefficients after the sixth column),
    as the segment validator writes them to COCO JSON: `process_mask_native` at the input size, then `scale_masks`
    with the batch's ratio and padding, truncated to uint8 (only pixels the resize leaves at exactly 1)."""
    from yolojet.reference.segment import masks_native

    keep, kept = masks_native(proto, rows[:, 6:], rows[:, :4], input_hw)
    masks = torch.zeros((len(rows), *input_hw), dtype=torch.uint8, device=proto.device)
    masks[keep] = kept.to(torch.uint8)  # the validator keeps empty masks, which predict drops
    if input_hw == (box.orig_h, box.orig_w) or len(masks) == 0:
        return masks.bool().cpu().numpy().reshape(len(rows), box.orig_h, box.orig_w)
    content = masks[None, :, box.pad_top : box.pad_top + box.new_h, box.pad_left : box.pad_left + box.new_w]
    return F.interpolate(content.float(), (box.orig_h, box.orig_w), mode="bilinear")[0].byte().bool().cpu().numpy()


def _postprocess(
    engine: Any, raw: Any, boxes: list[Letterbox], input_hw: tuple[int, int], conf: float, iou: float, max_det: int
) -> list[dict[str, Any]]:
    """Each image's results from a batch's raw outputs, as the task's validator finds them."""
    meta = engine.meta
    task = meta.task
    if task == "obb":
        from yolojet.reference.obb import obb_postprocess

        rows = obb_postprocess(
            raw, boxes, nc=meta.nc, conf=conf, iou=iou, max_det=max_det, end2end=meta.end2end, multi_label=True
        )
        return [{"obb": r.cpu().numpy()} for r in rows]
    if task == "pose":
        from yolojet.reference.pose import pose_postprocess

        found = pose_postprocess(
            raw,
            boxes,
            nc=meta.nc,
            kpt_shape=meta.kpt_shape,
            conf=conf,
            iou=iou,
            max_det=max_det,
            end2end=meta.end2end,
            multi_label=True,
        )
        return [{"boxes": r.cpu().numpy(), "keypoints": k.cpu().numpy()} for r, k in found]
    preds, proto = (raw[0], raw[1]) if task == "segment" else (raw if isinstance(raw, torch.Tensor) else raw[0], None)
    if meta.end2end:
        kept = select_end2end(preds, conf, max_det)
    else:
        kept = non_max_suppression(preds, meta.nc, conf, iou, max_det, multi_label=True)
    out = []
    for i, (image_rows, box) in enumerate(zip(kept, boxes, strict=True)):
        image_rows = image_rows.float()
        outputs: dict[str, Any] = {}
        if proto is not None:
            outputs["masks"] = val_masks(proto[i], image_rows, input_hw, box)
        outputs["boxes"] = scale_boxes(image_rows[:, :6].clone(), box).cpu().numpy()
        out.append(outputs)
    return out


def _results(names: dict[int, str], image: EvalImage, found: dict[str, Any]) -> Results:
    shape = (image.height, image.width)
    parts: dict[str, Any] = {}
    if "boxes" in found:
        parts["boxes"] = Boxes(found["boxes"].astype(np.float32), shape)
    if "masks" in found:
        from yolojet.tasks.segment import Masks

        parts["masks"] = Masks(found["masks"])
    if "keypoints" in found:
        from yolojet.tasks.pose import Keypoints

        parts["keypoints"] = Keypoints(found["keypoints"].astype(np.float32), shape)
    if "obb" in found:
        from yolojet.tasks.obb import OBB

        parts["obb"] = OBB(found["obb"].astype(np.float32), shape)
    return Results(names=names, orig_shape=shape, path=str(image.path), **parts)


def validation_results(
    engine: Any, images: Sequence[EvalImage], batch: int, conf: float, iou: float, max_det: int
) -> Iterator[tuple[EvalImage, Results]]:
    """(image, Results) for every image, batch by batch as ultralytics' validator runs them (in its order, by aspect
    ratio); an image that cannot be read is a `Results` with its error, and the rest of its batch still runs."""
    imgsz = max(engine.meta.imgsz)
    stride = max(max(engine.meta.strides or [32]), 32)  # the validator's grid: at least 32
    with ThreadPoolExecutor(4, thread_name_prefix="yolojet-val-read") as pool:  # OpenCV releases the GIL

        def prepared(group: ValBatch) -> list[tuple[np.ndarray, Letterbox] | ImageReadError]:
            def one(image: EvalImage) -> tuple[np.ndarray, Letterbox] | ImageReadError:
                try:
                    bgr = read_bgr(image)
                except ImageReadError as e:
                    return e
                if bgr.shape[:2] != (image.height, image.width):
                    raise wrong_size(image, *bgr.shape[:2])
                return letterboxed(bgr, imgsz, group.shape)

            return list(pool.map(one, group.images))

        batches = rect_batches(images, batch, imgsz, stride)
        ahead = pool.submit(prepared, batches[0]) if batches else None
        for k, group in enumerate(batches):
            assert ahead is not None
            items = ahead.result()
            ahead = pool.submit(prepared, batches[k + 1]) if k + 1 < len(batches) else None  # read while it runs
            ok = [i for i, item in enumerate(items) if not isinstance(item, ImageReadError)]
            found: dict[int, dict[str, Any]] = {}
            if ok:
                pixels = np.stack([items[i][0] for i in ok])  # type: ignore[index]
                x = torch.from_numpy(pixels).to(engine.device).flip(-1).permute(0, 3, 1, 2).float() / 255
                placed = [items[i][1] for i in ok]  # type: ignore[index]
                outputs = _postprocess(engine, engine.raw(x), placed, group.shape, conf, iou, max_det)
                found = dict(zip(ok, outputs, strict=True))
            for i, image in enumerate(group.images):
                item = items[i]
                if isinstance(item, ImageReadError):
                    yield image, Results(names=engine.names, path=str(image.path), error=str(item))
                else:
                    yield image, _results(engine.names, image, found[i])
