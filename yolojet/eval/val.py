"""`validate`: run an engine over an evaluation dataset and score its detections with the COCO protocol: boxes
always, masks for segment models on datasets with masks, keypoints (OKS) for pose models on datasets with them;
OBB models with ultralytics' OBB metric against four-point (DOTA-style) ground truth."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from yolojet.errors import DatasetError, EngineConfigError
from yolojet.eval.coco import (
    CocoScores,
    attach_keypoints,
    attach_masks,
    box_predictions,
    evaluate,
    keypoint_sigmas,
)
from yolojet.eval.datasets import Dataset, load_dataset, wrong_size
from yolojet.eval.obb import ObbScores, evaluate_obb, quad_to_xywhr


@dataclass
class ValResult:
    scores: CocoScores | ObbScores  # boxes (rotated boxes for OBB models)
    predictions: list[dict[str, Any]] = field(repr=False)
    images: int = 0
    mask_scores: CocoScores | None = None
    keypoint_scores: CocoScores | None = None
    unscored: list[str] = field(default_factory=list)  # what the model predicts that the dataset cannot score
    notes: list[str] = field(default_factory=list)  # how the run differed from what was asked

    def to_json(self) -> dict[str, Any]:
        document = self.scores.to_json()
        if self.mask_scores is not None:
            document["mask"] = self.mask_scores.to_json()
        if self.keypoint_scores is not None:
            document["keypoints"] = self.keypoint_scores.to_json()
        return document


def category_map(model_names: dict[int, str], dataset: Dataset) -> list[int | None]:
    """Model class index -> dataset category id, or None for a class the dataset has no category for (its
    predictions are not scored): by name where every category is named after one of the model's classes (the
    dataset may hold a subset of them), else, with as many categories as classes, by order of category id."""
    names = [model_names[i] for i in range(len(model_names))]
    by_name = {name: cat for cat, name in dataset.categories.items()}
    repeated = sorted(
        {n for n, count in Counter(dataset.categories.values()).items() if count > 1}
        | {n for n, count in Counter(names).items() if count > 1}
    )
    if not repeated and set(by_name) <= set(names):
        return [by_name.get(name) for name in names]
    ids = sorted(dataset.categories)
    if len(ids) == len(names):
        return list(ids)
    if repeated:
        raise DatasetError(
            f"{dataset.source}: the class names {', '.join(repeated[:5])} are given more than once, so categories "
            f"cannot be matched by name, and its {len(ids)} categories are not the model's {len(names)} classes to "
            "match by order"
        )
    strangers = sorted(set(by_name) - set(names))
    listed = ", ".join(strangers[:5]) + (f" and {len(strangers) - 5} more" if len(strangers) > 5 else "")
    raise DatasetError(
        f"{dataset.source}: {len(ids)} categories for the model's {len(names)} classes, and {listed} "
        "not among its class names, so they cannot be matched by name or by order"
    )


def _without_category(model_names: dict[int, str], categories: list[int | None]) -> list[str]:
    missing = [model_names[i] for i, cat in enumerate(categories) if cat is None]
    if not missing:
        return []
    listed = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
    return [f"classes without a category in the dataset, their predictions not scored: {listed}"]


PROTOCOLS = ("val", "predict")
MAX_DET = 300  # the most detections an image, for runtimes that do not say (an engine's `capacity`)


def _predicted(engine: Any, dataset: Dataset, batch: int, options: dict[str, Any]) -> Iterator:
    """(image, Results) through the engine's predict path (`engine(paths)`), a batch at a time."""
    for start in range(0, len(dataset.images), batch):
        chunk = dataset.images[start : start + batch]
        yield from zip(chunk, engine([str(i.path) for i in chunk], **options), strict=True)


def _checked(pairs: Iterator, total: int, progress: bool) -> Iterator:
    """The pairs with a progress bar; raises once all ran if any image could not be read, or at once if an image's
    size disagrees with its annotation."""
    from tqdm import tqdm

    failed = []
    interval = 0.1 if sys.stderr.isatty() else 30.0  # in a log, not a terminal: a line every 30 s, not ten a second
    with tqdm(total=total, disable=not progress, unit="img", file=sys.stderr, desc="val", mininterval=interval) as bar:
        for image, result in pairs:
            bar.update(1)
            if result.error:  # the reader's message names the image already
                named = result.error.startswith(str(image.path))
                failed.append(result.error if named else f"{image.path}: {result.error}")
                continue
            if result.orig_shape != (image.height, image.width):
                raise wrong_size(image, *result.orig_shape)
            yield image, result
    if failed:
        raise DatasetError(f"{len(failed)} images could not be read: " + "; ".join(failed[:5]))


def check_val_options(conf: Any, iou: Any, max_det: Any, capacity: int = MAX_DET) -> None:
    """conf and iou in [0, 1], max_det in 1..capacity: out of range, val would score nothing or the wrong boxes."""
    for name, value in (("conf", conf), ("iou", iou)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise EngineConfigError(f"{name} {value!r}: expected a number in [0, 1]")
    if isinstance(max_det, bool) or not isinstance(max_det, int) or not 1 <= max_det <= capacity:
        raise EngineConfigError(f"max_det {max_det!r}: expected an int in 1..{capacity}")


def validate(
    engine: Any,
    dataset: Dataset,
    batch: int = 16,
    conf: float = 0.001,
    iou: float = 0.7,
    max_det: int = 300,
    progress: bool = True,
    boxes_only: bool = False,
    protocol: str = "val",
) -> ValResult:
    """Detections for every dataset image (original pixels) and their COCO scores: boxes, and the masks or
    keypoints of segment and pose models where the dataset has them (unless `boxes_only`, for callers that only
    have boxes, such as `yolojet report`); rotated boxes of OBB models with ultralytics' OBB metric.

    `protocol` "val" runs the engine's network as `yolo val` runs the model (`protocol.py`: batches by aspect ratio,
    their letterbox, NMS with every class over conf per box), so the same weights score the same through both;
    "predict" scores what `engine(images)` gives (any object that takes a list of paths and options and returns
    `Results`: `yolojet report`'s runtimes)."""
    check_val_options(conf, iou, max_det, getattr(engine, "capacity", MAX_DET))
    if not dataset.images:
        raise DatasetError(f"{dataset.source}: no images to evaluate")
    if not dataset.ground_truth.get("annotations"):
        raise DatasetError(f"{dataset.source}: no annotations, so nothing to score detections against")
    categories = category_map(engine.names, dataset)
    task = "detect" if boxes_only else engine.meta.task
    if task not in ("detect", "segment", "pose", "obb"):
        raise DatasetError(f"a {task} model has no detections to score")
    if protocol not in PROTOCOLS:
        raise DatasetError(f"protocol {protocol!r}: expected one of {', '.join(PROTOCOLS)}")
    if protocol == "val":
        from yolojet.eval.protocol import validation_results

        pairs = validation_results(engine, dataset.images, batch, conf, iou, max_det)
    else:
        pairs = _predicted(engine, dataset, batch, {"conf": conf, "iou": iou, "max_det": max_det})
    results = _checked(pairs, len(dataset.images), progress)
    notes = []
    height, width = engine.meta.imgsz if protocol == "val" else (0, 0)  # report's runtimes take the predict protocol
    if height != width:
        notes.append(
            f"the val protocol letterboxes each image's long side to {max(height, width)}, as yolo val does with a "
            f"{height}x{width} imgsz; --protocol predict runs the {height}x{width} input"
        )
    if task == "obb":
        scored = _validate_obb(dataset, categories, results)
        scored.unscored += _without_category(engine.names, categories)
        scored.notes = notes
        return scored
    with_masks = task == "segment" and dataset.has_masks
    with_keypoints = task == "pose" and dataset.keypoints > 0
    if with_keypoints and dataset.keypoints != engine.meta.kpt_shape[0]:
        raise DatasetError(
            f"{dataset.source}: {dataset.keypoints} keypoints per object, the model predicts {engine.meta.kpt_shape[0]}"
        )
    predictions: list[dict[str, Any]] = []
    for image, result in results:
        keep = np.array([categories[int(c)] is not None for c in result.boxes.cls], dtype=bool)
        cats = [cast(int, categories[int(c)]) for c in result.boxes.cls[keep]]  # `keep` drops the None ones
        found = box_predictions(image.id, result.boxes.xyxy[keep], result.boxes.conf[keep], cats)
        if with_masks:
            attach_masks(found, result.masks[keep].to_rle() if keep.any() else [])
        if with_keypoints:
            attach_keypoints(found, result.keypoints.data[keep])
        predictions += found
    gt = dataset.ground_truth
    unscored = _without_category(engine.names, categories)
    if task == "segment" and not with_masks:
        unscored.append("masks: not scored, not every annotation in the dataset has a mask")
    if task == "pose" and not with_keypoints:
        unscored.append("keypoints: not scored, the dataset's annotations have no keypoints")
    return ValResult(
        evaluate(gt, predictions),
        predictions,
        len(dataset.images),
        mask_scores=evaluate(gt, predictions, "segm") if with_masks else None,
        keypoint_scores=evaluate(gt, predictions, "keypoints", keypoint_sigmas(dataset.keypoints))
        if with_keypoints
        else None,
        unscored=unscored,
        notes=notes,
    )


def validate_model(model: str | Path, data: str | Path, images: str | Path | None = None, **options: Any) -> ValResult:
    from yolojet.engine.engine import Engine

    engine_keys = ("imgsz", "half", "device", "switches", "tune", "fuse", "pdl", "branches", "backend", "rect")
    engine_options = {k: options.pop(k) for k in engine_keys if k in options}
    dataset = load_dataset(data, images)
    # The validator's batches come in a few dozen shapes, in order of aspect ratio: each is built once.
    with Engine.load(model, max_batch=options.get("batch", 16), max_shapes=64, **engine_options) as engine:
        return validate(engine, dataset, **options)


def _obb_truth(dataset: Dataset) -> dict[int, tuple]:
    """image id -> (rotated ground-truth boxes, category ids), from four-point polygons."""
    by_image: dict[int, list] = {image.id: [] for image in dataset.images}
    for a in dataset.ground_truth["annotations"]:
        polygon = a.get("segmentation")
        if not (isinstance(polygon, list) and len(polygon) == 1 and len(polygon[0]) == 8):
            raise DatasetError(
                f"{dataset.source}: annotation {a.get('id')} is not a four-point polygon (class x1 y1 ... x4 y4), "
                "which OBB models are scored against"
            )
        by_image[a["image_id"]].append((polygon[0], a["category_id"]))
    truth = {}
    for image_id, rows in by_image.items():
        quads = np.array([r[0] for r in rows], dtype=np.float64).reshape(-1, 4, 2)
        truth[image_id] = (quad_to_xywhr(quads), np.array([r[1] for r in rows], dtype=np.int64))
    return truth


def _validate_obb(dataset: Dataset, categories: list[int | None], results: Iterator) -> ValResult:
    truth = _obb_truth(dataset)  # before any image runs: a dataset without four-point labels fails at once
    found, predictions = {}, []
    for image, result in results:
        obb = result.obb
        keep = np.array([categories[int(c)] is not None for c in obb.cls], dtype=bool)
        obb = obb[keep] if len(obb) else obb
        cats = np.array([categories[int(c)] for c in obb.cls], dtype=np.int64)
        found[image.id] = (obb.xywhr.astype(np.float64), obb.conf.astype(np.float64), cats)
        for box, corners, score, cat in zip(obb.xywhr, obb.xyxyxyxy, obb.conf, cats, strict=True):
            predictions.append(
                {
                    "image_id": image.id,
                    "category_id": int(cat),
                    "score": round(float(score), 5),
                    "rbox": [round(float(v), 3) for v in box],
                    "poly": [round(float(v), 3) for v in np.asarray(corners).reshape(-1)],
                }
            )
    return ValResult(evaluate_obb(truth, found), predictions, len(dataset.images))
