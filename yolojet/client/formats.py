"""COCO annotations and YOLO label files made from `yolojet label`'s records.

COCO (`write_coco`): `images` (id, file_name = the record's path, width, height), `categories` from the model's
class names (id = class id), and one annotation a detection: `bbox` [x, y, w, h], `area`, `score`, `iscrowd` 0;
segment models add `segmentation` as the polygons of the mask's outer contours (holes are not drawn; a mask a pixel
thin, whose contour has fewer than three points, gets the rectangle its pixels cover) or, with
`rle`, the mask's COCO RLE, exact; pose models add `keypoints` [x, y, v] a point (v 2 where the
model's visibility is at least 0.5, else 1) and `num_keypoints`; OBB models the four corners as the
`segmentation` polygon and the axis-aligned extent as `bbox`, both clipped to the image as detect's boxes are (a
box past the border is where a COCO tool draws or crops nothing), and `rotated_box` [cx, cy, w, h, angle] as the
model gave it.

YOLO (`write_yolo_dataset`): an ultralytics dataset folder: `images/` (links to the labeled images, mirroring their
folders below their common root), `labels/` (one .txt a labeled image: `class cx cy w h` normalized; the polygon for
segment models; the box and `x y v` per keypoint for pose; the 8 corner coordinates for OBB, clipped to the
image), and `data.yaml` naming the classes (and `kpt_shape` for pose), ready for `yolo train data=.../data.yaml`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import orjson

from yolojet.client.records import byte_shares, iter_records
from yolojet.client.shares import Report, run_shares, share_records, worker_count
from yolojet.errors import OutputPathError, RecordsError, YolojetError
from yolojet.outputs import is_special, is_stdout, write_atomically, write_small_file
from yolojet.progress import Progress
from yolojet.tasks.obb import xywhr_to_corners
from yolojet.tasks.segment import merge_contours, rle_area, rle_contours

# The first line of a dataset's data.yaml this module made: a later pass may clear what it holds.
DATASET_MARK = "# made by yolojet label from its JSON lines: made again from them by each run"
VISIBLE = 0.5  # a keypoint's visibility at or above this is COCO's / YOLO's v = 2 (visible), else 1


def _corners(detection: dict) -> np.ndarray:
    return xywhr_to_corners(np.asarray(detection["rotated_box"], np.float64))


def _extent(detection: dict) -> list[float]:
    """[x1, y1, x2, y2] of a detection: its box, or its rotated box's corners' bounds."""
    if "box" in detection:
        return list(detection["box"])
    corners = _corners(detection)
    return [*corners.min(0).tolist(), *corners.max(0).tolist()]


def _thick(points: np.ndarray) -> np.ndarray:
    """A contour as a polygon: itself, or where it has one or two points (a mask a pixel thin: a dot, a line) the
    rectangle its pixels cover, so that no detection is left without one."""
    if len(points) >= 3 or len(points) == 0:
        return points
    (x0, y0), (x1, y1) = points.min(0), points.max(0)
    return np.array([[x0, y0], [x1 + 1, y0], [x1 + 1, y1 + 1], [x0, y1 + 1]], np.float32)


def _polygon(mask_rle: dict) -> list[float]:
    """One polygon through every outer contour of the mask (ultralytics' masks2segments): a YOLO label line."""
    points = _thick(merge_contours(rle_contours(mask_rle)))
    return [round(float(v), 2) for v in points.reshape(-1)]


def _polygons(mask_rle: dict) -> list[list[float]]:
    """A polygon an outer contour of the mask: a COCO segmentation."""
    return [[round(float(v), 2) for v in _thick(c).reshape(-1)] for c in rle_contours(mask_rle) if len(c)]


def _coco_annotations(record: dict, rle: bool) -> list[dict[str, Any]]:
    """A record's detections as COCO annotations, less their `id` and `image_id` (given when the document is put
    together, in order)."""
    annotations: list[dict[str, Any]] = []
    border = np.array([record["width"], record["height"]], np.float64)
    for d in record.get("detections", []):
        x1, y1, x2, y2 = _extent(d)
        if "rotated_box" in d:  # its corners may be past the image (detect's boxes are clipped by the model's path)
            (x1, y1), (x2, y2) = np.clip([[x1, y1], [x2, y2]], 0.0, border).tolist()
        ann: dict[str, Any] = {
            "category_id": d["class"],
            "bbox": [round(x1, 2), round(y1, 2), round(x2 - x1, 2), round(y2 - y1, 2)],
            "area": round((x2 - x1) * (y2 - y1), 2),
            "score": d["confidence"],
            "iscrowd": 0,
        }
        if "mask" in d:
            ann["area"] = rle_area(d["mask"])
            ann["segmentation"] = d["mask"] if rle else _polygons(d["mask"])
        if "rotated_box" in d:
            ann["rotated_box"] = d["rotated_box"]
            ann["segmentation"] = [[round(float(v), 2) for v in np.clip(_corners(d), 0.0, border).reshape(-1)]]
            ann["area"] = round(d["rotated_box"][2] * d["rotated_box"][3], 2)
        if "keypoints" in d:
            flat = []
            for x, y, visibility in d["keypoints"]:
                flat += [x, y, 2 if visibility >= VISIBLE else 1]
            ann["keypoints"] = flat
            ann["num_keypoints"] = sum(1 for v in flat[2::3] if v > 0)  # COCO: labeled points (v > 0)
        annotations.append(ann)
    return annotations


def _coco_share(records: str, start: int, end: int, rle: bool, part: str, report: Report | None = None) -> int:
    """One share of the records as COCO entries, a line each in `part`: `I` and an image's entry, then `A` and each of
    its annotations, without their ids."""
    done = 0
    with open(part, "wb", buffering=1 << 20) as out:
        for record in share_records(records, start, end, report):
            with _as_a_record(records, record):
                image = {"file_name": record["path"], "width": record["width"], "height": record["height"]}
                entries = [b"I" + orjson.dumps(image) + b"\n"]
                entries += [b"A" + orjson.dumps(ann) + b"\n" for ann in _coco_annotations(record, rle)]
            out.write(b"".join(entries))
            done += 1
    return done


def write_coco(
    path: Path,
    records: Path,
    names: dict[int, str],
    rle: bool = False,
    progress: Progress | None = None,
    workers: int | None = None,
) -> None:
    """The COCO document of a JSON-lines output's records, written atomically. Shares of the records are made into
    entries by worker processes (`workers`; by default several for many records), in part files in a temporary
    folder beside the output, then put together in order, each image and annotation numbered from 1: the images, then
    the annotations (spooled there meanwhile), then the categories. Memory stays that of a record however many there
    are."""
    shares = byte_shares(records, worker_count(records, workers))

    def write(staging: Path) -> None:
        with _scratch_folder(staging) as scratch:
            parts = [os.path.join(scratch, f"part{k}") for k in range(len(shares))]
            args = [(str(records), start, end, rle, part) for (start, end), part in zip(shares, parts, strict=True)]
            run_shares(_coco_share, args, progress, f"--coco {path}")
            if is_stdout(path):  # `-`: through the stream itself, after whatever was printed there before
                sys.stdout.flush()
                _put_together(sys.stdout.buffer, parts, names, scratch)
                sys.stdout.buffer.flush()
            else:
                with open(staging, "wb", buffering=1 << 20) as out:
                    _put_together(out, parts, names, scratch)

    if is_stdout(path):
        write(path)
    else:
        write_atomically(path, write)


def _scratch_folder(staging: Path) -> tempfile.TemporaryDirectory:
    """A temporary folder beside the output's staging file (the parts can be as large as the document), or the
    system's where that folder cannot take one: standard output's, a special file's (`/dev/fd/63`, a FIFO in a
    folder not ours)."""
    if not is_stdout(staging) and not is_special(staging):
        try:
            return tempfile.TemporaryDirectory(prefix=".yolojet-coco-", dir=staging.parent)
        except OSError:
            pass
    return tempfile.TemporaryDirectory(prefix="yolojet-coco-")


def _put_together(out: BinaryIO, parts: list[str], names: dict[int, str], scratch: str) -> None:
    with tempfile.TemporaryFile(dir=scratch) as spool:
        out.write(b'{"images":[')
        image_id = annotation_id = 0
        for part in parts:
            with open(part, "rb", buffering=1 << 20) as entries:
                for line in entries:  # b'I{"file_name":...}\n' -> {"id":N,"file_name":...}
                    if line[:1] == b"I":
                        image_id += 1
                        out.write(b"," if image_id > 1 else b"")
                        out.write(b'{"id":%d,' % image_id + line[2:-1])
                    else:
                        annotation_id += 1
                        spool.write(b"," if annotation_id > 1 else b"")
                        spool.write(b'{"id":%d,"image_id":%d,' % (annotation_id, image_id) + line[2:-1])
        out.write(b'],"annotations":[')
        spool.seek(0)
        shutil.copyfileobj(spool, out, 1 << 20)
        categories = [{"id": c, "name": names[c]} for c in sorted(names)]
        out.write(b'],"categories":' + orjson.dumps(categories) + b"}")


@contextlib.contextmanager
def _as_a_record(records: str, record: dict) -> Iterator[None]:
    """A record missing what `yolojet label` writes (a file edited by hand, or another tool's) as a RecordsError
    naming it, not a KeyError from deep inside."""
    try:
        yield
    except YolojetError:  # the output's own failures (a folder that cannot be written), not the record's
        raise
    except (KeyError, TypeError, IndexError, AttributeError, ValueError) as e:
        named = f"{records}: the record of {record.get('path')}"
        raise RecordsError(f"{named} is not one yolojet label writes ({e!r})") from e


def _label_lines(record: dict) -> list[str]:
    w, h = record["width"], record["height"]
    scale = np.array([w, h], np.float64)
    lines = []
    for d in record.get("detections", []):
        values: list[float]
        if "rotated_box" in d:
            # Corners past the image's border are clipped to it: ultralytics refuses label coordinates outside [0, 1].
            values = np.clip(_corners(d) / scale, 0.0, 1.0).reshape(-1).tolist()
        elif "mask" in d:
            polygon = np.asarray(_polygon(d["mask"]), np.float64).reshape(-1, 2) / scale
            if len(polygon) == 0:  # an empty mask: nothing to draw
                continue
            values = polygon.reshape(-1).tolist()
        else:
            x1, y1, x2, y2 = d["box"]
            values = [(x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h]
            if "keypoints" in d:
                values += [c for x, y, v in d["keypoints"] for c in (x / w, y / h, 2.0 if v >= VISIBLE else 1.0)]
        # Python floats, not numpy's, are formatted: a third of the time a value.
        lines.append(" ".join([str(d["class"]), *(f"{v:.6f}".rstrip("0").rstrip(".") or "0" for v in values)]))
    return lines


def _absolute(path: str) -> str:
    """`path` made absolute as `os.path.commonpath` writes it: a leading `//`, which `abspath` keeps (POSIX leaves its
    meaning to the system; Linux reads it as `/`), as `/`."""
    absolute = os.path.abspath(path)
    return os.sep + absolute.lstrip(os.sep) if absolute.startswith(os.sep * 2) else absolute


def _stem_key(source: str) -> int:
    """A stable digest of an image's folder and name without its suffix: what its label file's name is made of.
    (Python's own string hash differs from process to process.)"""
    stem = os.path.splitext(source)[0].encode("utf-8", "surrogateescape")
    return int.from_bytes(hashlib.blake2b(stem, digest_size=8).digest(), "big")


def label_file_of(image: str) -> str:
    """Where ultralytics looks for an image's labels (its `img2label_paths`): the image's path with its last
    `/images/` made `/labels/` and its suffix `.txt`. Below a folder itself called `images` (Roboflow's
    `train/images/`) that is beside the image's folder, not under the dataset's `labels/`."""
    images, labels = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    return os.path.splitext(labels.join(image.rsplit(images, 1)))[0] + ".txt"


class _DatasetFiles:
    """A YOLO dataset folder's files, a record at a time: its image's link under `images/` and its label file under
    `labels/`, at the image's path below `root` (the labeled images' common folder); each folder is made once.

    ultralytics finds an image's labels by its name without the suffix, so images of one folder whose names differ
    only there (`x.jpg`, `x.png`) would share a label file: their links are named with the suffix in the name,
    `x_jpg.jpg` and `x_png.png` (`clashing`: their `_stem_key`s)."""

    def __init__(self, folder: Path, root: str, clashing: frozenset[int] = frozenset()) -> None:
        self.folder = folder
        self.images, self.labels = str(folder / "images"), str(folder / "labels")
        self.root = root if root.endswith(os.sep) else root + os.sep
        self.clashing = clashing
        self.made: set[str] = set()

    def _in_folder(self, path: str) -> str:
        folder = os.path.dirname(path)
        if folder not in self.made:
            os.makedirs(folder, exist_ok=True)
            self.made.add(folder)
        return path

    def write(self, record: dict) -> None:
        source = _absolute(record["path"])
        if not source.startswith(self.root):  # never a path outside the dataset's folders
            raise OutputPathError(f"--yolo-txt {self.folder}: {source} is not below the images' folder {self.root}")
        relative = source[len(self.root) :]
        if self.clashing and _stem_key(source) in self.clashing:
            stem, suffix = os.path.splitext(relative)
            relative = f"{stem}_{suffix.lstrip('.')}{suffix}"
        text = "".join(line + "\n" for line in _label_lines(record))
        try:
            try:
                os.symlink(source, self._in_folder(os.path.join(self.images, relative)))
            except FileExistsError:  # linked by an earlier run (or the user's own file there): kept
                pass
            link = os.path.join(self.images, relative)
            write_small_file(self._in_folder(label_file_of(link)), text.encode())
        except OSError as e:
            where = e.filename or relative
            raise OutputPathError(f"--yolo-txt {self.folder}: cannot write {where} ({e.strerror})") from e
        except OutputPathError as e:
            raise OutputPathError(f"--yolo-txt {self.folder}: {e}") from e


def _yolo_share(
    folder: str, root: str, clashing: frozenset[int], records: str, start: int, end: int, report: Report | None = None
) -> int:
    """One share of the records' label files and image links."""
    files = _DatasetFiles(Path(folder), root, clashing)
    done = 0
    for record in share_records(records, start, end, report):
        with _as_a_record(records, record):
            files.write(record)
        done += 1
    return done


def write_yolo_dataset(
    folder: Path,
    records: Path,
    names: dict[int, str],
    task: str,
    kpt_shape: list[int] | None = None,
    progress: Progress | None = None,
    workers: int | None = None,
) -> int:
    """Label files (each written atomically) and image links for a JSON-lines output's records, then data.yaml;
    returns the number of label files written. A first pass finds the images' common folder; then shares of the
    records are written by worker processes (`workers`; by default several for many records)."""
    if task == "classify":
        raise OutputPathError("--yolo-txt: a classification dataset is folders of images by class, not label files")
    # Absolute: a label file goes where its link's last `/images/` is made `/labels/`, which `images/x.jpg` lacks.
    folder = folder.absolute()
    shares = byte_shares(records, worker_count(records, workers))
    folders: set[str] = set()
    stems: set[int] = set()
    clashing: set[int] = set()
    for record in iter_records(records) if records.is_file() else ():
        source = _absolute(record["path"])
        folders.add(os.path.dirname(source))
        key = _stem_key(source)
        (clashing if key in stems else stems).add(key)
    root = os.path.commonpath(list(folders)) if folders else os.getcwd()
    check_dataset_folder(folder)
    _clear_earlier_dataset(folder)
    # data.yaml, with the mark, before any link: a run stopped part way leaves a folder the next run knows as its own
    # (to make again, and whose links are not labeled as sources).
    lines = [DATASET_MARK, f"path: {folder.absolute()}", "train: images", "val: images"]
    if kpt_shape:
        lines.append(f"kpt_shape: [{kpt_shape[0]}, {kpt_shape[1]}]")
    lines.append("names:")
    lines += [f"  {c}: {_yaml_string(names[c])}" for c in sorted(names)]
    yaml_text = "\n".join(lines) + "\n"
    write_atomically(folder / "data.yaml", lambda p: p.write_text(yaml_text))
    args = [(str(folder), root, frozenset(clashing), str(records), start, end) for start, end in shares]
    return sum(run_shares(_yolo_share, args, progress, f"--yolo-txt {folder}"))


def made_by_label(folder: Path) -> bool:
    """Whether `folder` holds a dataset this pass made (its data.yaml begins with DATASET_MARK)."""
    try:
        with open(folder / "data.yaml", encoding="utf-8") as yaml:
            return yaml.readline().rstrip("\n") == DATASET_MARK
    except (OSError, UnicodeDecodeError):
        return False


def check_dataset_folder(folder: Path) -> None:
    """A YOLO dataset is written only where it replaces nothing of the user's: into a folder label made before (made
    again), or one with no data.yaml and no files under `images/` or `labels/` (a new folder, or the photos' own).
    Anything else is a dataset of the user's own (its labels, its data.yaml), which it must not replace or mix with.
    Checked before any image is labeled, and again before the folder is written."""
    if made_by_label(folder):
        return
    if os.path.lexists(folder / "data.yaml"):
        raise OutputPathError(
            f"--yolo-txt {folder}: holds a data.yaml yolojet label did not write (a dataset of your own?), which it "
            "would replace: give another folder"
        )
    for part in ("images", "labels"):
        try:
            with os.scandir(folder / part) as entries:
                empty = next(entries, None) is None
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as e:
            raise OutputPathError(f"--yolo-txt {folder}: cannot read {folder / part} ({e.strerror})") from e
        if not empty:
            raise OutputPathError(
                f"--yolo-txt {folder}: {folder / part} holds files yolojet label did not make, which it would replace "
                "or mix with its own: give another folder"
            )


def _clear_earlier_dataset(folder: Path) -> None:
    """A dataset label made before loses its image links and their label files, so that the new one is made from this
    output alone, not merged with images the output no longer holds."""
    if not made_by_label(folder):
        return
    for here, _, names in os.walk(folder / "images"):
        for name in names:
            link = os.path.join(here, name)
            if os.path.islink(link):
                os.unlink(link)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(label_file_of(link))
    for here, _, names in os.walk(folder / "labels"):
        for name in names:
            if name.endswith(".txt"):
                os.unlink(os.path.join(here, name))


def _yaml_string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'
