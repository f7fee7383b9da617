"""Segment post-processing: boxes and instance masks as ultralytics' SegmentationPredictor gives them; RLE and polygons.

Models have random weights with BatchNorm statistics measured on the shipped photos (`support.calibrated_model`),
exported and run on the float32 reference executor; its raw outputs go through `segment_postprocess`.

- Against ultralytics predict (rect=False, the same conf): same count, boxes matched by `match_detections`, and
  every ultralytics instance's mask has IoU ≥ 0.99 with its match's (or differs by at most 2 pixels: the two
  networks differ by float rounding, which can flip a pixel whose logit is ~0, and one pixel of a 57-pixel mask is
  already IoU 0.98). ultralytics keeps retina_masks=False masks at the input size; they are taken to the original
  image with its own `scale_masks(...) > 0.5` (what it draws).
- Against ultralytics' own postprocess run on *our* raw outputs: the same rows and bit-identical masks, which
  isolates the mask arithmetic from the (tiny) numeric differences between the two networks.
- RLE strings against pycocotools, polygons against OpenCV's findContours and by filling them.

conf: 0.01 for yolov8n-seg and yolo11n-seg, 0.05 for yolo26n-seg (it scores higher), which gives a few to a few dozen
instances per photo. Photos: bus.jpg (downscaled, padded left and right), astronaut (upscaled, no padding) and two
crops of bus.jpg that need no resize, padded by 4 and 7 pixels: for retina masks ultralytics upsamples the prototypes
by 2 and 4 for those (by 1 for bus.jpg), so all three of its paths are exercised. (The crops are taken at 640 rows so
that no resize is needed: torch_pipeline.letterbox is one grey level off cv2 in a few columns at some scales.)
"""

from __future__ import annotations

from copy import deepcopy

import numpy as np
import pytest
import torch
from support import calibrated_model, match_detections, real_photos

import yolojet
from yolojet.errors import EngineConfigError
from yolojet.images import load_frame
from yolojet.reference import pipeline as torch_pipeline
from yolojet.reference.segment import segment_postprocess
from yolojet.tasks.segment import Masks, decode_rle, encode_rle, external_contours, rle_area, rle_contours

CASES = [("yolov8n-seg.yaml", None), ("yolo11n-seg.yaml", None), ("yolo26n-seg.yaml", None), ("yolo26n-seg.yaml", True)]
CONF = {"yolov8n-seg.yaml": 0.01, "yolo11n-seg.yaml": 0.01, "yolo26n-seg.yaml": 0.05}
IMGSZ = 640


def photos() -> dict[str, np.ndarray]:
    shipped = real_photos()
    bus = shipped["bus.jpg"]
    return {
        "bus.jpg": bus,
        "astronaut": shipped["astronaut"],
        "bus 640x636": np.ascontiguousarray(bus[:640, :636]),  # padding 4: retina upsampling ×2
        "bus 640x633": np.ascontiguousarray(bus[:640, :633]),  # padding 7: retina upsampling ×4
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(model, x, boxes, preds, proto) of one case: the reference executor's raw outputs on the letterboxed photos."""
    _RUNS: dict = {}

    def get(cfg: str, end2end: bool | None):
        key = (cfg, end2end)
        if key not in _RUNS:
            model = calibrated_model(cfg, IMGSZ)
            out = tmp_path_factory.mktemp("seg") / "model"
            model_dir = yolojet.export(model, out=out, imgsz=IMGSZ, end2end=end2end)
            inputs = [torch_pipeline.letterbox(load_frame(image), (IMGSZ, IMGSZ)) for image in photos().values()]
            x = torch.stack([t for t, _ in inputs])
            with torch.no_grad():
                preds, proto = yolojet.load_reference(model_dir)(x)
            _RUNS[key] = (model, x, [box for _, box in inputs], preds, proto)
        return _RUNS[key]

    return get


def postprocess(preds, proto, boxes, cfg, end2end, retina_masks=False, **options):
    options = {"conf": CONF[cfg], "iou": 0.7, "max_det": 300, **options}
    return segment_postprocess(
        preds, proto, boxes, (IMGSZ, IMGSZ), nc=80, end2end=bool(end2end), retina_masks=retina_masks, **options
    )


def to_original(masks: torch.Tensor, shape: tuple[int, int], retina_masks: bool) -> torch.Tensor:
    """ultralytics' masks over the original image: retina masks already are; input-sized ones as it draws them."""
    from ultralytics.utils import ops

    if retina_masks or len(masks) == 0:
        return masks.bool().reshape(len(masks), *shape)
    return ops.scale_masks(masks[None].float(), shape)[0] > 0.5


def ultralytics_results(model, cfg, images, end2end, retina_masks):
    from ultralytics import YOLO

    wrapper = YOLO(cfg, verbose=False)
    wrapper.model = deepcopy(model)  # predict fuses the model it is given in place
    wrapper.model.end2end = bool(end2end)
    nms = False if end2end else None
    results = wrapper.predict(
        images,
        imgsz=IMGSZ,
        conf=CONF[cfg],
        verbose=False,
        nms=nms,
        rect=False,
        retina_masks=retina_masks,
        batch=len(images),
    )
    results = [r.cpu() for r in results]  # predict leaves them on its device
    found = []
    for image, r in zip(images, results, strict=True):
        rows = torch.cat([r.boxes.xyxy, r.boxes.conf[:, None], r.boxes.cls[:, None]], 1)
        masks = r.masks.data if r.masks is not None else torch.zeros((0, *image.shape[:2]))
        found.append((rows, to_original(masks, image.shape[:2], retina_masks)))
    return found


def mask_iou(a: torch.Tensor, b: torch.Tensor) -> float:
    union = int((a | b).sum())
    return int((a & b).sum()) / union if union else 1.0


def paired_masks(ours, theirs) -> list[tuple[float, int]]:
    """Per ultralytics instance, (mask IoU, pixels that differ) with its match: same class, box IoU ≥ 0.99,
    |Δconf| ≤ 0.01 (the criteria of match_detections), the best mask among such candidates, each of ours used once."""
    from torchvision.ops import box_iou

    (rows, masks), (their_rows, their_masks) = ours, theirs
    if len(rows) == 0 or len(their_rows) == 0:
        return []
    iou = box_iou(their_rows[:, :4], rows[:, :4])
    same_class = their_rows[:, 5:6] == rows[:, 5][None]
    ok = (iou >= 0.99) & same_class & ((their_rows[:, 4:5] - rows[:, 4][None]).abs() <= 0.01)
    used: set[int] = set()
    pairs = []
    for i in range(len(their_rows)):
        options = {j: mask_iou(their_masks[i], masks[j]) for j in ok[i].nonzero().flatten().tolist() if j not in used}
        best = max(options, key=options.get, default=None)
        if best is None:
            pairs.append((0.0, int(their_masks[i].sum())))
            continue
        used.add(best)
        pairs.append((options[best], int((their_masks[i] ^ masks[best]).sum())))
    return pairs


def assert_matches_predict(run, cfg, end2end, retina_masks):
    model, _, boxes, preds, proto = run(cfg, end2end)
    images = list(photos().values())
    ours = postprocess(preds, proto, boxes, cfg, end2end, retina_masks)
    theirs = ultralytics_results(model, cfg, images, end2end, retina_masks)
    total = 0
    for name, image, (rows, masks), expected in zip(photos(), images, ours, theirs, strict=True):
        assert rows.shape[1] == 6 and rows.dtype == torch.float32
        assert masks.dtype == torch.bool and masks.shape == (len(rows), *image.shape[:2])
        problems = match_detections(rows, expected[0])
        assert not problems, f"{cfg} on {name}: {problems[:3]}"
        pairs = paired_masks((rows, masks), expected)
        bad = [(iou, diff) for iou, diff in pairs if iou < 0.99 and diff > 2]
        assert not bad, f"{cfg} on {name}: (mask IoU, differing pixels) {sorted(bad)[:3]}"
        total += len(pairs)
    assert total >= 10, "the comparison needs instances to mean something"


@pytest.mark.parametrize(("cfg", "end2end"), CASES)
def test_matches_ultralytics_predict(run, cfg, end2end):
    assert_matches_predict(run, cfg, end2end, retina_masks=False)


def test_retina_masks_match_ultralytics_predict(run):
    assert_matches_predict(run, "yolov8n-seg.yaml", None, retina_masks=True)


@pytest.mark.parametrize(("cfg", "end2end"), CASES)
@pytest.mark.parametrize("retina_masks", [False, True])
def test_same_outputs_give_ultralytics_masks_exactly(run, cfg, end2end, retina_masks):
    """ultralytics' SegmentationPredictor.postprocess on our raw outputs: same rows, the very same mask pixels."""
    from types import SimpleNamespace

    from ultralytics.models.yolo.segment import SegmentationPredictor

    _, x, boxes, preds, proto = run(cfg, end2end)
    images = list(photos().values())
    predictor = SegmentationPredictor(overrides={"conf": CONF[cfg], "retina_masks": retina_masks, "verbose": False})
    predictor.model = SimpleNamespace(names={i: str(i) for i in range(80)}, end2end=bool(end2end))
    predictor.batch = [list(photos())]
    expected = predictor.postprocess((preds.clone(), proto.clone()), x, images)
    ours = postprocess(preds, proto, boxes, cfg, end2end, retina_masks)
    total = 0
    for name, image, (rows, masks), r in zip(photos(), images, ours, expected, strict=True):
        their_masks = r.masks.data if r.masks is not None else torch.zeros((0, *image.shape[:2]))
        assert len(rows) == len(r.boxes), f"{name}: {len(rows)} instances, ultralytics has {len(r.boxes)}"
        torch.testing.assert_close(rows, r.boxes.data, rtol=0, atol=1e-4, msg=f"{name}: rows differ")
        assert torch.equal(masks, to_original(their_masks, image.shape[:2], retina_masks)), f"{name}: masks differ"
        total += len(rows)
    assert total >= 10


def test_filters_and_empty_results(run):
    cfg, end2end = "yolo26n-seg.yaml", None
    _, _, boxes, preds, proto = run(cfg, end2end)
    everything = postprocess(preds, proto, boxes, cfg, end2end)
    picked = postprocess(preds, proto, boxes, cfg, end2end, classes=[3, 17])
    for (rows, masks), (all_rows, _) in zip(picked, everything, strict=True):
        assert set(rows[:, 5].long().tolist()) <= {3, 17}
        assert len(rows) == len(masks) <= len(all_rows)
    for rows, masks in postprocess(preds, proto, boxes, cfg, end2end, max_det=2):
        assert len(rows) == len(masks) <= 2
    for (rows, masks), box in zip(postprocess(preds, proto, boxes, cfg, end2end, conf=1.0), boxes, strict=True):
        assert rows.shape == (0, 6) and masks.shape == (0, box.orig_h, box.orig_w) and masks.dtype == torch.bool


@pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")  # inside pycocotools on numpy 2
def test_rle_round_trips_through_pycocotools(run):
    from pycocotools import mask as coco

    _, _, boxes, preds, proto = run("yolov8n-seg.yaml", None)
    count = 0
    for _, masks in postprocess(preds, proto, boxes, "yolov8n-seg.yaml", None):
        data = masks.numpy()
        for rle, mask in zip(Masks(data).to_rle(), data, strict=True):
            expected = coco.encode(np.asfortranarray(mask.astype(np.uint8)))
            assert rle == {"size": [int(s) for s in expected["size"]], "counts": expected["counts"].decode()}
            assert np.array_equal(coco.decode(rle).astype(bool), mask)
            count += 1
    assert count >= 10
    rng = np.random.default_rng(0)
    for shape, p in [((1, 1), 0.5), ((7, 5), 0.5), ((40, 33), 0.9), ((64, 48), 0.1), ((3, 300), 1.0), ((30, 20), 0.0)]:
        mask = rng.random(shape) < p
        rle = encode_rle(mask)
        expected = coco.encode(np.asfortranarray(mask.astype(np.uint8)))
        assert rle["counts"] == expected["counts"].decode()
        assert np.array_equal(coco.decode(rle).astype(bool), mask)
        assert np.array_equal(decode_rle(expected), mask) and rle_area(rle) == int(coco.area(expected))


def fill(polygons: list[np.ndarray], shape: tuple[int, int]) -> np.ndarray:
    import cv2

    canvas = np.zeros(shape, np.uint8)
    for polygon in polygons:
        cv2.fillPoly(canvas, [np.round(polygon).astype(np.int32).reshape(-1, 1, 2)], 1)
    return canvas.astype(bool)


def test_polygons_are_ultralytics_merged_contours(run):
    """Masks.xy is ultralytics' masks2segments (its default strategy "all": every outer contour of OpenCV's
    findContours, RETR_EXTERNAL, CHAIN_APPROX_SIMPLE, joined into one polygon) point for point; filled, the
    polygons give back the masks.

    Random-weight masks come in hundreds of fragments with holes, so "the largest contour, filled, is most of the mask"
    is checked on seeded instance-like shapes (unions of rotated ellipses); on the model's masks, every polygon point
    must be a mask pixel, and filling *all* the outer contours (`external_contours`) must cover every mask pixel.
    """
    import cv2
    from ultralytics.utils.ops import masks2segments

    _, _, boxes, preds, proto = run("yolo11n-seg.yaml", None)
    checked = 0
    for _, masks in postprocess(preds, proto, boxes, "yolo11n-seg.yaml", None):
        result = Masks(masks.numpy())
        assert len(result) == len(masks) and len(result.xy) == len(masks)
        expected = masks2segments(masks) if len(masks) else []
        for mask, ours, theirs in zip(result.data, result.xy, expected, strict=True):
            assert ours.dtype == np.float32 and np.array_equal(ours, theirs)
            x, y = ours.astype(np.int64).T
            assert mask[y, x].all(), "a polygon point off the mask"
            covered = fill(external_contours(mask), mask.shape)
            assert not (mask & ~covered).any(), "a mask pixel lies outside every outer contour"
            checked += 1
    assert checked >= 20

    rng = np.random.default_rng(2)
    yy, xx = np.mgrid[:240, :320]
    fill_ious = []
    for _ in range(30):
        mask = np.zeros((240, 320), bool)
        cx, cy = rng.uniform(100, 220), rng.uniform(80, 160)
        for _ in range(int(rng.integers(1, 4))):  # ellipses, each centred in the last: one instance-like blob
            a, b, t = rng.uniform(10, 60), rng.uniform(10, 60), rng.uniform(0, np.pi)
            u, v = (xx - cx) * np.cos(t) + (yy - cy) * np.sin(t), -(xx - cx) * np.sin(t) + (yy - cy) * np.cos(t)
            mask |= (u / a) ** 2 + (v / b) ** 2 <= 1
            cx, cy = cx + 0.8 * a * np.cos(t), cy + 0.8 * a * np.sin(t)
        if mask.sum() >= 300:
            filled = fill(Masks(mask).xy, mask.shape)
            fill_ious.append(mask_iou(torch.from_numpy(filled), torch.from_numpy(mask)))
    assert len(fill_ious) >= 20 and min(fill_ious) >= 0.9, sorted(fill_ious)[:3]

    rng = np.random.default_rng(1)  # noise: holes, islands inside holes, single pixels, masks touching the border
    for _ in range(300):
        h, w = (int(v) for v in rng.integers(1, 40, 2))
        mask = (rng.random((h, w)) < rng.uniform(0.1, 0.9)).astype(np.uint8)
        expected = cv2.findContours(mask, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)[0]
        ours, from_rle = external_contours(mask), rle_contours(encode_rle(mask))
        assert len(ours) == len(expected) == len(from_rle) and all(
            np.array_equal(a, b.reshape(-1, 2)) and np.array_equal(c, b.reshape(-1, 2))
            for a, b, c in zip(ours, expected, from_rle, strict=True)
        )
        assert np.array_equal(Masks(mask).xy[0], masks2segments(mask[None])[0])
    assert Masks(np.zeros((2, 5, 6), bool)).xy[1].shape == (0, 2)


def test_errors():
    g = torch.Generator().manual_seed(0)
    preds, proto = torch.rand(2, 4 + 80 + 32, 50, generator=g), torch.rand(1, 32, 160, 160, generator=g)
    boxes = [torch_pipeline.Letterbox.fit((480, 640), (640, 640))] * 2
    with pytest.raises(ValueError, match="batch sizes 2 and 1"):
        segment_postprocess(preds, proto, boxes, (640, 640), nc=80, conf=0.25, iou=0.7, max_det=300)
    proto = torch.rand(2, 32, 160, 160, generator=g)
    with pytest.raises(EngineConfigError, match="channels"):
        segment_postprocess(preds, proto, boxes, (640, 640), nc=79, conf=0.25, iou=0.7, max_det=300)
    with pytest.raises(ValueError, match="6 \\+ 32"):
        segment_postprocess(preds, proto, boxes, (640, 640), nc=80, conf=0.25, iou=0.7, max_det=300, end2end=True)
    with pytest.raises(ValueError, match="quarter"):
        segment_postprocess(preds, proto, boxes, (320, 320), nc=80, conf=0.25, iou=0.7, max_det=300)
    with pytest.raises(ValueError, match="letterboxes"):
        segment_postprocess(preds, proto, boxes[:1], 640, nc=80, conf=0.25, iou=0.7, max_det=300)
    with pytest.raises(ValueError, match="Masks data"):
        Masks(np.zeros((2, 3, 4, 5), bool))
