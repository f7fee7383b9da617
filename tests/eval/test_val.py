"""`yolojet val` on a small dataset built from the shipped photos, with ground truth taken from ultralytics'
own predictions with the same weights (square, predict(rect=False)): through its predict path with the same square
letterbox, yolojet must find the same objects (mAP50-95 ≥ 0.99), report exactly what pycocotools computes on its
saved predictions, and agree with ultralytics' predictions' score. (The validator's own protocol, the default of
`yolojet val`: test_val_protocol.)"""

from __future__ import annotations

import json
import shutil
from collections import Counter

import cv2
import pytest
import torch
from support import calibrated_model, real_photos

import yolojet
from yolojet.cli import main
from yolojet.engine.engine import Engine
from yolojet.errors import DatasetError
from yolojet.eval.coco import evaluate
from yolojet.eval.datasets import COCO80_TO_COCO91, load_dataset
from yolojet.eval.val import validate

GT_CONF = 0.005  # ultralytics' boxes above this become the ground truth


def ultralytics_boxes(model, image, conf: float) -> torch.Tensor:
    from copy import deepcopy

    from ultralytics import YOLO

    wrapper = YOLO("yolov8n.yaml", verbose=False)
    wrapper.model = deepcopy(model)
    result = wrapper.predict(image, imgsz=640, conf=conf, verbose=False, rect=False)[0]
    return torch.cat([result.boxes.xyxy, result.boxes.conf[:, None], result.boxes.cls[:, None]], 1)


def write_coco_dataset(root, model) -> int:
    """The photos as lossless PNGs under root/images and ultralytics' confident boxes as root/instances.json;
    returns how many annotations there are."""
    (root / "images").mkdir()
    images, annotations = [], []
    for image_id, (name, bgr) in enumerate(real_photos().items(), 1):
        file = f"images/{name.split('.')[0]}.png"
        cv2.imwrite(str(root / file), bgr)
        images.append({"id": image_id, "file_name": file, "width": bgr.shape[1], "height": bgr.shape[0]})
        for x1, y1, x2, y2, _, cls in ultralytics_boxes(model, bgr, GT_CONF).tolist():
            box = [x1, y1, x2 - x1, y2 - y1]
            category = COCO80_TO_COCO91[int(cls)]
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": category,
                    "bbox": box,
                    "area": box[2] * box[3],
                    "iscrowd": 0,
                }
            )
    categories = [{"id": COCO80_TO_COCO91[i], "name": name} for i, name in model.names.items()]
    (root / "instances.json").write_text(
        json.dumps({"images": images, "annotations": annotations, "categories": categories})
    )
    return len(annotations)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A COCO-format folder: the photos as lossless PNGs and ultralytics' confident boxes as annotations."""
    root = tmp_path_factory.mktemp("coco")
    model = calibrated_model("yolov8n.yaml")
    annotations = write_coco_dataset(root, model)
    model_dir = yolojet.export(model, out=root / "model", imgsz=640)
    assert annotations >= 10, "the check needs objects to mean something"
    return root, model, model_dir


def cpu_fallback(monkeypatch) -> None:
    """Without a GPU, run the CLI as a user without one would: the reference executor, not Triton's interpreter
    (which conftest enables for the kernel tests and would take minutes at 640)."""
    if not torch.cuda.is_available():
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def test_val_finds_ultralytics_objects_and_matches_pycocotools(dataset, tmp_path, capsys, monkeypatch):
    cpu_fallback(monkeypatch)
    root, model, model_dir = dataset
    out = tmp_path / "val"
    # fp32 on a GPU: the ground truth is random weights' low-confidence, near-tied boxes, which fp16 rounding
    # reorders and moves by pixels (measured 0.970 mAP50-95 on an H200 in fp16); fp16 agreement is a question
    # for trained weights (README: COCO val2017).
    code = main(
        [
            "val",
            str(model_dir),
            "--data",
            str(root / "instances.json"),
            "--out",
            str(out),
            "--quiet",
            "--fp32",
            "--protocol",
            "predict",
            "--no-rect",
        ]
    )
    assert code == 0, capsys.readouterr().err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["mAP50-95"] >= 0.99

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    gt = COCO(str(root / "instances.json"))
    scorer = COCOeval(gt, gt.loadRes(str(out / "predictions.json")), "bbox")
    scorer.evaluate()
    scorer.accumulate()
    scorer.summarize()
    assert metrics["mAP50-95"] == pytest.approx(scorer.stats[0], abs=1e-6)
    assert metrics["mAP50"] == pytest.approx(scorer.stats[1], abs=1e-6)

    dataset_ = load_dataset(root / "instances.json")
    theirs = []
    for image in dataset_.images:
        for x1, y1, x2, y2, conf, cls in ultralytics_boxes(model, cv2.imread(str(image.path)), 0.001).tolist():
            theirs.append(
                {
                    "image_id": image.id,
                    "category_id": COCO80_TO_COCO91[int(cls)],
                    "score": conf,
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                }
            )
    assert abs(evaluate(dataset_.ground_truth, theirs).map50_95 - metrics["mAP50-95"]) <= 0.005


def test_yolo_yaml_dataset_gives_the_same_ground_truth(dataset, tmp_path):
    """The same annotations written as YOLO labels under an ultralytics dataset YAML convert back to the same boxes."""
    root, model, model_dir = dataset
    coco = load_dataset(root / "instances.json")
    yolo_root = tmp_path / "yolo"
    (yolo_root / "images" / "val").mkdir(parents=True)
    (yolo_root / "labels" / "val").mkdir(parents=True)
    to_class = {cat: i for i, cat in enumerate(COCO80_TO_COCO91)}
    for image in coco.images:
        shutil.copy(image.path, yolo_root / "images" / "val" / image.path.name)
        lines = []
        for a in coco.ground_truth["annotations"]:
            if a["image_id"] == image.id:
                x, y, w, h = a["bbox"]
                cx, cy = (x + w / 2) / image.width, (y + h / 2) / image.height
                lines.append(
                    f"{to_class[a['category_id']]} {cx:.8f} {cy:.8f} {w / image.width:.8f} {h / image.height:.8f}"
                )
        (yolo_root / "labels" / "val" / f"{image.path.stem}.txt").write_text("\n".join(lines))
    names = "\n".join(f"  {i}: {n}" for i, n in model.names.items())
    (yolo_root / "data.yaml").write_text(f"path: {yolo_root}\nval: images/val\nnames:\n{names}\n")
    converted = load_dataset(yolo_root / "data.yaml")
    assert len(converted.ground_truth["annotations"]) == len(coco.ground_truth["annotations"])
    # The torch path on any machine, square as the ground truth's predictions.
    engine = Engine.load(model_dir, device="cpu", backend="reference", max_batch=5, rect=False)
    assert validate(engine, converted, progress=False, protocol="predict").scores.map50_95 >= 0.99


def test_malformed_datasets(tmp_path, dataset):
    root, _, _ = dataset
    document = json.loads((root / "instances.json").read_text())
    document["images"].append({"id": 99, "file_name": "images/absent.png", "width": 4, "height": 4})
    broken = root / "missing.json"
    broken.write_text(json.dumps(document))
    with pytest.raises(DatasetError, match=r"1 images not found .*99 \(absent\.png\)"):
        load_dataset(broken)
    (tmp_path / "bad.json").write_text("{oops")
    with pytest.raises(DatasetError, match="not valid JSON"):
        load_dataset(tmp_path / "bad.json")
    labels = tmp_path / "yolo" / "labels" / "val"
    labels.mkdir(parents=True)
    (tmp_path / "yolo" / "images" / "val").mkdir(parents=True)
    shutil.copy(root / "images" / "bus.png", tmp_path / "yolo" / "images" / "val" / "bus.png")
    (labels / "bus.txt").write_text("0 0.5 0.5 0.2 0.2\n7 0.5 0.5 0.2 0.2\n")
    (tmp_path / "yolo" / "data.yaml").write_text(f"path: {tmp_path / 'yolo'}\nval: images/val\nnames: [a, b]\n")
    with pytest.raises(DatasetError, match=r"bus\.txt:2: class 7 is not among the 2 names"):
        load_dataset(tmp_path / "yolo" / "data.yaml")


def test_failed_val_writes_nothing(dataset, tmp_path, capsys, monkeypatch):
    cpu_fallback(monkeypatch)
    root, _, model_dir = dataset
    out = tmp_path / "val"
    code = main(["val", str(model_dir), "--data", str(root / "missing-file.json"), "--out", str(out), "--quiet"])
    assert code == 2 and "no such dataset file" in capsys.readouterr().err
    assert not out.exists()


def test_datasets_with_nothing_to_score_are_errors_that_write_nothing(dataset, tmp_path, capsys, monkeypatch):
    """No images, or images without a single annotation: an error, not a mAP of 0 or pycocotools' -1."""
    cpu_fallback(monkeypatch)
    root, _, model_dir = dataset
    document = json.loads((root / "instances.json").read_text())
    for name, change, message in (
        ("empty.json", {"images": [], "annotations": []}, "no images to evaluate"),
        ("unlabelled.json", {"annotations": []}, "no annotations, so nothing to score"),
    ):
        (root / name).write_text(json.dumps(document | change))
        out = tmp_path / name
        code = main(["val", str(model_dir), "--data", str(root / name), "--out", str(out), "--quiet"])
        assert code == 2 and message in capsys.readouterr().err
        assert not out.exists()


def test_a_dataset_with_a_subset_of_the_classes_is_scored_on_those(dataset):
    """A dataset naming two of the model's 80 classes: their predictions are scored, the other classes' are not (and
    the result says so), exactly as the full dataset's predictions of those two classes."""
    root, _, model_dir = dataset
    document = json.loads((root / "instances.json").read_text())
    kept = {cat for cat, _ in Counter(a["category_id"] for a in document["annotations"]).most_common(2)}
    subset = {
        "images": document["images"],
        "annotations": [a for a in document["annotations"] if a["category_id"] in kept],
        "categories": [c for c in document["categories"] if c["id"] in kept],
    }
    (root / "subset.json").write_text(json.dumps(subset))
    stranger = {**subset, "categories": [*subset["categories"], {"id": 999, "name": "unicorn"}]}
    (root / "stranger.json").write_text(json.dumps(stranger))
    options = {"protocol": "predict", "progress": False}
    with Engine.load(model_dir, device="cpu", backend="reference") as engine:
        full = validate(engine, load_dataset(root / "instances.json"), **options)
        part = validate(engine, load_dataset(root / "subset.json"), **options)
        with pytest.raises(DatasetError, match="unicorn not among its class names"):
            validate(engine, load_dataset(root / "stranger.json"), **options)
    assert part.predictions == [p for p in full.predictions if p["category_id"] in kept]
    assert len(part.predictions) > 0
    (note,) = [n for n in part.unscored if "without a category" in n]
    assert "and 70 more" in note  # 78 classes unscored: eight named, then the count
    assert part.scores.map50_95 == evaluate(load_dataset(root / "subset.json").ground_truth, part.predictions).map50_95


def test_a_wide_input_under_the_val_protocol_says_it_runs_at_its_long_side(dataset, tmp_path):
    """`yolo val` takes one imgsz and letterboxes each image's long side to it; a model exported 480x640 is validated
    that way at 640, and the result says so (the predict protocol keeps the 480x640 input and says nothing)."""
    root, model, _ = dataset
    wide = yolojet.export(model, out=tmp_path / "wide", imgsz=(480, 640))
    with Engine.load(wide, device="cpu", backend="reference") as engine:
        data = load_dataset(root / "instances.json")
        val = validate(engine, data, progress=False)
        predict = validate(engine, data, progress=False, protocol="predict")
    assert val.notes == [
        "the val protocol letterboxes each image's long side to 640, as yolo val does with a 480x640 imgsz; "
        "--protocol predict runs the 480x640 input"
    ]
    assert predict.notes == []


def test_images_that_cannot_be_read_or_are_not_the_size_given_are_named_once(dataset, tmp_path, capsys, monkeypatch):
    """On the CPU by --device (whatever the machine has; the reference executor, not Triton's interpreter): an image
    that is not one is named once with why, after the others ran; an image whose size is not the one the dataset
    gives is named with both sizes, height first."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    root, _, model_dir = dataset
    document = json.loads((root / "instances.json").read_text())
    first, second = document["images"][:2]
    (tmp_path / "images").mkdir()
    broken = tmp_path / first["file_name"]
    broken.write_bytes(b"not an image")
    shutil.copy(root / second["file_name"], tmp_path / second["file_name"])
    kept = {first["id"], second["id"]}
    two = {
        **document,
        "images": [first, second],
        "annotations": [a for a in document["annotations"] if a["image_id"] in kept],
    }
    (tmp_path / "broken.json").write_text(json.dumps(two))
    argv = ["val", str(model_dir), "--images", str(tmp_path), "--device", "cpu", "--quiet"]
    code = main([*argv, "--data", str(tmp_path / "broken.json")])
    err = capsys.readouterr().err
    assert code == 2 and "1 images could not be read" in err and err.count(broken.name) == 1, err

    shutil.copy(root / first["file_name"], broken)
    wrong = {**two, "images": [{**first, "width": 7, "height": 5}, second]}
    (tmp_path / "wrong.json").write_text(json.dumps(wrong))
    for protocol in ("val", "predict"):
        code = main([*argv, "--data", str(tmp_path / "wrong.json"), "--protocol", protocol])
        message = f"the dataset gives it as 5x7 (height x width), it reads as {first['height']}x{first['width']}"
        assert code == 2 and message in capsys.readouterr().err, protocol
