"""The formats pass of `yolojet label` on records written as `label` writes them, without a model: the records read
back a line at a time (a cut last line left out, or cut off), the COCO document streamed from them (checked with
pycocotools), the YOLO label files (checked against ultralytics' own mask polygons), and `plot` sampling from more
records than it draws."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import orjson
import pytest
from support import sigint_as_in_a_terminal
from ultralytics.utils import ASSETS

from yolojet.client import records as recs
from yolojet.client.formats import made_by_label, write_coco, write_yolo_dataset
from yolojet.client.plot import plot
from yolojet.errors import OutputPathError, RecordsError
from yolojet.tasks.segment import encode_rle

NAMES = {0: "person", 1: "bus", 2: "dog"}


def blob_mask(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """An instance-like mask: two overlapping ellipses and a few stray pixels (several outer contours)."""
    yy, xx = np.mgrid[:h, :w]
    mask = np.zeros((h, w), bool)
    for _ in range(2):
        cx, cy, a, b = (
            rng.uniform(0.3 * w, 0.7 * w),
            rng.uniform(0.3 * h, 0.7 * h),
            rng.uniform(5, 40),
            rng.uniform(5, 40),
        )
        mask |= ((xx - cx) / a) ** 2 + ((yy - cy) / b) ** 2 <= 1
    mask[rng.integers(0, h, 3), rng.integers(0, w, 3)] = True
    return mask


def records_file(path: Path, count: int, seed: int = 0) -> list[dict]:
    """`count` records of a segment model over two folders (some with no detections), written as JSON lines."""
    rng = np.random.default_rng(seed)
    written = []
    for i in range(count):
        h, w = int(rng.integers(60, 200)), int(rng.integers(60, 200))
        detections = []
        for _ in range(int(rng.integers(0, 4))):
            x1, y1 = float(rng.uniform(0, w / 2)), float(rng.uniform(0, h / 2))
            box = [
                round(x1, 2),
                round(y1, 2),
                round(x1 + rng.uniform(2, w / 2), 2),
                round(y1 + rng.uniform(2, h / 2), 2),
            ]
            c = int(rng.integers(0, 3))
            detections.append(
                {
                    "class": c,
                    "name": NAMES[c],
                    "confidence": round(float(rng.random()), 5),
                    "box": box,
                    "mask": encode_rle(blob_mask(rng, h, w)),
                }
            )
        folder = "a" if i % 2 else "b/c"
        written.append(
            {"path": f"/photos/{folder}/{i}.jpg", "width": w, "height": h, "task": "segment", "detections": detections}
        )
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in written))
    return written


def test_records_are_read_a_line_at_a_time_and_a_cut_last_line_is_left_out_or_cut_off(tmp_path):
    path = tmp_path / "labels.jsonl"
    written = records_file(path, 40)
    whole = path.read_bytes()
    assert list(recs.iter_records(path)) == written and recs.count_records(path) == 40
    # A kill mid-line, the line longer than the block the repair reads back at a time.
    long_line = orjson.dumps({"path": "x" * 200_000})
    path.write_bytes(whole + long_line[: len(long_line) // 2])
    assert list(recs.iter_records(path)) == written
    recs.repair_records(path)
    assert path.read_bytes() == whole
    recs.repair_records(path)  # whole already: unchanged
    assert path.read_bytes() == whole
    path.write_bytes(long_line[:100])  # not one whole line
    recs.repair_records(path)
    assert path.read_bytes() == b""


def test_coco_document_streamed_from_the_records_loads_in_pycocotools(tmp_path):
    from pycocotools import mask as mask_utils
    from pycocotools.coco import COCO

    path = tmp_path / "labels.jsonl"
    written = records_file(path, 30)
    for rle in (False, True):
        out = tmp_path / f"coco-{rle}.json"
        write_coco(out, path, NAMES, rle=rle)
        document = COCO(str(out))
        assert [i["file_name"] for i in document.dataset["images"]] == [r["path"] for r in written]
        detections = [(i, d) for i, r in enumerate(written, start=1) for d in r["detections"]]
        annotations = document.dataset["annotations"]
        assert [a["id"] for a in annotations] == list(range(1, len(detections) + 1))
        assert [c["name"] for c in document.loadCats(document.getCatIds())] == ["person", "bus", "dog"]
        for ann, (image_id, d) in zip(annotations, detections, strict=True):
            assert ann["image_id"] == image_id and ann["category_id"] == d["class"] and ann["score"] == d["confidence"]
            sent = {"size": d["mask"]["size"], "counts": d["mask"]["counts"].encode()}
            assert ann["area"] == int(mask_utils.area(sent))
            drawn = document.annToMask(ann).astype(bool)
            mask = mask_utils.decode(sent).astype(bool)
            if rle:
                assert np.array_equal(drawn, mask)
            else:  # polygons through the outer border pixels' centres: most of the mask, nothing far outside it
                assert (drawn & mask).sum() / mask.sum() > 0.5
        assert len(annotations) > 20
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging or spool file left


def test_coco_keypoints_are_labeled_points_with_their_visibility(tmp_path):
    """COCO's `num_keypoints` counts labeled points (v > 0: v 2 visible, 1 labeled but not visible), so a person whose
    points the model saw with low visibility still counts them (pycocotools' keypoint evaluation skips a ground-truth
    person with none)."""
    from pycocotools.coco import COCO

    rng = np.random.default_rng(5)
    written = []
    for i in range(6):
        xy = np.round(rng.uniform(0, 90, (17, 2)), 2).tolist()
        points = [[x, y, v] for (x, y), v in zip(xy, rng.random(17).tolist(), strict=True)]
        if i == 0:
            points = [[x, y, 0.1] for x, y, _ in points]  # every point seen with low visibility
        detection = {"class": 0, "name": "person", "confidence": 0.9, "box": [1.0, 2.0, 80.0, 90.0]}
        detection["keypoints"] = points
        written.append({"path": f"/p/{i}.jpg", "width": 100, "height": 100, "task": "pose", "detections": [detection]})
    path = tmp_path / "labels.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in written))
    write_coco(tmp_path / "coco.json", path, {0: "person"})
    annotations = COCO(str(tmp_path / "coco.json")).dataset["annotations"]
    for ann, record in zip(annotations, written, strict=True):
        points = record["detections"][0]["keypoints"]
        assert ann["keypoints"][2::3] == [2 if v >= 0.5 else 1 for _, _, v in points]
        assert ann["keypoints"][0::3] == [x for x, _, _ in points] and ann["num_keypoints"] == 17


def test_yolo_labels_are_ultralytics_mask_polygons_in_mirrored_folders(tmp_path):
    from ultralytics.utils.ops import masks2segments

    from yolojet.tasks.segment import decode_rle

    path = tmp_path / "labels.jsonl"
    written = records_file(path, 12)
    dataset = tmp_path / "dataset"
    assert write_yolo_dataset(dataset, path, NAMES, "segment") == 12
    for record in written:
        relative = Path(record["path"]).relative_to("/photos")
        assert (dataset / "images" / relative).readlink() == Path(record["path"])
        lines = (dataset / "labels" / relative).with_suffix(".txt").read_text().splitlines()
        expected = []
        for d in record["detections"]:
            (polygon,) = masks2segments(decode_rle(d["mask"])[None])
            polygon = np.round(polygon, 2) / np.array([record["width"], record["height"]])
            if len(polygon) >= 3:
                expected.append((d["class"], polygon.reshape(-1)))
        assert len(lines) == len(expected)
        for line, (cls, values) in zip(lines, expected, strict=True):
            fields = line.split()
            assert int(fields[0]) == cls and np.allclose(np.array(fields[1:], float), values, atol=1e-6)
    assert "names:" in (dataset / "data.yaml").read_text()
    # Made again over what is there (a resumed run): the same files, no staging file left beside them.
    before = {p: p.read_bytes() for p in (dataset / "labels").rglob("*.txt")}
    write_yolo_dataset(dataset, path, NAMES, "segment")
    assert {p: p.read_bytes() for p in (dataset / "labels").rglob("*") if p.is_file()} == before


def test_masks_a_pixel_thin_keep_a_polygon_of_the_pixels_they_cover(tmp_path):
    """A dot and a one-pixel line have contours of one and two points, no polygon: each becomes the rectangle of its
    pixels' squares in both formats, rather than a detection with no label line or an empty COCO segmentation."""
    from pycocotools.coco import COCO

    h, w = 40, 50
    dot, stroke = np.zeros((h, w), bool), np.zeros((h, w), bool)
    dot[7, 9] = True
    stroke[20, 10:15] = True
    detections = [
        {"class": c, "name": NAMES[c], "confidence": 0.5, "box": [0.0, 0.0, 1.0, 1.0], "mask": encode_rle(m)}
        for c, m in ((0, dot), (1, stroke))
    ]
    path = tmp_path / "labels.jsonl"
    path.write_bytes(orjson.dumps({"path": "/p/a.jpg", "width": w, "height": h, "task": "segment",
                                   "detections": detections}) + b"\n")  # fmt: skip
    rectangles = {0: [(9, 7), (10, 7), (10, 8), (9, 8)], 1: [(10, 20), (15, 20), (15, 21), (10, 21)]}
    write_yolo_dataset(tmp_path / "dataset", path, NAMES, "segment")
    lines = (tmp_path / "dataset" / "labels" / "a.txt").read_text().splitlines()
    assert [int(line.split()[0]) for line in lines] == [0, 1]
    for line in lines:
        values = np.array(line.split()[1:], float).reshape(-1, 2) * [w, h]
        assert np.allclose(values, rectangles[int(line.split()[0])], atol=1e-3)
    write_coco(tmp_path / "coco.json", path, NAMES)
    document = COCO(str(tmp_path / "coco.json"))
    for ann, mask in zip(document.dataset["annotations"], (dot, stroke), strict=True):
        assert document.annToMask(ann).astype(bool)[mask].all()  # the polygon covers the mask's pixels


def test_plot_samples_from_more_records_than_it_draws(tmp_path):
    from PIL import Image

    path = tmp_path / "labels.jsonl"
    photos = [str(ASSETS / "bus.jpg"), str(ASSETS / "zidane.jpg")]
    records = [
        {"path": photos[i % 2], "width": 810 if i % 2 == 0 else 1280, "height": 1080 if i % 2 == 0 else 720,
         "task": "detect", "detections": [{"class": i % 3, "name": NAMES[i % 3], "confidence": (i % 10) / 10 + 0.05,
                                           "box": [10.0, 20.0, 300.0, 400.0]}]}
        for i in range(50)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    written = plot(path, tmp_path / "plots", samples=6)
    assert [p.name for p in written] == ["grid.png", "classes.png", "scores.png"]
    assert Image.open(tmp_path / "plots" / "grid.png").size == (4 * 320, 2 * 320)  # six tiles, four a row
    first = (tmp_path / "plots" / "grid.png").read_bytes()
    plot(path, tmp_path / "again", samples=6)
    assert (tmp_path / "again" / "grid.png").read_bytes() == first  # seeded: the same sample


@pytest.mark.parametrize("text", ["", "\n\n"])
def test_a_records_file_with_no_records_has_nothing_to_plot(tmp_path, text):
    from yolojet.errors import DatasetError

    path = tmp_path / "labels.jsonl"
    path.write_text(text)
    with pytest.raises(DatasetError, match="no records to plot"):
        plot(path, tmp_path / "plots")


def test_worker_processes_make_the_same_files_as_one_process(tmp_path):
    path = tmp_path / "labels.jsonl"
    records_file(path, 25)
    path.write_bytes(path.read_bytes() + b'{"path": "/photos/cut')  # a kill's last line: left out by every share
    for workers in (1, 3):
        write_coco(tmp_path / f"coco-{workers}.json", path, NAMES, workers=workers)
        assert write_yolo_dataset(tmp_path / f"dataset-{workers}", path, NAMES, "segment", workers=workers) == 25
    assert (tmp_path / "coco-1.json").read_bytes() == (tmp_path / "coco-3.json").read_bytes()
    one, three = tmp_path / "dataset-1" / "labels", tmp_path / "dataset-3" / "labels"
    files = sorted(p.relative_to(one) for p in one.rglob("*.txt"))
    assert len(files) == 25 and files == sorted(p.relative_to(three) for p in three.rglob("*.txt"))
    assert all((one / f).read_bytes() == (three / f).read_bytes() for f in files)
    shares = recs.byte_shares(path, 3)
    assert len(shares) == 3 and shares[0][0] == 0 and shares[-1][1] == path.stat().st_size
    assert sum(len(list(recs.iter_records(path, a, b))) for a, b in shares) == 25


@pytest.mark.skipif(not Path("/dev/fd").is_dir(), reason="names a pipe by /dev/fd")
def test_coco_into_a_special_file_keeps_its_parts_elsewhere(tmp_path):
    """A pipe named by /dev/fd/N (a shell's `--coco >(gzip > c.json.gz)`) is written straight: its folder takes no
    part files, so they and the spool go to the system's temporary folder."""
    import os
    import threading

    path = tmp_path / "labels.jsonl"
    records_file(path, 25)
    write_coco(tmp_path / "plain.json", path, NAMES, workers=2)
    readable, writable = os.pipe()
    read: list[bytes] = []

    def drain() -> None:
        with os.fdopen(readable, "rb") as pipe:
            read.append(pipe.read())

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        write_coco(Path(f"/dev/fd/{writable}"), path, NAMES, workers=2)
    finally:
        os.close(writable)
        reader.join(timeout=60)
    assert read == [(tmp_path / "plain.json").read_bytes()]


def test_images_named_with_a_double_slash_stay_inside_the_dataset(tmp_path):
    """`//tmp/x.jpg` is `/tmp/x.jpg` to Linux, and `os.path.abspath` keeps the `//` that `commonpath` drops: the label
    files must still land below the dataset's folder."""
    path = tmp_path / "labels.jsonl"
    photos = tmp_path / "photos"
    record = {"path": "/" + str(photos / "a.jpg"), "width": 100, "height": 80, "task": "detect", "detections": []}
    path.write_bytes(orjson.dumps(record) + b"\n")
    dataset = tmp_path / "dataset"
    assert write_yolo_dataset(dataset, path, NAMES, "detect") == 1
    assert (dataset / "labels" / "a.txt").read_text() == ""
    assert (dataset / "images" / "a.jpg").readlink() == photos / "a.jpg"


def test_a_record_that_is_not_labels_fails_with_its_name_from_any_worker(tmp_path):
    from yolojet.errors import RecordsError

    path = tmp_path / "labels.jsonl"
    written = records_file(path, 30)
    del written[3]["width"]
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in written))
    for workers in (1, 3):
        with pytest.raises(RecordsError, match=f"the record of {written[3]['path']} is not one yolojet label writes"):
            write_coco(tmp_path / "coco.json", path, NAMES, workers=workers)
        with pytest.raises(RecordsError, match="is not one yolojet label writes"):
            write_yolo_dataset(tmp_path / "dataset", path, NAMES, "segment", workers=workers)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset", "labels.jsonl"]  # no COCO, parts or spool
    path.write_bytes(path.read_bytes() + b"not json\n" + orjson.dumps(written[0]) + b"\n")
    with pytest.raises(RecordsError, match="is not JSON"):
        list(recs.iter_records(path))


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
@pytest.mark.parametrize("how", ["killed", "interrupted"])
def test_workers_stop_when_their_parent_is_killed_or_interrupted(tmp_path, how):
    """A killed labeling process leaves no worker running; a Ctrl-C to it alone stops every share and leaves no part
    files (the script makes the COCO file over and over, so that the signal lands while workers run)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    path = tmp_path / "labels.jsonl"
    records_file(path, 400)
    out = tmp_path / "out"
    out.mkdir()
    script = (
        "import sys; from pathlib import Path; from yolojet.client.formats import write_coco\n"
        "if __name__ == '__main__':\n"
        "    while True:\n"
        f"        write_coco(Path({str(out / 'coco.json')!r}), Path({str(path)!r}), {NAMES!r}, workers=2)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stderr=subprocess.PIPE, preexec_fn=sigint_as_in_a_terminal
    )
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(_children(parent.pid)) < 3 and time.monotonic() < deadline:  # two workers and the resource tracker
            time.sleep(0.05)
        workers = _children(parent.pid)
        assert len(workers) >= 2
        os.kill(parent.pid, signal.SIGKILL if how == "killed" else signal.SIGINT)
        parent.wait(timeout=60)
        while any(Path(f"/proc/{pid}").exists() for pid in workers) and time.monotonic() < deadline + 60:
            time.sleep(0.05)
    finally:  # nothing left running, whatever failed
        if parent.poll() is None:
            parent.kill()
        parent.wait(timeout=60)
        alive = [pid for pid in workers if Path(f"/proc/{pid}").exists()]
        for pid in alive:
            os.kill(pid, signal.SIGKILL)
    assert not alive
    if how == "interrupted":
        assert b"KeyboardInterrupt" in parent.stderr.read()
        assert [p.name for p in out.iterdir() if not p.name.startswith("coco.json")] == []  # no parts, no staging


def test_images_whose_names_differ_only_in_the_suffix_get_label_files_of_their_own(tmp_path):
    """ultralytics finds an image's labels by its name without the suffix: x.jpg and x.png of one folder would share
    x.txt, so their links carry the suffix in the name."""
    path = tmp_path / "labels.jsonl"
    boxes = {"x.jpg": [0.0, 0.0, 10.0, 10.0], "x.png": [50.0, 50.0, 100.0, 100.0], "y.jpg": [5.0, 5.0, 20.0, 20.0]}
    records = [
        {"path": f"/photos/a/{name}", "width": 100, "height": 100, "task": "detect",
         "detections": [{"class": 1, "name": "bus", "confidence": 0.5, "box": box}]}
        for name, box in boxes.items()
    ]  # fmt: skip
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    dataset = tmp_path / "dataset"
    assert write_yolo_dataset(dataset, path, NAMES, "detect") == 3
    labels = sorted(p.name for p in (dataset / "labels").iterdir())
    assert labels == ["x_jpg.txt", "x_png.txt", "y.txt"]
    assert (dataset / "images" / "x_png.png").readlink() == Path("/photos/a/x.png")
    assert (dataset / "labels" / "x_png.txt").read_text() == "1 0.75 0.75 0.5 0.5\n"
    assert (dataset / "labels" / "x_jpg.txt").read_text() == "1 0.05 0.05 0.1 0.1\n"


def test_plot_of_what_is_not_labels_or_of_images_gone(tmp_path, capsys):
    from yolojet.errors import RecordsError

    errors = tmp_path / "labels.jsonl.errors.jsonl"
    errors.write_text('{"path": "a.jpg", "error": "cut short"}\n')
    with pytest.raises(RecordsError, match="no size"):
        plot(errors, tmp_path / "p")
    gone = tmp_path / "gone.jsonl"
    gone.write_text(json.dumps({"path": str(tmp_path / "nowhere.jpg"), "width": 10, "height": 10, "detections": []}))
    gone.write_text(gone.read_text() + "\n")
    (tmp_path / "p").mkdir(exist_ok=True)
    (tmp_path / "p" / "grid.png").write_bytes(b"an earlier plot's")
    written = plot(gone, tmp_path / "p")
    assert [p.name for p in written] == ["classes.png", "scores.png"] and not (tmp_path / "p" / "grid.png").exists()
    assert "1 of the 1 sampled images could not be read" in capsys.readouterr().err


def test_a_dataset_made_again_holds_only_the_new_records_and_a_users_folder_keeps_its_files(tmp_path):
    def records(names: list[str]) -> Path:
        path = tmp_path / f"{len(names)}.jsonl"
        rows = [
            {"path": f"/photos/{name}", "width": 10, "height": 10, "task": "detect",
             "detections": [{"class": 0, "name": "person", "confidence": 0.5, "box": [1.0, 1.0, 5.0, 5.0]}]}
            for name in names
        ]  # fmt: skip
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
        return path

    dataset = tmp_path / "dataset"
    write_yolo_dataset(dataset, records(["a.jpg", "b.jpg", "c.jpg"]), NAMES, "detect")
    write_yolo_dataset(dataset, records(["d.jpg"]), NAMES, "detect")  # an --overwrite run of other images
    assert sorted(p.name for p in (dataset / "labels").iterdir()) == ["d.txt"]
    assert sorted(p.name for p in (dataset / "images").iterdir()) == ["d.jpg"]
    # A dataset of the user's own (their data.yaml, or their label files or images) is never written into.
    users, truth = tmp_path / "users", "0 0.5 0.5 1 1\n"
    (users / "labels").mkdir(parents=True)
    (users / "labels" / "d.txt").write_text(truth)
    (users / "data.yaml").write_text("names:\n  0: person\n")
    with pytest.raises(OutputPathError, match=r"a data\.yaml yolojet label did not write"):
        write_yolo_dataset(users, records(["d.jpg"]), NAMES, "detect")
    (users / "data.yaml").unlink()
    with pytest.raises(OutputPathError, match="labels holds files yolojet label did not make"):
        write_yolo_dataset(users, records(["d.jpg"]), NAMES, "detect")
    assert sorted(users.rglob("*")) == [users / "labels", users / "labels" / "d.txt"]
    assert (users / "labels" / "d.txt").read_text() == truth


def test_label_files_are_where_ultralytics_looks_for_them_below_folders_called_images(tmp_path):
    """Images below a folder of their own called `images` (Roboflow's `train/images/`): each label file is where
    ultralytics' img2label_paths looks for its image's link (its last `/images/` made `/labels/`), and a dataset made
    again removes those too."""
    from ultralytics.data.utils import img2label_paths

    rows = [
        {"path": f"/rf/{part}/images/{name}", "width": 10, "height": 10, "task": "detect",
         "detections": [{"class": 0, "name": "person", "confidence": 0.5, "box": [1.0, 1.0, 5.0, 5.0]}]}
        for part, name in (("train", "bus.jpg"), ("valid", "zidane.jpg"), ("train", "more/x.png"))
    ]  # fmt: skip
    records = tmp_path / "r.jsonl"
    records.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    dataset = tmp_path / "dataset"
    write_yolo_dataset(dataset, records, NAMES, "detect")
    links = sorted(str(p) for p in (dataset / "images").rglob("*") if p.is_symlink())
    assert len(links) == 3
    for label in img2label_paths(links):
        assert Path(label).read_text() == "0 0.3 0.3 0.4 0.4\n", label
    records.write_bytes(b"")  # made again from no records: no label file of the earlier links is left
    write_yolo_dataset(dataset, records, NAMES, "detect")
    assert [p for p in dataset.rglob("*") if p.is_file() or p.is_symlink()] == [dataset / "data.yaml"]


def test_a_dataset_stopped_part_way_is_known_as_labels_own(tmp_path):
    """data.yaml, with label's mark, is written before any link: a run that stops part way (here at a record that is
    not one label writes, a box of three numbers) leaves a folder the next run makes again, not one it refuses or
    whose links it labels as images."""
    good = {"path": "/p/a.jpg", "width": 10, "height": 10, "task": "detect", "detections": []}
    bad = {**good, "path": "/p/b.jpg", "detections": [{"class": 0, "confidence": 0.5, "box": [1.0, 2.0, 3.0]}]}
    records = tmp_path / "r.jsonl"
    records.write_bytes(orjson.dumps(good) + b"\n" + orjson.dumps(bad) + b"\n")
    dataset = tmp_path / "dataset"
    with pytest.raises(RecordsError, match=r"the record of /p/b\.jpg is not one yolojet label writes"):
        write_yolo_dataset(dataset, records, NAMES, "detect", workers=1)
    assert made_by_label(dataset)
    records.write_bytes(orjson.dumps(good) + b"\n")
    write_yolo_dataset(dataset, records, NAMES, "detect")
    assert sorted(p.name for p in (dataset / "labels").rglob("*.txt")) == ["a.txt"]


def test_a_dataset_in_the_current_folder_and_a_folder_that_cannot_be_written(tmp_path, monkeypatch):
    """`--yolo-txt .` (the photos' own folder, given as the current one): its label files are still where
    img2label_paths looks for its links. A dataset that cannot be written (a file where `labels/` should be) is said as
    the output's failure, never as a bad record."""
    from ultralytics.data.utils import img2label_paths

    row = {"path": str(tmp_path / "a.jpg"), "width": 10, "height": 10, "task": "detect",
           "detections": [{"class": 0, "name": "person", "confidence": 0.5, "box": [1.0, 1.0, 5.0, 5.0]}]}  # fmt: skip
    records = tmp_path / "r.jsonl"
    records.write_bytes(orjson.dumps(row) + b"\n")
    monkeypatch.chdir(tmp_path)
    write_yolo_dataset(Path("."), records, NAMES, "detect")
    (link,) = [str(p.absolute()) for p in (tmp_path / "images").iterdir()]
    assert Path(img2label_paths([link])[0]).read_text() == "0 0.3 0.3 0.4 0.4\n"
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "labels").write_text("a file, not a folder")
    with pytest.raises(OutputPathError, match=r"--yolo-txt .*blocked.*cannot write"):
        write_yolo_dataset(blocked, records, NAMES, "detect", workers=1)
