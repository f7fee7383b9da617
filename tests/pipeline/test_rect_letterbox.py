"""The rectangular letterbox: by default an engine letterboxes each image to its own rectangle of stride multiples,
as ultralytics' predict does, and runs the network derived for that shape from the one export.

- `rect_letterbox` is ultralytics' LetterBox(auto=True): the same input shape and the same placement of the image.
- Every task of v8, 11 and 26 (detect is in test_detect_matches_ultralytics) on the reference backend against plain
  `predict()` of each image alone, on the shipped photos of four aspect ratios and frames of 10:1 and 1:10: the same
  boxes, masks, keypoints and oriented boxes. imgsz 320 and the models calibrated there keep the CPU run short.
- The Triton path (interpreter on the CPU): a batch of several shapes, fewer networks kept than the batch has shapes,
  gives every image the result it gets alone and the reference's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import (
    calibrated_model,
    detection_pairs,
    extreme_frames,
    match_detections,
    match_rotated,
    real_photos,
)

import yolojet
from yolojet.engine.engine import Engine
from yolojet.geometry import rect_letterbox

IMGSZ = 320


def test_rect_letterbox_is_ultralytics_letterbox():
    """Input shape and placement of the image, from sizes of every aspect ratio (found by letterboxing a white
    image and locating it in the grey)."""
    from ultralytics.data.augment import LetterBox

    rng = np.random.default_rng(0)
    sizes = [(1080, 810), (720, 1280), (100, 1000), (1000, 100), (1, 1), (1, 2000), (333, 500), (640, 640)]
    sizes += [tuple(int(v) for v in rng.integers(1, 1500, 2)) for _ in range(150)]
    for imgsz in (320, 640, (480, 640)):
        square = (imgsz, imgsz) if isinstance(imgsz, int) else imgsz
        for h0, w0 in sizes:
            out = LetterBox(square, auto=True, stride=32)(image=np.full((h0, w0, 3), 255, np.uint8))
            target, placed = rect_letterbox((h0, w0), square, 32)
            assert target == out.shape[:2], (h0, w0, imgsz)
            rows, cols = np.nonzero(out[..., 0] > 200)
            assert (rows.min(), cols.min()) == (placed.pad_top, placed.pad_left), (h0, w0, imgsz)
            assert (rows.max() + 1 - rows.min(), cols.max() + 1 - cols.min()) == (placed.new_h, placed.new_w)


def photos() -> dict[str, np.ndarray]:
    shipped = real_photos()
    return {name: shipped[name] for name in ("bus.jpg", "zidane.jpg", "astronaut", "chelsea")} | extreme_frames()


def plain_predict(model, cfg: str, images: list[np.ndarray], end2end: bool | None, conf: float) -> list:
    """ultralytics' predict of each image alone (rect=True), on the host."""
    from copy import deepcopy

    from ultralytics import YOLO

    wrapper = YOLO(cfg, verbose=False)
    wrapper.model = deepcopy(model)  # predict fuses the model it is given in place
    wrapper.model.end2end = bool(end2end)
    nms = False if end2end else None
    return [wrapper.predict(image, imgsz=IMGSZ, conf=conf, verbose=False, nms=nms)[0].cpu() for image in images]


def mask_on_original(masks: torch.Tensor, shape: tuple[int, int]) -> np.ndarray:
    """ultralytics' input-sized masks over the original image, as it draws them."""
    from ultralytics.utils import ops

    return (ops.scale_masks(masks[None].float(), shape)[0] > 0.5).numpy()


def compared_instances(task: str, ours, theirs, label: str) -> int:
    """Assert one image's results equal predict's; returns how many instances were compared."""
    if task == "obb":
        problems = match_rotated(ours.obb.data, theirs.obb.data.numpy())
        assert not problems, f"{label}: {problems[:3]}"
        return len(theirs.obb)
    problems = match_detections(ours.boxes.data, theirs.boxes.data)
    assert not problems, f"{label}: {problems[:3]}"
    pairs = [j for j, _ in detection_pairs(ours.boxes.data, theirs.boxes.data)]
    if task == "segment" and pairs:
        expected = mask_on_original(theirs.masks.data, ours.orig_shape)
        # Random-weight mask logits are flat: a logit within rounding of 0 flips a prototype pixel (a quarter of the
        # input's) and what the upsampling spreads it over, so up to 3 prototype pixels' worth may differ.
        (h0, w0), (h, w) = ours.orig_shape, theirs.masks.data.shape[1:]
        proto_pixel = (4 / min(h / h0, w / w0)) ** 2
        for i, j in enumerate(pairs):
            a, b = ours.masks.data[j], expected[i]
            union = np.logical_or(a, b).sum()
            iou = np.logical_and(a, b).sum() / union if union else 1.0
            assert iou >= 0.99 or np.logical_xor(a, b).sum() <= 3 * proto_pixel, f"{label}: mask {i} IoU {iou:.4f}"
    if task == "pose" and pairs:
        gap = np.abs(ours.keypoints.data[pairs][..., :2] - theirs.keypoints.data.numpy()[..., :2]).max()
        assert gap <= 1.0, f"{label}: keypoints {gap:.3f} px apart"
    return len(theirs.boxes)


# conf 0.003 gives a few dozen instances on bus.jpg and its 10:1 squeeze (the other photos' emptiness is compared
# too); yolov8n-pose (1 class) scores on a plateau of near-equal candidates there, so it takes 0.02.
CASES = [
    ("yolov8n-seg.yaml", None, 0.003),
    ("yolo11n-seg.yaml", None, 0.003),
    ("yolo26n-seg.yaml", True, 0.003),
    ("yolov8n-pose.yaml", None, 0.02),
    ("yolo11n-pose.yaml", None, 0.003),
    ("yolo26n-pose.yaml", True, 0.003),
    ("yolov8n-obb.yaml", None, 0.003),
    ("yolo11n-obb.yaml", None, 0.003),
    ("yolo26n-obb.yaml", True, 0.003),
]


@pytest.mark.parametrize(("cfg", "end2end", "conf"), CASES)
def test_every_task_matches_plain_predict(cfg, end2end, conf, tmp_path):
    model = calibrated_model(cfg, IMGSZ)
    model_dir = yolojet.export(model, out=tmp_path / "m", imgsz=IMGSZ, end2end=end2end)
    images = photos()
    # Batch 1, as predict runs: CPU convolutions of other batch sizes round differently, and random-weight mask
    # logits are flat enough for that to flip whole prototype pixels.
    with Engine.load(model_dir, device="cpu", backend="reference", max_batch=1) as engine:
        ours = engine(list(images.values()), conf=conf)
    theirs = plain_predict(model, cfg, list(images.values()), end2end, conf)
    total = 0
    for name, mine, want in zip(images, ours, theirs, strict=True):
        assert mine.orig_shape == want.orig_shape
        total += compared_instances(engine.meta.task, mine, want, f"{cfg} on {name}")
    assert total >= 5, "the comparison needs detections to mean something"


def test_a_batch_of_shapes_gives_each_image_its_result_alone(tmp_path):
    """On our kernels (the interpreter at 128 on the CPU): bus.jpg (128x96), zidane.jpg (96x128), astronaut (the
    model's own 128x128) and a 10:1 frame (32x128) in one batch, with networks for two rectangles kept, so a network
    is dropped while its part of the batch is still to be read. Each image equals itself alone and the reference."""
    imgsz = 640 if torch.cuda.is_available() else 128
    conf = 0.005 if torch.cuda.is_available() else 0.0003
    model_dir = yolojet.export(calibrated_model("yolo11n.yaml", imgsz), out=tmp_path / "m", imgsz=imgsz)
    shipped = real_photos()
    images = [shipped["bus.jpg"], shipped["zidane.jpg"], shipped["astronaut"], extreme_frames()["wide 100x1000"]]
    engine = Engine.load(model_dir, backend="triton", half=False, max_batch=4, tune=False, max_shapes=2)
    truth = Engine.load(model_dir, device=engine.device, backend="reference", max_batch=4)
    try:
        together = engine(images, conf=conf)
        assert len(engine.shapes()) == 3  # the model's own and the two rectangles used last
        total = 0
        for image, result, want in zip(images, together, truth(images, conf=conf), strict=True):
            (alone,) = engine([image], conf=conf)
            assert result.orig_shape == image.shape[:2]
            assert not match_detections(result.boxes.data, alone.boxes.data, iou_min=0.999, conf_tol=1e-4, px_tol=0.01)
            assert not match_detections(result.boxes.data, want.boxes.data)
            total += len(want.boxes)
        assert total >= 5
    finally:
        engine.close()
        truth.close()


def test_the_rectangles_images_to_come_need_are_built_at_load(tmp_path):
    """`shapes_for`: the rectangles the files' headers call for (a JPEG's EXIF orientation turning it), the most
    common first, within max_shapes; unreadable files, the model's own square and URLs passed over. A file then runs
    on the network built for it. A local labeler builds its first files' rectangles so."""
    import io

    from PIL import Image

    model_dir = yolojet.export(calibrated_model("yolov8n.yaml", 64), out=tmp_path / "m", imgsz=64)
    rng = np.random.default_rng(3)

    def picture(h: int, w: int) -> Image.Image:
        return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))

    wide = [tmp_path / f"wide{i}.png" for i in range(2)]
    for path in wide:
        picture(40, 90).save(path)  # 40x90: the 32x64 rectangle
    turned = tmp_path / "turned.jpg"  # stored 40x90, EXIF orientation 6: upright 90x40, the 64x32 rectangle
    exif = Image.Exif()
    exif[0x0112] = 6
    out = io.BytesIO()
    picture(40, 90).save(out, format="JPEG", exif=exif.tobytes(), quality=95)
    turned.write_bytes(out.getvalue())
    square = tmp_path / "square.png"
    picture(70, 70).save(square)
    corrupt = tmp_path / "corrupt.jpg"
    corrupt.write_bytes(b"\xff\xd8 not a jpeg")
    sources = [turned, *wide, square, corrupt, tmp_path / "missing.jpg", tmp_path, "https://example.invalid/a.jpg"]
    engine = Engine.load(model_dir, backend="triton", half=False, tune=False, shapes_for=sources)
    try:
        assert engine.rectangles_for(sources) == [(32, 64), (64, 32)]
        assert engine.shapes() == [(64, 64), (32, 64), (64, 32)]
        (result,) = engine([turned])
        assert result.orig_shape == (90, 40)
        assert engine.shapes() == [(64, 64), (32, 64), (64, 32)]  # nothing new built: only the order of use
    finally:
        engine.close()
    from yolojet.client.local import LocalLabeler  # a labeler passes its first files on

    labeler = LocalLabeler(
        str(model_dir),
        2,
        {},
        first_images=[str(s) for s in sources],
        backend="triton",
        half=False,
        tune=False,
        max_shapes=1,
    )
    try:
        assert labeler.engine.shapes() == [(64, 64), (32, 64)]
    finally:
        labeler.close()


def test_shapes_are_built_at_load_and_kept_up_to_max_shapes(tmp_path):
    model_dir = yolojet.export(calibrated_model("yolov8n.yaml", 64), out=tmp_path / "m", imgsz=64)
    engine = Engine.load(model_dir, backend="triton", half=False, tune=False, shapes=[(32, 64), (64, 32)])
    try:
        assert engine.shapes() == [(64, 64), (32, 64), (64, 32)]
        assert engine.max_shapes == 4
        engine(np.zeros((100, 50, 3), np.uint8))  # a 2:1 portrait: the 64x32 network, now the most recent
        assert engine.shapes() == [(64, 64), (32, 64), (64, 32)]
        engine(np.zeros((40, 90, 3), np.uint8))
        assert engine.shapes() == [(64, 64), (64, 32), (32, 64)]
    finally:
        engine.close()
    square = Engine.load(model_dir, backend="triton", half=False, tune=False, rect=False)
    try:
        square(np.zeros((40, 90, 3), np.uint8))
        assert square.shapes() == [(64, 64)]
    finally:
        square.close()
    with pytest.raises(yolojet.YolojetError, match="max_shapes 0"):
        Engine.load(model_dir, backend="reference", max_shapes=0)
    with pytest.raises(yolojet.YolojetError, match="multiple of stride 32"):
        Engine.load(model_dir, backend="triton", half=False, tune=False, shapes=[(48, 64)])
