"""COCO annotations and YOLO label files made from `yolojet label`'s records.

COCO (`coco_document`): `images` (id, file_name = the record's path, width, height), `categories` from the model's
class names (id = class id), and one annotation a detection: `bbox` [x, y, w, h], `area`, `score`, `iscrowd` 0;
segment models add `segmentation` as the polygons of the mask's outer contours (holes are not drawn) or, with
`rle`, the mask's COCO RLE, exact; pose models add `keypoints` [x, y, v] a point (v 2 where the
model's visibility is at least 0.5, else 1) and `num_keypoints`; OBB models the four corners as the
`segmentation` polygon, the axis-aligned extent as `bbox`, and `rotated_box` [cx, cy, w, h, angle].

YOLO (`write_yolo_dataset`): an ultralytics dataset folder: `images/` (links to the labeled images, mirroring their
folders below their common root), `labels/` (one .txt a labeled image: `class cx cy w h` normalized; the polygon for
segment models; the box and `x y v` per keypoint for pose; the 8 corner coordinates for OBB, clipped to the
image), and `data.yaml` naming the classes (and `kpt_shape` for pose), ready for `yolo train data=.../data.yaml`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from yolojet.errors import OutputPathError
from yolojet.outputs import write_atomically
from yolojet.tasks.obb import xywhr_to_corners
from yolojet.tasks.segment import decode_rle, external_contours, merged_contour

VISIBLE = 0.5  # a keypoint's visibility at or above this is COCO's / YOLO's v = 2 (visible), else 1


def _corners(detection: dict) -> np.ndarray:
    return xywhr_to_corners(np.asarray(detection["rotated_box"], np.float64))


def _extent(detection: dict) -> list[float]:
    """[x1, y1, x2, y2] of a detection: its box, or its rotated box's corners' bounds."""
    if "box" in detection:
        return list(detection["box"])
    corners = _corners(detection)
    return [*corners.min(0).tolist(), *corners.max(0).tolist()]


def _polygon(mask_rle: dict) -> list[float]:
    """One polygon through every outer contour of the mask (ultralytics' masks2segments): a YOLO label line."""
    points = merged_contour(decode_rle(mask_rle))
    return [round(float(v), 2) for v in points.reshape(-1)]


def _polygons(mask: np.ndarray) -> list[list[float]]:
    """A polygon an outer contour of the mask (of at least three points): a COCO segmentation."""
    return [[round(float(v), 2) for v in c.reshape(-1)] for c in external_contours(mask) if len(c) >= 3]


def coco_document(records: Iterable[dict], names: dict[int, str], rle: bool = False) -> dict:
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for image_id, record in enumerate(records, start=1):
        images.append(
            {"id": image_id, "file_name": record["path"], "width": record["width"], "height": record["height"]}
        )
        for d in record.get("detections", []):
            x1, y1, x2, y2 = _extent(d)
            ann: dict[str, Any] = {
                "id": len(annotations) + 1,
                "image_id": image_id,
                "category_id": d["class"],
                "bbox": [round(x1, 2), round(y1, 2), round(x2 - x1, 2), round(y2 - y1, 2)],
                "area": round((x2 - x1) * (y2 - y1), 2),
                "score": d["confidence"],
                "iscrowd": 0,
            }
            if "mask" in d:
                mask = decode_rle(d["mask"])
                ann["area"] = int(mask.sum())
                ann["segmentation"] = d["mask"] if rle else _polygons(mask)
            if "rotated_box" in d:
                ann["rotated_box"] = d["rotated_box"]
                ann["segmentation"] = [[round(float(v), 2) for v in _corners(d).reshape(-1)]]
                ann["area"] = round(d["rotated_box"][2] * d["rotated_box"][3], 2)
            if "keypoints" in d:
                flat = []
                for x, y, visibility in d["keypoints"]:
                    flat += [x, y, 2 if visibility >= VISIBLE else 1]
                ann["keypoints"] = flat
                ann["num_keypoints"] = sum(1 for v in flat[2::3] if v == 2)
            annotations.append(ann)
    categories = [{"id": c, "name": names[c]} for c in sorted(names)]
    return {"images": images, "annotations": annotations, "categories": categories}


def write_coco(path: Path, records: list[dict], names: dict[int, str], rle: bool = False) -> None:
    import orjson

    document = coco_document(records, names, rle)
    write_atomically(path, lambda p: p.write_bytes(orjson.dumps(document, option=orjson.OPT_NON_STR_KEYS)))


def _label_lines(record: dict) -> list[str]:
    w, h = record["width"], record["height"]
    scale = np.array([w, h], np.float64)
    lines = []
    for d in record.get("detections", []):
        if "rotated_box" in d:
            # Corners past the image's border are clipped to it: ultralytics refuses label coordinates outside [0, 1].
            values = np.clip(_corners(d) / scale, 0.0, 1.0).reshape(-1)
        elif "mask" in d:
            values = np.asarray(_polygon(d["mask"]), np.float64).reshape(-1, 2) / scale
            if len(values) < 3:  # a polygon needs three points: a mask thinner than that has no label line
                continue
            values = values.reshape(-1)
        else:
            x1, y1, x2, y2 = d["box"]
            values = np.array([(x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h])
            if "keypoints" in d:
                points = [[x / w, y / h, 2 if v >= VISIBLE else 1] for x, y, v in d["keypoints"]]
                values = np.concatenate([values, np.asarray(points, np.float64).reshape(-1)])
        lines.append(" ".join([str(d["class"]), *(f"{v:.6f}".rstrip("0").rstrip(".") or "0" for v in values)]))
    return lines


def _common_root(paths: list[str]) -> Path:
    folders = [os.path.dirname(os.path.abspath(p)) for p in paths]
    return Path(os.path.commonpath(folders)) if folders else Path.cwd()


def write_yolo_dataset(
    folder: Path, records: list[dict], names: dict[int, str], task: str, kpt_shape: list[int] | None = None
) -> int:
    """Label files (each written atomically) and image links for the records, then data.yaml; returns the number
    of label files written."""
    if task == "classify":
        raise OutputPathError("--yolo-txt: a classification dataset is folders of images by class, not label files")
    root = _common_root([r["path"] for r in records])
    images, labels = folder / "images", folder / "labels"
    for record in records:
        source = Path(os.path.abspath(record["path"]))
        relative = source.relative_to(root)
        link = images / relative
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink() and not link.exists():
            link.symlink_to(source)
        label = (labels / relative).with_suffix(".txt")
        label.parent.mkdir(parents=True, exist_ok=True)
        text = "".join(line + "\n" for line in _label_lines(record))
        write_atomically(label, functools.partial(Path.write_text, data=text))
    lines = [f"path: {folder.absolute()}", "train: images", "val: images"]
    if kpt_shape:
        lines.append(f"kpt_shape: [{kpt_shape[0]}, {kpt_shape[1]}]")
    lines.append("names:")
    lines += [f"  {c}: {_yaml_string(names[c])}" for c in sorted(names)]
    yaml_text = "\n".join(lines) + "\n"
    write_atomically(folder / "data.yaml", lambda p: p.write_text(yaml_text))
    return len(records)


def _yaml_string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'
