"""Evaluation datasets as COCO ground truth: a COCO instances JSON with its images, or an ultralytics
dataset YAML whose YOLO-format labels are converted on the fly (class ids mapped to COCO's 91
category ids when the names are COCO's 80, as ultralytics does). Labels may be boxes, polygons
(segment datasets: the box is the polygon's extent, the polygon the mask) or boxes with keypoints
(pose datasets, whose YAML gives `kpt_shape`), as ultralytics reads them.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from yolojet.errors import DatasetError
from yolojet.images import IMAGE_SUFFIXES

COCO80_TO_COCO91 = [
    1,
    2,
    3,
    4,
    5,
    6,
    7,
    8,
    9,
    10,
    11,
    13,
    14,
    15,
    16,
    17,
    18,
    19,
    20,
    21,
    22,
    23,
    24,
    25,
    27,
    28,
    31,
    32,
    33,
    34,
    35,
    36,
    37,
    38,
    39,
    40,
    41,
    42,
    43,
    44,
    46,
    47,
    48,
    49,
    50,
    51,
    52,
    53,
    54,
    55,
    56,
    57,
    58,
    59,
    60,
    61,
    62,
    63,
    64,
    65,
    67,
    70,
    72,
    73,
    74,
    75,
    76,
    77,
    78,
    79,
    80,
    81,
    82,
    84,
    85,
    86,
    87,
    88,
    89,
    90,
]
COCO80_FIRST_NAMES = ("person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck")


@dataclass
class EvalImage:
    id: int
    path: Path
    width: int
    height: int


def wrong_size(image: EvalImage, height: int, width: int) -> DatasetError:
    """The error for an image that reads at another size than its dataset gives (its boxes would be scaled wrong)."""
    return DatasetError(
        f"{image.path}: the dataset gives it as {image.height}x{image.width} (height x width), it reads as "
        f"{height}x{width}"
    )


@dataclass
class Dataset:
    """Images to run and the COCO ground truth to score them against."""

    images: list[EvalImage]
    categories: dict[int, str]  # category id -> name
    ground_truth: dict[str, Any] = field(repr=False)
    source: str = ""
    has_masks: bool = False  # every annotation has a segmentation: mask mAP can be scored
    keypoints: int = 0  # keypoints per annotation (0: none): keypoint mAP (OKS) can be scored


def load_dataset(data: str | Path, images: str | Path | None = None) -> Dataset:
    """A COCO instances JSON (images resolved against `images`, default the JSON's folder) or a dataset YAML."""
    path = Path(data)
    if path.is_dir():
        raise DatasetError(f"{path}: a folder; --data takes a COCO instances .json or an ultralytics dataset .yaml")
    if not path.is_file():
        raise DatasetError(f"{path}: no such dataset file (expected a COCO instances .json or a dataset .yaml)")
    if path.suffix.lower() == ".json":
        return _load_coco(path, Path(images) if images is not None else path.parent)
    if path.suffix.lower() in (".yaml", ".yml"):
        return _load_yolo_yaml(path)
    raise DatasetError(f"{path}: expected a COCO instances .json or an ultralytics dataset .yaml")


def _entries(path: Path, document: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """A COCO document's list under `key`, each entry an object."""
    entries = document[key]
    if not isinstance(entries, list):
        raise DatasetError(f"{path}: '{key}' is not a list")
    for entry in entries:
        if not isinstance(entry, dict):
            raise DatasetError(f"{path}: an entry of '{key}' is not an object: {entry!r}")
    return entries


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not a UTF-8 text file ({e.reason} at byte {e.start})") from None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(document, dict) or not {"images", "annotations", "categories"} <= document.keys():
        raise DatasetError(f"{path}: a COCO instances file needs 'images', 'annotations' and 'categories'")
    return document


def _is_id(value: Any) -> bool:
    """A COCO id: an integer (pycocotools matches results to images by id, so "1" would match nothing)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _numbers(value: Any, count: int | None = None) -> bool:
    """A list of `count` (any, if None) finite numbers."""
    return (
        isinstance(value, list)
        and (count is None or len(value) == count)
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)
    )


def _load_coco(path: Path, root: Path) -> Dataset:
    gt = _read_json(path)
    images: list[EvalImage] = []
    missing: list[EvalImage] = []
    for record in _entries(path, gt, "images"):
        try:
            image = EvalImage(record["id"], root / record["file_name"], int(record["width"]), int(record["height"]))
        except (KeyError, TypeError, ValueError) as e:
            raise DatasetError(f"{path}: image entry {record!r} lacks id, file_name, width or height") from e
        if not _is_id(image.id):
            raise DatasetError(f"{path}: image entry {record!r}: its id is not an integer")
        (images if image.path.is_file() else missing).append(image)
    if missing:
        listed = ", ".join(f"{m.id} ({m.path.name})" for m in missing[:10])
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        raise DatasetError(f"{path}: {len(missing)} images not found under {root}: {listed}{more}")
    ids = Counter(i.id for i in images)
    repeated = sorted(i for i, n in ids.items() if n > 1)
    if repeated:
        raise DatasetError(f"{path}: image ids {repeated[:10]} are given to more than one image")
    categories: dict[int, str] = {}
    for c in _entries(path, gt, "categories"):
        if not _is_id(c.get("id")) or not isinstance(c.get("name"), str):
            raise DatasetError(f"{path}: category {c!r} needs an integer id and a name")
        if c["id"] in categories:
            raise DatasetError(f"{path}: category id {c['id']} is given twice ({categories[c['id']]}, {c['name']})")
        categories[c["id"]] = c["name"]
    for a in _entries(path, gt, "annotations"):
        if a.get("image_id") not in ids:
            raise DatasetError(f"{path}: annotation {a.get('id')} refers to unknown image {a.get('image_id')!r}")
        if a.get("category_id") not in categories:
            raise DatasetError(f"{path}: annotation {a.get('id')} has unknown category {a.get('category_id')!r}")
        if not _numbers(a.get("bbox"), 4):
            raise DatasetError(f"{path}: annotation {a.get('id')}: bbox {a.get('bbox')!r}, expected [x, y, w, h]")
        a.setdefault("iscrowd", 0)
        a.setdefault("area", a["bbox"][2] * a["bbox"][3])
        if "keypoints" in a:
            if not _numbers(a["keypoints"]) or len(a["keypoints"]) % 3:
                raise DatasetError(f"{path}: annotation {a.get('id')} keypoints are not [x, y, v] triples of numbers")
            a.setdefault("num_keypoints", sum(1 for v in a["keypoints"][2::3] if v > 0))
    annotations = gt["annotations"]
    has_masks = bool(annotations) and all(a.get("segmentation") for a in annotations)
    counts = {len(a["keypoints"]) // 3 for a in annotations if "keypoints" in a}
    if len(counts) > 1:
        raise DatasetError(f"{path}: annotations have different keypoint counts {sorted(counts)}")
    keypoints = counts.pop() if counts and all("keypoints" in a for a in annotations) else 0
    return Dataset(images, categories, gt, str(path), has_masks, keypoints)


# EXIF orientations that turn the stored image a quarter (5 and 7 mirrored too): the image is read, as cv2.imread
# reads it, with its width and height swapped.
_QUARTER_TURNS = {5, 6, 7, 8}


def _image_size(path: Path) -> tuple[int, int]:
    """The image's width and height as it is read (its EXIF orientation applied), from its header."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            turned = image.getexif().get(0x0112) in _QUARTER_TURNS
            return (image.height, image.width) if turned else (image.width, image.height)
    except (OSError, UnidentifiedImageError, SyntaxError) as e:  # PIL raises SyntaxError for some broken headers
        raise DatasetError(f"{path}: cannot read the image's size ({e})") from e


def _yaml_images(root: Path, entry: str | list[str]) -> list[Path]:
    entries = entry if isinstance(entry, list) else [entry]
    files: list[Path] = []
    for item in entries:
        target = root / item
        if target.is_dir():
            # Files only: a FIFO named like an image would hold the run for ever at its first read.
            files += sorted(p for p in target.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        elif target.is_file() and target.suffix == ".txt":
            for line in _read_text(target).splitlines():
                if line.strip():
                    candidate = Path(line.strip())
                    files.append(candidate if candidate.is_absolute() else root / candidate)
        else:
            raise DatasetError(f"{target}: the dataset's val entry is neither a folder nor a .txt list")
    return files


def _label_file(image: Path) -> Path:
    parts = list(image.parts)
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] == "images":
            parts[i] = "labels"
            break
    return Path(*parts).with_suffix(".txt")


def _load_yolo_yaml(path: Path) -> Dataset:
    import yaml

    try:
        spec = yaml.safe_load(_read_text(path))
    except yaml.YAMLError as e:
        raise DatasetError(f"{path}: not valid YAML ({e})") from e
    if not isinstance(spec, dict) or "val" not in spec or "names" not in spec:
        raise DatasetError(f"{path}: a dataset YAML needs 'val' and 'names'")
    names = spec["names"]
    names = dict(enumerate(names)) if isinstance(names, list) else {int(k): str(v) for k, v in names.items()}
    declared = spec.get("path")  # the dataset's root; relative to the YAML's folder, which is the default
    root = path.parent / declared if declared else path.parent
    is_coco = len(names) == 80 and tuple(names[i] for i in range(8)) == COCO80_FIRST_NAMES
    category_of = (lambda c: COCO80_TO_COCO91[c]) if is_coco else (lambda c: c)
    kpt_shape = _kpt_shape(path, spec.get("kpt_shape"))
    files = _yaml_images(root, spec["val"])
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise DatasetError(f"{path}: {len(missing)} images not found: {', '.join(str(m) for m in missing[:10])}")
    images: list[EvalImage] = []
    annotations: list[dict[str, Any]] = []
    for image_id, file in enumerate(files):
        width, height = _image_size(file)
        images.append(EvalImage(image_id, file, width, height))
        label = _label_file(file)
        if not label.is_file():
            continue  # an image without a label file has no objects, as in ultralytics
        for line_no, line in enumerate(_read_text(label).splitlines(), 1):
            if not line.strip():
                continue
            where = f"{label}:{line_no}"
            annotation = _label_annotation(where, line, names, kpt_shape, width, height)
            annotation.update(
                id=len(annotations) + 1, image_id=image_id, category_id=category_of(annotation["category_id"])
            )
            annotations.append(annotation)
    categories = {category_of(c): n for c, n in names.items()}
    gt = {
        "images": [{"id": i.id, "file_name": str(i.path), "width": i.width, "height": i.height} for i in images],
        "annotations": annotations,
        "categories": [{"id": k, "name": v} for k, v in categories.items()],
    }
    has_masks = bool(annotations) and all("segmentation" in a for a in annotations)
    return Dataset(images, categories, gt, str(path), has_masks, kpt_shape[0] if kpt_shape else 0)


def _kpt_shape(path: Path, value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    if not (isinstance(value, list) and len(value) == 2 and value[0] >= 1 and value[1] in (2, 3)):
        raise DatasetError(f"{path}: kpt_shape {value!r}: expected [keypoints, 2 or 3]")
    return int(value[0]), int(value[1])


def _label_annotation(
    where: str, line: str, names: dict[int, str], kpt_shape: tuple[int, int] | None, width: int, height: int
) -> dict[str, Any]:
    """One YOLO label line as a COCO annotation (without ids) in pixels: `class cx cy w h`, a polygon
    `class x1 y1 x2 y2 …` (three points or more), or with kpt_shape `class cx cy w h` + keypoints."""
    try:
        values = [float(v) for v in line.split()]
    except ValueError as e:
        raise DatasetError(f"{where}: expected numbers, got {line!r}") from e
    if not all(math.isfinite(v) for v in values):
        raise DatasetError(f"{where}: expected finite numbers, got {line!r}")
    if not values or int(values[0]) != values[0] or int(values[0]) not in names:
        shown = f"{values[0]:g}" if values else "(none)"
        raise DatasetError(f"{where}: class {shown} is not among the {len(names)} names")
    cls, coords = int(values[0]), values[1:]
    if not all(-0.01 <= v <= 1.01 for v in coords[: 4 if kpt_shape else len(coords)]):
        raise DatasetError(f"{where}: coordinates {coords[:8]} are not normalized to [0, 1]")
    annotation: dict[str, Any] = {"category_id": cls, "iscrowd": 0}
    if kpt_shape is not None:
        k, ndim = kpt_shape
        if len(coords) != 4 + k * ndim:
            raise DatasetError(f"{where}: expected class, box and {k}x{ndim} keypoint values, got {len(values)} values")
        points = [coords[4 + i * ndim : 4 + (i + 1) * ndim] for i in range(k)]
        flat = []
        for point in points:
            x, y = point[0] * width, point[1] * height
            visible = point[2] if ndim == 3 else (2.0 if point[0] > 0 or point[1] > 0 else 0.0)
            flat += [x, y, visible] if visible > 0 else [0.0, 0.0, 0.0]
        annotation["keypoints"] = flat
        annotation["num_keypoints"] = sum(1 for v in flat[2::3] if v > 0)
        coords = coords[:4]
    if len(coords) == 4:
        cx, cy, w, h = coords
        box = [(cx - w / 2) * width, (cy - h / 2) * height, w * width, h * height]
        annotation.update(bbox=box, area=box[2] * box[3])
        return annotation
    if len(coords) < 6 or len(coords) % 2:
        raise DatasetError(f"{where}: expected 'class cx cy w h' or a polygon 'class x1 y1 x2 y2 x3 y3 ...'")
    xs, ys = [x * width for x in coords[0::2]], [y * height for y in coords[1::2]]
    polygon = [v for xy in zip(xs, ys, strict=True) for v in xy]
    box = [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)]
    area = 0.5 * abs(sum(xs[i] * ys[i - 1] - xs[i - 1] * ys[i] for i in range(len(xs))))  # shoelace
    annotation.update(bbox=box, area=area, segmentation=[polygon])
    return annotation
