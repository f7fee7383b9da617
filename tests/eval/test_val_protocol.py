"""`yolojet val` scores the same as ultralytics' own validator on the same weights.

A dataset YAML built from the shipped photos (five aspect ratios) and bus.jpg squeezed to 10:1 and 1:10, as lossless
PNGs, labelled with ultralytics' predictions of the same weights (`Results.save_txt`: boxes, polygons, keypoints or
four-point boxes). ultralytics' validator runs with save_json=True, which writes every prediction it scores; both
prediction sets are scored by the same pycocotools (or, for OBB, ultralytics' OBB metric) against the same ground
truth, and must agree within 1e-4; so must the predictions themselves, one by one. batch 2 gives batches of several
shapes: the 10:1 frame with zidane.jpg (wide), the two 3:2 photos, the square and the 4:3 photo (one square shape),
and the 1:10 frame alone (tall). An end-to-end model is validated with nms=False: ultralytics' default (nms=None)
would run its one-to-many head through NMS instead.
"""

from __future__ import annotations

import json
from copy import deepcopy
from functools import partial

import cv2
import numpy as np
import pytest
import torch
from support import calibrated_model, extreme_frames, real_photos

import yolojet
from yolojet.eval.coco import evaluate, keypoint_sigmas
from yolojet.eval.datasets import load_dataset
from yolojet.eval.obb import evaluate_obb
from yolojet.eval.val import _obb_truth, category_map, validate_model

IMGSZ = 320
GT_CONF = 0.003  # random weights score low: this gives a few dozen labels


def wrapper(model, cfg: str, end2end: bool | None):
    from ultralytics import YOLO

    yolo = YOLO(cfg, verbose=False)
    yolo.model = deepcopy(model)  # predict and val fuse the model they are given in place
    if end2end is not None:
        yolo.model.end2end = end2end
    return yolo


def write_dataset(root, model, cfg: str, end2end: bool | None) -> int:
    """Images and YOLO labels from ultralytics' predictions; returns how many labels."""
    images, labels = root / "images" / "val", root / "labels" / "val"
    images.mkdir(parents=True)
    labels.mkdir(parents=True)
    photos = {**real_photos(), **extreme_frames()}
    count = 0
    for name, bgr in photos.items():
        stem = name.split(".")[0].replace(" ", "_")
        cv2.imwrite(str(images / f"{stem}.png"), bgr)
        nms = False if end2end else None
        result = wrapper(model, cfg, end2end).predict(bgr, imgsz=IMGSZ, conf=GT_CONF, verbose=False, nms=nms)[0]
        label = labels / f"{stem}.txt"
        result.save_txt(label)
        if label.exists():  # rounding can put a coordinate a hair outside the image, which ultralytics rejects
            rows = [np.array(line.split(), np.float64) for line in label.read_text().splitlines()]
            lines = [" ".join([str(int(r[0]))] + [f"{v:.6f}" for v in r[1:].clip(0, 1)]) for r in rows]
            label.write_text("\n".join(lines) + "\n")
        count += len(result)
    names = "\n".join(f"  {i}: {n}" for i, n in model.names.items())
    kpt = f"kpt_shape: {list(model.model[-1].kpt_shape)}\n" if "pose" in cfg else ""
    (root / "data.yaml").write_text(f"path: {root}\ntrain: images/val\nval: images/val\n{kpt}names:\n{names}\n")
    return count


def ultralytics_predictions(model, cfg: str, end2end: bool | None, root, monkeypatch) -> list[dict]:
    """What ultralytics' validator scored: its save_json predictions."""
    import ultralytics.models.yolo.segment.val as segment_val
    import ultralytics.utils.nms as ultralytics_nms

    monkeypatch.setattr(segment_val, "check_requirements", lambda *a, **k: True)  # would pip-install its COCO scorer
    # Its NMS gives up on a batch's remaining images after 2 s + 0.05 s an image, which a slow CPU reaches on
    # 30,000 rotated candidates; the time limit is not the protocol.
    unlimited = partial(ultralytics_nms.non_max_suppression, max_time_img=1e6)
    monkeypatch.setattr(ultralytics_nms, "non_max_suppression", unlimited)
    metrics = wrapper(model, cfg, end2end).val(
        data=str(root / "data.yaml"),
        imgsz=IMGSZ,
        batch=2,
        conf=0.001,
        iou=0.7,
        save_json=True,
        plots=False,
        nms=False if end2end else None,
        device="cpu",
        workers=0,
        project=str(root / "runs"),
        name="val",
        verbose=False,
    )
    return json.loads((metrics.save_dir / "predictions.json").read_text())


CASES = [
    ("yolov8n.yaml", None),
    ("yolo26n.yaml", True),
    ("yolo11n-seg.yaml", None),
    ("yolo11n-pose.yaml", None),
    ("yolo11n-obb.yaml", None),
]


@pytest.mark.parametrize(("cfg", "end2end"), CASES)
def test_val_scores_as_ultralytics_validator(cfg, end2end, tmp_path, monkeypatch):
    model = calibrated_model(cfg, IMGSZ)
    assert write_dataset(tmp_path, model, cfg, end2end) >= 10, "the comparison needs labels to mean something"
    model_dir = yolojet.export(model, out=tmp_path / "model", imgsz=IMGSZ, end2end=end2end)
    ours = validate_model(
        model_dir, tmp_path / "data.yaml", imgsz=IMGSZ, batch=2, device="cpu", backend="reference", progress=False
    )
    theirs = ultralytics_predictions(model, cfg, end2end, tmp_path, monkeypatch)
    assert theirs, "ultralytics' validator found nothing"

    dataset = load_dataset(tmp_path / "data.yaml")
    ids = {image.path.name: image.id for image in dataset.images}
    categories = category_map(model.names, dataset)
    for p in theirs:  # its ids: the file's stem, and class + 1 (not COCO); ours: by file name, the dataset's ids
        p["image_id"], p["category_id"] = ids[p["file_name"]], categories[p["category_id"] - 1]

    assert_same_predictions(ours.predictions, theirs, "obb" in cfg)
    if "obb" in cfg:
        found = {image.id: ([], [], []) for image in dataset.images}
        for p in theirs:
            for part, value in zip(found[p["image_id"]], (p["rbox"], p["score"], p["category_id"]), strict=True):
                part.append(value)
        found = {
            k: (np.array(b, np.float64).reshape(-1, 5), np.array(s, np.float64), np.array(c, np.int64))
            for k, (b, s, c) in found.items()
        }
        pairs = [(ours.scores, evaluate_obb(_obb_truth(dataset), found))]
    else:
        gt = dataset.ground_truth
        pairs = [(ours.scores, evaluate(gt, theirs))]
        if "seg" in cfg:
            pairs.append((ours.mask_scores, evaluate(gt, theirs, "segm")))
        if "pose" in cfg:
            pairs.append((ours.keypoint_scores, evaluate(gt, theirs, "keypoints", keypoint_sigmas(17))))
    for mine, expected in pairs:
        assert mine.map50_95 == pytest.approx(expected.map50_95, abs=1e-4)
        assert mine.map50 == pytest.approx(expected.map50, abs=1e-4)


def assert_same_predictions(ours: list[dict], theirs: list[dict], rotated: bool) -> None:
    """Every prediction of one set has one in the other: same image and category, score within 2e-4, box within
    0.1 px and keypoints within 0.25 px, mask IoU ≥ 0.99 for 99 % of the masks and ≥ 0.98 for every one (or two
    differing pixels, for small masks): the rounding of two fp32 networks (fused differently) of random weights,
    measured at up to 7e-5 and 0.01 px (keypoints, scaled by their own offsets, up to 0.2 px); random weights leave
    broad regions of mask logits near the threshold, where rounding flips pixels (on an AMD EPYC, 1 of 1,107 masks at
    IoU 0.9825, 15 of 857 pixels). A prediction may be missing from the other set only where the two networks
    may put it either side of a cut: scoring within 1e-4 of val's conf 0.001, within 2e-4 of the lowest score of an
    image the other set filled to max_det (300), or overlapping a higher-scoring box of its class there by an IoU
    (probiou for rotated boxes) within 3e-4 of val's iou 0.7 (a rotated box 1.2e-4 from it, 0.69988, was suppressed by
    one network and not the other on an Intel host: probiou of boxes a rounding apart moves by that much)."""
    from pycocotools import mask as coco_mask
    from torchvision.ops import box_convert, box_iou
    from ultralytics.utils.metrics import batch_probiou

    def key(p):
        return p["image_id"], p["category_id"]

    groups: dict = {}
    for side, found in (("ours", ours), ("theirs", theirs)):
        for p in found:
            groups.setdefault(key(p), {"ours": [], "theirs": []})[side].append(p)
    box = "rbox" if rotated else "bbox"
    lowest: dict = {"ours": {}, "theirs": {}}  # image -> its lowest score, for images holding max_det predictions
    for side, found in (("ours", ours), ("theirs", theirs)):
        for image in {p["image_id"] for p in found}:
            scores = [p["score"] for p in found if p["image_id"] == image]
            if len(scores) >= 300:
                lowest[side][image] = min(scores)

    def overlap(p: dict, others: list[dict]) -> float:
        if not others:
            return 0.0
        a, b = torch.tensor([p[box]], dtype=torch.float64), torch.tensor([o[box] for o in others], dtype=torch.float64)
        if rotated:
            return float(batch_probiou(a, b).max())
        return float(box_iou(box_convert(a, "xywh", "xyxy"), box_convert(b, "xywh", "xyxy")).max())

    def at_a_cut(p: dict, other_side: str) -> bool:
        if p["score"] <= 0.0011 or p["score"] <= lowest[other_side].get(p["image_id"], -1.0) + 2e-4:
            return True
        higher = [o for o in groups[key(p)][other_side] if o["score"] > p["score"]]
        return abs(overlap(p, higher) - 0.7) <= 3e-4

    def nearest(p: dict, others: list[dict]) -> str:
        """The other set's prediction of the same image and class that overlaps p most: what a failure shows."""
        if not others:
            return "none of its image and class"
        best = max(others, key=lambda o: overlap(p, [o]))
        return f"the nearest {best} overlaps it by {overlap(p, [best]):.5f}"

    matched, close_masks = 0, []
    for where, group in groups.items():
        left = sorted(group["theirs"], key=lambda p: -p["score"])
        for mine in sorted(group["ours"], key=lambda p: -p["score"]):
            close = [
                p
                for p in left
                if abs(p["score"] - mine["score"]) <= 2e-4 and np.abs(np.subtract(p[box], mine[box])).max() <= 0.1
            ]
            if not close:
                assert at_a_cut(mine, "theirs"), (
                    f"{where}: ours {mine} has no match in ultralytics' predictions; {nearest(mine, group['theirs'])}"
                )
                continue
            other = min(close, key=lambda p: np.abs(np.subtract(p[box], mine[box])).max())
            left.remove(other)
            matched += 1
            if "segmentation" in mine:
                a, b = coco_mask.decode(mine["segmentation"]), coco_mask.decode(other["segmentation"])
                union = np.logical_or(a, b).sum()
                iou = np.logical_and(a, b).sum() / union if union else 1.0
                differ = np.logical_xor(a, b).sum()
                close_masks.append(bool(iou >= 0.99 or differ <= 2))
                assert iou >= 0.98 or differ <= 2, f"{where}: mask IoU {iou:.4f}"
            if "keypoints" in mine:
                gap = np.abs(np.subtract(mine["keypoints"], other["keypoints"])).max()
                assert gap <= 0.25, f"{where}: keypoints {gap:.3f} apart"
        unmatched = [p for p in left if not at_a_cut(p, "ours")]
        assert not unmatched, (
            f"{where}: ultralytics' {unmatched[0]} has no match in ours; {nearest(unmatched[0], group['ours'])}"
        )
    assert matched >= 0.99 * len(theirs) and matched >= 20, (matched, len(theirs))
    assert sum(close_masks) >= 0.99 * len(close_masks), f"{len(close_masks) - sum(close_masks)} masks at IoU < 0.99"
