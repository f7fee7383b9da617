"""Mask mAP for segment models and keypoint mAP (OKS) for pose models, on datasets built from the shipped photos
whose ground truth is ultralytics' own predictions with the same weights (masks at the original size, as predict
draws them; keypoints in original pixels). yolojet, scoring its own predictions of the same objects (its predict
path, square as the ground truth's), must reach ≥ 0.99 on boxes, masks and keypoints; the same ground truth written
as YOLO labels under a dataset YAML (polygons, box + keypoints) converts back to the same annotations."""

from __future__ import annotations

import json
import shutil

import cv2
import numpy as np
import pytest
from support import calibrated_model, real_photos

import yolojet
from yolojet.engine.engine import Engine
from yolojet.errors import DatasetError
from yolojet.eval.datasets import load_dataset
from yolojet.eval.val import validate

IMGSZ = 640
GT_CONF = 0.005  # random weights score low; as in test_val


def ultralytics_predictions(model, cfg: str, images: list[np.ndarray]) -> list:
    from copy import deepcopy

    from ultralytics import YOLO

    wrapper = YOLO(cfg, verbose=False)
    wrapper.model = deepcopy(model)
    return wrapper.predict(images, imgsz=IMGSZ, conf=GT_CONF, verbose=False, rect=False)


def write_dataset(root, model, cfg: str) -> dict:
    """Photos as PNGs and ultralytics' predictions as a COCO instances file with masks or keypoints."""
    from pycocotools import mask as mask_utils
    from ultralytics.utils.ops import scale_masks

    (root / "images").mkdir()
    photos = real_photos()
    results = ultralytics_predictions(model, cfg, list(photos.values()))
    images, annotations = [], []
    for image_id, ((name, bgr), result) in enumerate(zip(photos.items(), results, strict=True), 1):
        file = f"images/{name.split('.')[0]}.png"
        cv2.imwrite(str(root / file), bgr)
        h, w = bgr.shape[:2]
        images.append({"id": image_id, "file_name": file, "width": w, "height": h})
        boxes = result.boxes.xyxy.cpu().numpy()
        masks = None
        if result.masks is not None:
            masks = scale_masks(result.masks.data[None].float().cpu(), (h, w))[0].numpy() > 0.5
        for i, (x1, y1, x2, y2) in enumerate(boxes.tolist()):
            box = [x1, y1, x2 - x1, y2 - y1]
            annotation = {
                "id": len(annotations) + 1,
                "image_id": image_id,
                "category_id": int(result.boxes.cls[i]),
                "bbox": box,
                "area": box[2] * box[3],
                "iscrowd": 0,
            }
            if masks is not None:
                if not masks[i].any():
                    continue
                rle = mask_utils.encode(np.asfortranarray(masks[i].astype(np.uint8)))
                annotation["segmentation"] = {"size": rle["size"], "counts": rle["counts"].decode()}
                annotation["area"] = float(masks[i].sum())
            if result.keypoints is not None:
                points = result.keypoints.data[i].cpu().numpy()
                annotation["keypoints"] = [round(float(v), 3) for x, y, _ in points for v in (x, y, 2)]
                annotation["num_keypoints"] = len(points)
            annotations.append(annotation)
    categories = [{"id": i, "name": n} for i, n in model.names.items()]
    document = {"images": images, "annotations": annotations, "categories": categories}
    (root / "instances.json").write_text(json.dumps(document))
    return document


@pytest.fixture(scope="module", params=["yolov8n-seg.yaml", "yolo11n-pose.yaml"])
def task_dataset(request, tmp_path_factory):
    cfg = request.param
    root = tmp_path_factory.mktemp(cfg.split(".")[0])
    model = calibrated_model(cfg, IMGSZ)
    document = write_dataset(root, model, cfg)
    assert len(document["annotations"]) >= 10, "the check needs objects to mean something"
    engine = Engine.load(
        yolojet.export(model, out=root / "model", imgsz=IMGSZ),
        device="cpu",
        backend="reference",
        max_batch=5,
        rect=False,
    )
    return cfg, root, engine


def test_task_metrics_find_ultralytics_objects(task_dataset):
    cfg, root, engine = task_dataset
    dataset = load_dataset(root / "instances.json")
    result = validate(engine, dataset, progress=False, protocol="predict")
    assert result.scores.map50_95 >= 0.99
    document = json.loads((root / "instances.json").read_text())
    if "seg" in cfg:
        assert dataset.has_masks and result.keypoint_scores is None
        assert result.mask_scores.map50_95 >= 0.99
        assert "mask" in result.to_json() and all("segmentation" in p for p in result.predictions)
        for a in document["annotations"]:  # a dataset with boxes only: the masks cannot be scored
            del a["segmentation"]
        (root / "boxes.json").write_text(json.dumps(document))
        boxes_only = validate(engine, load_dataset(root / "boxes.json"), progress=False, protocol="predict")
        assert boxes_only.mask_scores is None and boxes_only.scores.map50_95 == result.scores.map50_95
        assert result.unscored == [] and boxes_only.unscored == [
            "masks: not scored, not every annotation in the dataset has a mask"
        ]
    else:
        assert dataset.keypoints == 17 and result.mask_scores is None
        assert result.keypoint_scores.map50_95 >= 0.99
        assert result.to_json()["keypoints"]["AR20"] >= 0.99
        for a in document["annotations"]:  # another keypoint shape than the model's is an error, not a score
            a["keypoints"] = a["keypoints"][: 5 * 3]
        (root / "five.json").write_text(json.dumps(document))
        with pytest.raises(DatasetError, match="5 keypoints per object, the model predicts 17"):
            validate(engine, load_dataset(root / "five.json"), progress=False, protocol="predict")


def test_yolo_labels_convert_to_the_same_annotations(task_dataset, tmp_path):
    """Polygons (traced from the ground-truth masks) and box + keypoint lines under a dataset YAML convert back:
    keypoints and boxes to within rounding, polygons to the outline they were written from."""
    cfg, root, engine = task_dataset
    coco = load_dataset(root / "instances.json")
    yolo = tmp_path / "yolo"
    (yolo / "images" / "val").mkdir(parents=True)
    (yolo / "labels" / "val").mkdir(parents=True)
    written: dict[str, list] = {}  # image file stem -> what its label file says, in order
    for image in coco.images:
        shutil.copy(image.path, yolo / "images" / "val" / image.path.name)
        lines = []
        for a in (a for a in coco.ground_truth["annotations"] if a["image_id"] == image.id):
            w, h = image.width, image.height
            if "keypoints" in a:
                x, y, bw, bh = a["bbox"]
                values = [(x + bw / 2) / w, (y + bh / 2) / h, bw / w, bh / h]
                values += [
                    v for px, py, vis in zip(*[iter(a["keypoints"])] * 3, strict=True) for v in (px / w, py / h, vis)
                ]
                written.setdefault(image.path.stem, []).append(a)
            else:
                from pycocotools import mask as mask_utils

                mask = mask_utils.decode(a["segmentation"])
                contours, _ = cv2.findContours(mask, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
                outline = max(contours, key=len).reshape(-1, 2).astype(float)
                if len(outline) < 3:
                    continue
                values = [v for px, py in outline for v in (px / w, py / h)]
                written.setdefault(image.path.stem, []).append(outline)
            lines.append(" ".join([str(a["category_id"])] + [f"{v:.8f}" for v in values]))
        (yolo / "labels" / "val" / f"{image.path.stem}.txt").write_text("\n".join(lines))
    names = "\n".join(f"  {i}: {n}" for i, n in engine.names.items())
    extra = "kpt_shape: [17, 3]\n" if "pose" in cfg else ""
    (yolo / "data.yaml").write_text(f"path: {yolo}\nval: images/val\n{extra}names:\n{names}\n")
    converted = load_dataset(yolo / "data.yaml")
    stems = {image.id: image.path.stem for image in converted.images}
    pairs = [(a, written[stems[a["image_id"]]].pop(0)) for a in converted.ground_truth["annotations"]]
    assert not any(written.values()), "labels written but not read back"
    if "pose" in cfg:
        assert converted.keypoints == 17
        for ours, theirs in pairs:
            np.testing.assert_allclose(ours["keypoints"], theirs["keypoints"], atol=1e-3)
            np.testing.assert_allclose(ours["bbox"], theirs["bbox"], atol=1e-3)
        assert validate(engine, converted, progress=False, protocol="predict").keypoint_scores.map50_95 >= 0.99
    else:
        assert converted.has_masks
        for annotation, outline in pairs:
            polygon = np.array(annotation["segmentation"][0]).reshape(-1, 2)
            np.testing.assert_allclose(polygon, outline, atol=1e-3)
            x, y, bw, bh = annotation["bbox"]
            assert (x, y) == pytest.approx(tuple(outline.min(0)), abs=1e-3)
            assert (x + bw, y + bh) == pytest.approx(tuple(outline.max(0)), abs=1e-3)


def test_malformed_task_labels(tmp_path):
    yolo = tmp_path / "yolo"
    (yolo / "images" / "val").mkdir(parents=True)
    (yolo / "labels" / "val").mkdir(parents=True)
    cv2.imwrite(str(yolo / "images" / "val" / "a.png"), real_photos()["coffee"])
    data = yolo / "data.yaml"
    cases = [
        ("kpt_shape: [17, 3]\n", "0 0.5 0.5 0.2 0.2 0.1 0.1 2\n", r"a\.txt:1: expected class, box and 17x3"),
        ("kpt_shape: [17]\n", "0 0.5 0.5 0.2 0.2\n", r"kpt_shape \[17\]"),
        ("", "0 0.1 0.1 0.2 0.2 0.3\n", r"a\.txt:1: expected 'class cx cy w h' or a polygon"),
        ("", "0 0.1 0.1 0.2 x 0.3 0.3\n", r"a\.txt:1: expected numbers"),
        ("", "0 0.1 0.1 0.2 0.2 1.7 0.3\n", r"a\.txt:1: coordinates .* not normalized"),
    ]
    for extra, label, message in cases:
        (yolo / "labels" / "val" / "a.txt").write_text(label)
        data.write_text(f"path: {yolo}\nval: images/val\n{extra}names: [thing]\n")
        with pytest.raises(DatasetError, match=message):
            load_dataset(data)
