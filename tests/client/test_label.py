"""`yolojet label` against a real server on 127.0.0.1 and on a local engine: JSON lines, COCO (loaded by
pycocotools, polygons that rasterize to the masks the server sent) and a YOLO dataset (read by ultralytics' own
label loader) on the shipped photos; the same records both ways; a run killed with SIGKILL and resumed gives each
image exactly once; bad files go to the error log and the run goes on; an unreachable server is reported with what
was done; the bench mode."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from support import OpenStream, RunningServer, calibrated_model, detection_pairs, run_cli, served
from ultralytics.utils import ASSETS

import yolojet
from yolojet.client.label import DEFAULT_OPTIONS
from yolojet.engine.predict_path import PredictOptions
from yolojet.serve.server import ServeOptions

CONF = "0.001"


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("label_models")
    return {
        task: yolojet.export(calibrated_model(cfg, 320), out=root / task, imgsz=320)
        for task, cfg in {
            "detect": "yolov8n.yaml",
            "segment": "yolov8n-seg.yaml",
            "pose": "yolov8n-pose.yaml",
            "obb": "yolov8n-obb.yaml",
        }.items()
    }


@pytest.fixture(scope="module")
def server(model_dirs):
    models = {task: served(task, path) for task, path in model_dirs.items()}
    running = RunningServer(models, replace(ServeOptions(), port=0, slo_ms=60_000))
    yield running
    running.stop()


@pytest.fixture
def photos(tmp_path) -> Path:
    folder = tmp_path / "photos" / "images"
    folder.mkdir(parents=True)
    for name in ("bus.jpg", "zidane.jpg"):
        shutil.copy(ASSETS / name, folder / name)
    (folder / "nested").mkdir()
    shutil.copy(ASSETS / "bus.jpg", folder / "nested" / "bus_again.jpg")
    return folder


@pytest.fixture(autouse=True)
def cpu(monkeypatch, tmp_path):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("YOLOJET_CACHE", str(tmp_path / "cache"))


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("task", ["detect", "segment", "pose", "obb"])
def test_server_records_coco_and_yolo_files(server, photos, tmp_path, capsys, task):
    out, coco, dataset = tmp_path / "labels.jsonl", tmp_path / "coco.json", tmp_path / "dataset"
    code, _, stderr = run_cli(
        capsys,
        "label",
        photos,
        "--server",
        server.address,
        "--model",
        task,
        "--out",
        out,
        "--coco",
        coco,
        "--yolo-txt",
        dataset,
        "--conf",
        CONF,
        "-c",
        "4",
    )
    assert code == 0, stderr
    assert "3 images labeled" in stderr and "0 errors" in stderr
    records = lines(out)
    assert sorted(Path(r["path"]).name for r in records) == ["bus.jpg", "bus_again.jpg", "zidane.jpg"]
    engine = server.server.models[task].engine
    for record in records:
        (want,) = engine([record["path"]], conf=float(CONF))
        assert (record["height"], record["width"]) == want.orig_shape and record["task"] == task
        assert record["model"] == task and record["model_version"] == server.server.models[task].version
        assert len(record["detections"]) == len(want)
    assert sum(len(r["detections"]) for r in records) > 0

    from pycocotools.coco import COCO

    document = COCO(str(coco))
    assert len(document.getImgIds()) == 3 and len(document.getAnnIds()) == sum(len(r["detections"]) for r in records)
    assert {c["id"]: c["name"] for c in document.loadCats(document.getCatIds())}[0] == engine.names[0]
    if task == "segment":
        import cv2
        from pycocotools import mask as mask_utils
        from scipy.ndimage import binary_fill_holes

        from yolojet.tasks.segment import decode_rle

        checked = 0
        for record in records:
            image_id = next(i["id"] for i in document.dataset["images"] if i["file_name"] == record["path"])
            annotations = document.loadAnns(document.getAnnIds(imgIds=[image_id]))
            for ann, d in zip(annotations, record["detections"], strict=True):
                # The polygons are OpenCV's outer contours of the mask the server sent (through the border pixels'
                # centres): drawn by pycocotools they cover what OpenCV's own contours of it do, and most of the mask
                # with its holes filled (polygons draw no holes, and lose half a pixel at every border).
                sent = decode_rle(d["mask"])
                contours, _ = cv2.findContours(sent.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
                reference = [c.reshape(-1).astype(float).tolist() for c in contours if len(c) >= 3]
                if not reference:
                    continue
                drawn = document.annToMask(ann).astype(bool)
                h, w = sent.shape
                expected = mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects(reference, h, w))).astype(bool)
                assert np.array_equal(drawn, expected)
                filled = binary_fill_holes(sent)
                assert (drawn & filled).sum() / (drawn | filled).sum() > 0.6
                checked += 1
        assert checked > 0
    if task == "pose":
        assert all(len(a["keypoints"]) == 17 * 3 for a in document.dataset["annotations"])
    if task == "obb":  # corners clipped to the image (some are past it at this conf), the rotated box as predicted
        from yolojet.tasks.obb import xywhr_to_corners

        past = 0
        for image in document.dataset["images"]:
            record = next(r for r in records if r["path"] == image["file_name"])
            annotations = document.loadAnns(document.getAnnIds(imgIds=[image["id"]]))
            for ann, d in zip(annotations, record["detections"], strict=True):
                corners = xywhr_to_corners(np.asarray(d["rotated_box"], np.float64))
                past += bool((corners < 0).any() or (corners > [image["width"], image["height"]]).any())
                clipped = np.clip(corners, 0, [image["width"], image["height"]])
                np.testing.assert_allclose(np.reshape(ann["segmentation"], (4, 2)), clipped, atol=0.01)
                (x1, y1), (x2, y2) = clipped.min(0), clipped.max(0)
                np.testing.assert_allclose(ann["bbox"], [x1, y1, x2 - x1, y2 - y1], atol=0.02)
                assert ann["rotated_box"] == d["rotated_box"]
        assert past > 0

    from ultralytics.data.utils import verify_image_label

    data_yaml = (dataset / "data.yaml").read_text()
    assert "names:" in data_yaml and (task != "pose" or "kpt_shape: [17, 3]" in data_yaml)
    for record in records:
        relative = Path(record["path"]).relative_to(photos)
        image, label = dataset / "images" / relative, (dataset / "labels" / relative).with_suffix(".txt")
        assert image.is_symlink() and label.is_file()
        keypoints = task == "pose"
        checked_label = verify_image_label(
            (
                str(image),
                str(label),
                "",
                keypoints,
                len(engine.names),
                17 if keypoints else 0,
                3 if keypoints else 0,
                False,
            )
        )
        assert checked_label[-1] == "" or "duplicate" in checked_label[-1], checked_label[-1]  # no error message
        ours = [line.split() for line in label.read_text().splitlines()]
        assert len(ours) <= len(record["detections"])
        if task in ("detect", "obb", "pose"):  # one line a detection; ultralytics drops lines that are the same
            assert len(ours) == len(record["detections"])
            unique = np.unique(np.array(ours, dtype=np.float32), axis=0)
            assert len(checked_label[1]) == len(unique)


def test_local_gives_the_records_the_server_does(server, model_dirs, photos, tmp_path, capsys):
    remote, local = tmp_path / "remote.jsonl", tmp_path / "local.jsonl"
    assert (
        run_cli(
            capsys, "label", photos, "--server", server.address, "--model", "detect", "--out", remote, "--conf", CONF
        )[0]
        == 0
    )
    code, _, stderr = run_cli(
        capsys, "label", photos, "--local", "--model", model_dirs["detect"], "--out", local, "--conf", CONF, "-c", "2"
    )
    assert code == 0, stderr
    ours = {r["path"]: r for r in lines(local)}
    theirs = {r["path"]: r for r in lines(remote)}
    assert ours.keys() == theirs.keys()
    for path, record in ours.items():
        other = theirs[path]
        assert {k: v for k, v in record.items() if k != "detections"} == {
            k: v for k, v in other.items() if k != "detections"
        }
        if not torch.cuda.is_available():  # fp32 torch ops both: the same detections in the same order
            assert [d["class"] for d in record["detections"]] == [d["class"] for d in other["detections"]]
            np.testing.assert_allclose(
                [d["box"] for d in record["detections"]], [d["box"] for d in other["detections"]], atol=0.02
            )
        else:  # fp16 kernels at other batch sizes: a score near a threshold may fall either side of it, and boxes
            # spanning the image (random weights) move by a pixel
            rows = [
                torch.tensor([[*d["box"], d["confidence"], d["class"]] for d in r["detections"]]).reshape(-1, 6)
                for r in (record, other)
            ]
            for mine, them in (rows, rows[::-1]):  # each box clear of 0.003 has its twin above 0.002 on the other side
                pairs = detection_pairs(mine[mine[:, 4] >= 0.002], them[them[:, 4] >= 0.003], iou_min=0.97, px_tol=1.0)
                assert all(j is not None for j, _ in pairs), f"{path}: {pairs}"


def test_bad_files_go_to_the_error_log_and_the_rest_is_labeled(server, photos, tmp_path, capsys):
    (photos / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    (photos / "half.jpg").write_bytes((ASSETS / "bus.jpg").read_bytes()[:9000])
    (photos / "folder.jpg").mkdir()  # a directory named like an image: searched like any folder
    shutil.copy(ASSETS / "zidane.jpg", photos / "folder.jpg" / "inside.jpg")
    (photos / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")  # a link to nothing: unreadable
    listed = tmp_path / "list.txt"  # a list naming an image the folder has already (labeled once) and a missing one
    listed.write_text("photos/images/zidane.jpg\n# a comment\n\nphotos/images/missing.jpg\n")
    out = tmp_path / "labels.jsonl"
    code, _, stderr = run_cli(
        capsys, "label", photos, listed, "--server", server.address, "--model", "detect", "--out", out, "--quiet"
    )
    assert code == 1
    labeled = sorted(Path(r["path"]).name for r in lines(out))
    assert labeled == ["bus.jpg", "bus_again.jpg", "inside.jpg", "zidane.jpg"]
    errors = {Path(e["path"]).name: e["error"] for e in lines(tmp_path / "labels.jsonl.errors.jsonl")}
    assert sorted(errors) == ["broken.jpg", "gone.jpg", "half.jpg", "missing.jpg"]
    assert "cut short" in errors["half.jpg"] and "cannot decode" in errors["broken.jpg"]
    # Named by their paths, not by the request ids label gave them.
    assert all("request" not in e for e in errors.values())
    assert all(e.startswith(str(photos)) for name, e in errors.items() if name in ("half.jpg", "broken.jpg"))
    assert "no such file" in errors["gone.jpg"] and "no such file" in errors["missing.jpg"]
    assert "4 errors" in stderr


def test_many_errors_are_named_on_the_terminal_up_to_a_bound_and_all_in_the_log(server, tmp_path, capsys):
    from yolojet.client.label import ERRORS_SHOWN

    folder = tmp_path / "bad"
    folder.mkdir()
    for i in range(ERRORS_SHOWN + 5):
        (folder / f"{i:02d}.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    out = tmp_path / "labels.jsonl"
    code, _, stderr = run_cli(capsys, "label", folder, "--server", server.address, "--model", "detect", "--out", out)
    assert code == 1
    assert stderr.count(": error: ") == ERRORS_SHOWN
    assert f"more than {ERRORS_SHOWN} errors: the others go to {out}.errors.jsonl only" in stderr
    assert len(lines(tmp_path / "labels.jsonl.errors.jsonl")) == ERRORS_SHOWN + 5
    assert f"{ERRORS_SHOWN + 5} errors" in stderr


def test_outputs_are_protected_and_resume_checks_the_model(server, model_dirs, photos, tmp_path, capsys):
    out = tmp_path / "labels.jsonl"
    base = ["label", photos, "--server", server.address, "--model", "detect", "--out", out, "--quiet"]
    assert run_cli(capsys, *base)[0] == 0
    code, _, stderr = run_cli(capsys, *base)
    assert code == 2 and "holds records already; --resume continues it, --overwrite replaces it" in stderr
    code, _, stderr = run_cli(capsys, *base, "--resume")
    assert code == 0 and "0 images labeled" in stderr and "3 done before and skipped" in stderr
    code, _, stderr = run_cli(
        capsys, "label", photos, "--server", server.address, "--model", "pose", "--out", out, "--resume"
    )
    assert code == 2 and "its records come from model detect" in stderr
    assert len(lines(out)) == 3
    assert run_cli(capsys, *base, "--overwrite")[0] == 0 and len(lines(out)) == 3


def test_resume_asks_for_the_options_the_records_were_made_with(server, photos, tmp_path, capsys):
    out = tmp_path / "labels.jsonl"
    base = ["label", photos, "--server", server.address, "--model", "detect", "--out", out, "--quiet"]
    assert run_cli(capsys, *base, "--conf", "0.3", "--classes", "0", "5")[0] == 0
    with out.open("ab") as f:  # a line a kill cut short, which only an accepted resume cuts off
        f.write(b'{"path": "cut sh')
    before = out.read_bytes()
    code, _, stderr = run_cli(capsys, *base, "--resume", "--conf", "0.5")
    assert code == 2 and "its records were made with --classes 0 5 --conf 0.3; this run asks for --conf 0.5" in stderr
    code, _, stderr = run_cli(capsys, *base, "--resume")
    assert code == 2 and "this run asks for no --conf, --iou, --max-det or --classes" in stderr
    assert out.read_bytes() == before  # refused before any change
    code, _, stderr = run_cli(capsys, *base, "--resume", "--classes", "0", "5", "--conf", "0.3")
    assert code == 0 and "3 done before and skipped" in stderr
    # A new run's options replace the kept ones; a settings file that is not label's is named, not trusted.
    assert run_cli(capsys, *base, "--overwrite")[0] == 0
    assert run_cli(capsys, *base, "--resume")[0] == 0
    (tmp_path / "labels.jsonl.settings.json").write_text("{not json")
    code, _, stderr = run_cli(capsys, *base, "--resume")
    assert code == 2 and "labels.jsonl.settings.json: not the settings label keeps" in stderr
    # Settings kept by a run stopped before its first record are this run's to replace, not to hold it to.
    (tmp_path / "labels.jsonl.settings.json").write_text('{"options": {"max_det": 5}}\n')
    out.write_bytes(b"")
    code, _, stderr = run_cli(capsys, *base, "--resume", "--max-det", "2")
    assert code == 0 and len(lines(out)) == 3, stderr
    code, _, stderr = run_cli(capsys, *base, "--resume", "--max-det", "5")
    assert code == 2 and "its records were made with --max-det 2" in stderr
    # A default named on the resume of a run that left it out, or left out on the resume of one that named it, is the
    # same run: the client's defaults are the engine's.
    assert DEFAULT_OPTIONS == {name: getattr(PredictOptions(), name) for name in DEFAULT_OPTIONS}
    assert run_cli(capsys, *base, "--overwrite", "--max-det", "2")[0] == 0
    code, _, stderr = run_cli(capsys, *base, "--resume", "--max-det", "2", "--conf", "0.25", "--iou", "0.7")
    assert code == 0 and "3 done before and skipped" in stderr
    assert run_cli(capsys, *base, "--overwrite", "--conf", "0.25", "--max-det", "300")[0] == 0
    code, _, stderr = run_cli(capsys, *base, "--resume")
    assert code == 0 and "3 done before and skipped" in stderr


def test_ctrl_c_while_writing_the_formats_says_every_image_is_labeled(server, photos, tmp_path, capsys, monkeypatch):
    """Ctrl-C after the last image, while the COCO file is written (its writer interrupted as it starts), ends the
    run with 130 and says the records are whole and what --resume does, not 'after 0 images'."""
    from yolojet.client import formats

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(formats, "write_coco", interrupted)
    out = tmp_path / "labels.jsonl"
    base = ["label", photos, "--server", server.address, "--model", "detect", "--out", out, "--quiet"]
    code, _, stderr = run_cli(capsys, *base, "--coco", tmp_path / "c.json")
    assert code == 130 and len(lines(out)) == 3, stderr
    assert f"while writing the formats: every image is labeled in {out}; --resume writes" in stderr


def test_one_run_at_a_time_writes_an_output(server, photos, tmp_path, capsys):
    """A second run on an --out another run holds (here this process's lock, as a run started beside it would see
    it) is refused before it loads or labels anything; the first run's file is left as it was."""
    from yolojet.client.label import sole_writer

    out = tmp_path / "labels.jsonl"
    base = ["label", photos, "--server", server.address, "--model", "detect", "--out", out, "--quiet"]
    with sole_writer(out):
        for more in ([], ["--resume"]):
            code, _, stderr = run_cli(capsys, *base, *more)
            assert code == 2 and "another yolojet label is writing it now" in stderr
        assert out.read_bytes() == b""
    assert not out.exists()  # the lock's empty file goes with it
    assert run_cli(capsys, *base)[0] == 0 and len(lines(out)) == 3
    code, _, stderr = run_cli(capsys, *base, "--resume", "--retries", "-1")
    assert code == 2 and "'-1': expected a whole number, 0 or more" in stderr


def test_outputs_that_would_destroy_an_input_or_each_other_are_refused(server, photos, tmp_path, capsys):
    base = ["label", photos, "--server", server.address, "--model", "detect", "--quiet"]
    image = photos / "bus.jpg"
    before = image.read_bytes()
    code, _, stderr = run_cli(capsys, *base, "--out", tmp_path / "a.jsonl", "--coco", image)
    assert code == 2 and "an input image; writing there would destroy it" in stderr and image.read_bytes() == before
    code, _, stderr = run_cli(capsys, *base, "--out", image)  # an image, not a file of records: said as such
    assert code == 2 and "an input image; writing there would destroy it" in stderr and image.read_bytes() == before
    listed = tmp_path / "list.txt"
    listed.write_text(f"{image}\n")
    code, _, stderr = run_cli(capsys, "label", listed, *base[2:], "--out", tmp_path / "a.jsonl", "--coco", listed)
    assert code == 2 and "the list of images this run reads" in stderr and listed.read_text() == f"{image}\n"
    link = tmp_path / "link.json"
    link.symlink_to(image)
    code, _, stderr = run_cli(capsys, *base, "--out", tmp_path / "a.jsonl", "--coco", link)
    assert code == 2 and "an input image" in stderr and image.read_bytes() == before
    code, _, stderr = run_cli(capsys, *base, "--out", tmp_path / "b.jsonl", "--coco", tmp_path / "b.jsonl")
    assert code == 2 and "the same file as --out" in stderr
    code, _, stderr = run_cli(capsys, *base, "--out", "-", "--coco", tmp_path / "c.json")
    assert code == 2 and "read the records back: give --out FILE" in stderr
    text = tmp_path / "notes.txt"
    text.write_bytes(b'{"a": 1}\nnot a record, cut short')
    code, _, stderr = run_cli(capsys, *base, "--out", text, "--resume")
    assert code == 2 and "not a record" in stderr
    code, _, stderr = run_cli(capsys, *base, "--out", text)  # no --overwrite offered for a file that is not records
    assert code == 2 and "not records label wrote" in stderr and "--overwrite" not in stderr
    assert text.read_bytes() == b'{"a": 1}\nnot a record, cut short'  # refused before any change
    code, _, stderr = run_cli(capsys, *base, "--out", tmp_path / "d.jsonl", "--conf", "7")
    assert code == 2 and "--conf 7.0: expected a number in [0, 1]" in stderr
    local = ["label", photos, "--local", "--model", tmp_path / "no-such-model", "--out", tmp_path / "d.jsonl"]
    code, _, stderr = run_cli(capsys, *local, "--max-det", "0")  # said by its flag before any model loads
    assert code == 2 and "--max-det 0: expected an int in 1..300" in stderr and "no-such-model" not in stderr
    code, _, stderr = run_cli(capsys, *base, "--out", tmp_path / "d.jsonl", "--no-rect", "--fp32")
    assert code == 2 and "--fp32, --no-rect: the server's engine has its own" in stderr
    code, _, stderr = run_cli(
        capsys, "label", tmp_path / "missing.jpg", "--server", server.address, "--model", "detect", "--bench", "3"
    )
    assert code == 2 and "not a file; --bench sends one image file" in stderr
    assert not (tmp_path / "a.jsonl").exists() and not (tmp_path / "d.jsonl").exists()


def test_reruns_replace_stale_outputs_and_skip_their_own_dataset(server, photos, tmp_path, capsys):
    """--overwrite with every image failing leaves no old records behind; a YOLO dataset made inside the source
    folder is not labeled by the next run; a file name that is not UTF-8 is an error of its own."""
    out, dataset = tmp_path / "labels.jsonl", photos / "dataset"
    base = ["label", photos, "--server", server.address, "--model", "detect", "--out", out, "--quiet"]
    assert run_cli(capsys, *base, "--yolo-txt", dataset)[0] == 0
    assert len(lines(out)) == 3 and (dataset / "images" / "bus.jpg").is_symlink()
    code, _, stderr = run_cli(capsys, *base, "--yolo-txt", dataset, "--resume")
    assert code == 0 and "0 images labeled" in stderr and len(lines(out)) == 3  # not the dataset's own links
    # A dataset made in the photos' own folder: its links are left out, the photos there labeled.
    own = tmp_path / "own"
    shutil.copytree(photos, own, ignore=shutil.ignore_patterns("dataset"))
    beside = tmp_path / "beside.jsonl"
    place = ["label", own, "--server", server.address, "--model", "detect", "--out", beside, "--yolo-txt", own]
    code, _, stderr = run_cli(capsys, *place)
    assert code == 0 and len(lines(beside)) == 3 and (own / "images" / "bus.jpg").is_symlink(), stderr
    code, _, stderr = run_cli(capsys, *place, "--resume")
    assert code == 0 and "0 images labeled" in stderr and len(lines(beside)) == 3
    # A dataset of links the user made (no data.yaml of label's): its images are labeled, and it is never the place
    # for label's own dataset, which would delete or mix with the user's links.
    theirs = tmp_path / "theirs"
    (theirs / "images").mkdir(parents=True)
    (theirs / "images" / "bus.jpg").symlink_to(photos / "bus.jpg")
    mine = tmp_path / "mine.jsonl"
    yours = ["label", theirs / "images", "--server", server.address, "--model", "detect", "--out", mine, "--quiet"]
    code, _, stderr = run_cli(capsys, *yours, "--yolo-txt", theirs)
    assert code == 2 and "images holds files yolojet label did not make" in stderr
    assert not mine.exists() and [p.name for p in theirs.rglob("*")] == ["images", "bus.jpg"]
    code, _, stderr = run_cli(capsys, *yours, "--yolo-txt", tmp_path / "made")
    assert code == 0 and len(lines(mine)) == 1 and (tmp_path / "made" / "labels" / "bus.txt").is_file(), stderr
    odd = os.fsdecode(b"odd\xff.jpg")
    shutil.copy(ASSETS / "bus.jpg", photos / odd)
    for _ in range(2):  # once in the error log however many resumes fail on it
        code, _, _ = run_cli(capsys, *base, "--yolo-txt", dataset, "--resume")
        assert code == 1 and len(lines(out)) == 3
        (logged,) = lines(tmp_path / "labels.jsonl.errors.jsonl")
        assert "the file name is not UTF-8" in logged["error"] and "odd\\xff.jpg" in logged["path"]
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "x.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    code, _, _ = run_cli(
        capsys, "label", broken, "--server", server.address, "--model", "detect", "--out", out, "--overwrite",
        "--coco", tmp_path / "c.json", "--quiet",
    )  # fmt: skip
    assert code == 1 and out.read_bytes() == b""
    assert json.loads((tmp_path / "c.json").read_text())["images"] == []


def test_records_name_images_by_absolute_path_so_a_resume_from_another_folder_finds_them(
    server, photos, tmp_path, capsys, monkeypatch
):
    out = tmp_path / "labels.jsonl"
    flags = ["--server", server.address, "--model", "detect", "--out", out, "--quiet"]
    monkeypatch.chdir(photos.parent)
    assert run_cli(capsys, "label", photos.name, *flags)[0] == 0
    assert sorted(r["path"] for r in lines(out)) == sorted(str(p) for p in photos.rglob("*.jpg"))
    monkeypatch.chdir(photos)
    code, _, stderr = run_cli(capsys, "label", ".", *flags, "--resume")
    assert code == 0 and "0 images labeled" in stderr and "3 done before and skipped" in stderr
    assert len(lines(out)) == 3


def test_an_unreachable_server_is_reported_with_what_was_done(photos, tmp_path, capsys):
    started = time.monotonic()
    code, _, stderr = run_cli(
        capsys, "label", photos, "--server", "127.0.0.1:9", "--out", tmp_path / "o.jsonl", "--retries", "1"
    )
    assert code == 2 and "server 127.0.0.1:9" in stderr and "UNAVAILABLE" in stderr
    assert "server 127.0.0.1:9: UNAVAILABLE; trying again in 0.5 s (1 of 1, --retries)" in stderr  # said meanwhile
    assert time.monotonic() - started < 60
    assert not (tmp_path / "o.jsonl").exists()


def _many_photos(tmp_path: Path, count: int) -> Path:
    """A folder of `count` copies of the shipped photos, bus.jpg and zidane.jpg in turn."""
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(count):
        shutil.copy(ASSETS / ("bus.jpg" if i % 2 else "zidane.jpg"), folder / f"{i:02d}.jpg")
    return folder


def _serve_in_a_process(model_dir: Path, log: Path, env: dict) -> tuple[subprocess.Popen, str]:
    """`yolojet serve` of `model_dir` on the CPU on a free port, in a process of its own; it and its address."""
    with log.open("w") as sink:
        command = [sys.executable, "-m", "yolojet", "serve", "--model", f"{model_dir}:2", "--device", "cpu"]
        server = subprocess.Popen([*command, "--port", "0", "--slo-ms", "60000"], env=env, stdout=sink, stderr=sink)
    deadline = time.monotonic() + 300
    while (found := re.search(r"listening on (\S+)", log.read_text())) is None:
        assert server.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    return server, found[1]


def test_a_server_killed_mid_run_stops_label_with_its_records_kept_and_resume_finishes(model_dirs, tmp_path):
    """The server SIGKILLed while label runs: label ends at once with status 3 (not 2, 'nothing was done'), naming
    the error and the records kept; --resume against a new server labels each remaining image exactly once."""
    folder = _many_photos(tmp_path, 40)
    out = tmp_path / "labels.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    server, address = _serve_in_a_process(model_dirs["detect"], tmp_path / "serve.log", env)
    try:
        command = [sys.executable, "-m", "yolojet", "label", str(folder), "--out", str(out), "-c", "2", "--quiet"]
        process = subprocess.Popen(
            [*command, "--server", address, "--retries", "1"], env=env, stderr=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + 300
        while (not out.exists() or out.read_text().count("\n") < 3) and time.monotonic() < deadline:
            assert process.poll() is None, process.stderr.read()
            time.sleep(0.05)
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=60)
    _, stderr = process.communicate(timeout=120)
    kept = len(lines(out))
    assert process.returncode == 3, stderr
    assert f"stopped after {kept} images labeled (in {out}); --resume continues" in stderr
    assert "UNAVAILABLE" in stderr and 0 < kept < 40

    server, address = _serve_in_a_process(model_dirs["detect"], tmp_path / "serve-again.log", env)
    try:
        done = subprocess.run(
            [*command, "--server", address, "--resume"], env=env, capture_output=True, text=True, timeout=600
        )
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"{40 - kept} images labeled" in done.stderr and f"{kept} done before and skipped" in done.stderr
    paths = [r["path"] for r in lines(out)]
    assert sorted(paths) == sorted(str(p) for p in folder.iterdir()) and len(paths) == 40


def test_killed_and_resumed_each_image_exactly_once(model_dirs, tmp_path):
    """SIGKILL in the middle of a local run (a kill may cut the last line short), then --resume: every image has
    exactly one record."""
    folder = _many_photos(tmp_path, 30)
    out = tmp_path / "labels.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    command = [
        sys.executable,
        "-m",
        "yolojet",
        "label",
        str(folder),
        "--local",
        "--model",
        str(model_dirs["detect"]),
        "--out",
        str(out),
        "-c",
        "2",
        "--quiet",
    ]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while (not out.exists() or out.read_text().count("\n") < 5) and time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read().decode()
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    with open(out, "ab") as f:  # what a kill in the middle of a write leaves
        f.write(b'{"path": "cut sh')
    done = subprocess.run([*command, "--resume"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    paths = [r["path"] for r in lines(out)]
    assert sorted(paths) == sorted(str(p) for p in folder.iterdir())
    assert len(paths) == len(set(paths)) == 30


@pytest.mark.parametrize("rpc", ["Infer", "InferStream", "InferBatchStream"])
def test_bench_mode(server, capsys, rpc):
    flags = ["--model", "detect", "--bench", "21", "-c", "6", "--processes", "2", "--bench-rpc", rpc]
    code, stdout, stderr = run_cli(capsys, "label", ASSETS / "bus.jpg", "--server", server.address, *flags)
    assert code == 0, stderr
    assert "21 of 21 ({'OK': 21})" in stdout and f"6 over 2 processes, {rpc}" in stdout, stdout
    assert "img/s" in stdout and "p50" in stdout and "queue / decode / run" in stdout


def test_bench_calls_a_server_does_not_answer_end_at_their_deadline(server):
    """A server whose event loop is held answers nothing: with `call_timeout_s` the bench's calls end there, counted
    DEADLINE_EXCEEDED, and the bench returns rather than waits."""
    import asyncio

    from yolojet.client.remote import Connection, bench

    async def held() -> None:
        time.sleep(4.0)  # the loop does nothing else meanwhile

    blocked = asyncio.run_coroutine_threadsafe(held(), server.loop)
    try:
        start = time.monotonic()
        row = bench(Connection(server.address, "detect"), ASSETS / "bus.jpg", 4, 2, 1, {}, call_timeout_s=1.0)
        took = time.monotonic() - start
    finally:
        blocked.result(timeout=30)
    assert row["codes"].get("DEADLINE_EXCEEDED", 0) >= 1, row["codes"]
    assert took < 30


def test_plot(server, photos, tmp_path, capsys):
    from PIL import Image

    out = tmp_path / "labels.jsonl"
    assert (
        run_cli(
            capsys,
            "label",
            photos,
            "--server",
            server.address,
            "--model",
            "segment",
            "--out",
            out,
            "--conf",
            CONF,
            "--quiet",
        )[0]
        == 0
    )
    code, stdout, stderr = run_cli(capsys, "plot", out, "--out", tmp_path / "plots")
    assert "grid.png" in stdout
    assert code == 0, stderr
    grid = Image.open(tmp_path / "plots" / "grid.png")
    assert grid.size == (3 * 320, 320)  # three images, one row
    tile = np.asarray(grid)[:, :320]
    assert tile.std() > 10  # a picture, not a blank cell
    for name in ("classes.png", "scores.png"):
        assert Image.open(tmp_path / "plots" / name).size[0] > 100
    code, _, stderr = run_cli(capsys, "plot", tmp_path / "missing.jsonl", "--out", tmp_path / "p2")
    assert code == 2 and "no such file" in stderr and not (tmp_path / "p2").exists()
    # Records whose images have all gone since: the charts, no grid, and said so.
    gone = tmp_path / "gone.jsonl"
    gone.write_text("".join(json.dumps({**r, "path": r["path"] + ".moved"}) + "\n" for r in lines(out)))
    code, _, stderr = run_cli(capsys, "plot", gone, "--out", tmp_path / "p4")
    assert code == 0 and "3 of the 3 sampled images could not be read" in stderr and "no grid is drawn" in stderr
    assert sorted(p.name for p in (tmp_path / "p4").iterdir()) == ["classes.png", "scores.png"]
    # The lines `yolojet detect --json` writes (ultralytics' summary rows) are named as such.
    result = server.server.models["detect"].engine([str(photos / "bus.jpg")], conf=float(CONF))[0]
    assert result.summary()
    detected = tmp_path / "detect.jsonl"
    line = {"path": str(photos / "bus.jpg"), "height": 1080, "width": 810, "detections": result.summary()}
    detected.write_text(json.dumps(line) + "\n")
    code, _, stderr = run_cli(capsys, "plot", detected, "--out", tmp_path / "p3")
    assert code == 2 and "the lines of `yolojet detect --json`; plot reads the records of `yolojet label`" in stderr


def _label_against(options: ServeOptions, model_dirs, photos, tmp_path, capsys) -> tuple[int, float, list[dict]]:
    """`label --server` over the photos against a server run with `options`: its exit status, seconds and errors."""
    server = RunningServer({"detect": served("detect", model_dirs["detect"])}, options)
    out = tmp_path / "labels.jsonl"
    try:
        start = time.monotonic()
        code, _, stderr = run_cli(capsys, "label", photos, "--server", server.address, "--out", out, "--quiet")
        took = time.monotonic() - start
    finally:
        server.stop()
    assert not out.exists() or lines(out) == [], stderr
    errors = lines(tmp_path / "labels.jsonl.errors.jsonl")
    assert sorted(Path(e["path"]).name for e in errors) == ["bus.jpg", "bus_again.jpg", "zidane.jpg"], stderr
    return code, took, errors


def test_images_a_server_keeps_refusing_for_load_end_as_errors_not_a_hang(
    model_dirs, photos, tmp_path, capsys, monkeypatch
):
    """A server whose queue never has room refuses every image for load; the client sends each again after a pause,
    and after `give_up_after_s` logs it as an error and finishes."""
    from yolojet.client.remote import RemoteLabeler

    monkeypatch.setattr(RemoteLabeler, "give_up_after_s", 1.0)
    full = replace(ServeOptions(), port=0, slo_ms=60_000, max_queue=0)
    code, took, errors = _label_against(full, model_dirs, photos, tmp_path, capsys)
    assert code == 1
    assert all("refused it for load for over 1 s" in e["error"] for e in errors), errors
    assert took < 60


def test_a_server_deadline_shorter_than_any_run_is_each_images_error_at_once(model_dirs, photos, tmp_path, capsys):
    """A server whose --slo-ms is shorter than its model's run of one image refuses every image label sends
    (DEADLINE_TOO_SHORT): no pause would help, so each is an error at once, saying why, not after minutes of
    sending again."""
    strict = replace(ServeOptions(), port=0, slo_ms=0.001)
    code, took, errors = _label_against(strict, model_dirs, photos, tmp_path, capsys)
    assert code == 1
    assert all("shorter than a run of one image" in e["error"] and "--slo-ms" in e["error"] for e in errors), errors
    assert took < 60  # not the 300 s a refusal for load is sent again for


class _HeldCall:
    """A `max_calls=1` server's one call held by another client's open stream, let go at the labeler's first pause
    (its `time.sleep`, patched): the labeler is refused at least once, and then must be let in."""

    def __init__(self, server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> None:
        from yolojet.client import remote

        self.stream = OpenStream(server.stub(), (ASSETS / "bus.jpg").read_bytes())  # the server's one call
        self.pauses = 0
        real = time

        class PausedTime:
            def __getattr__(self, name: str):
                return getattr(real, name)

            def sleep(inner, seconds: float) -> None:
                self.pauses += 1
                if self.pauses == 1:
                    self.stream.close()
                real.sleep(seconds)

        monkeypatch.setattr(remote, "time", PausedTime())


def test_label_asks_a_server_at_its_call_limit_again(model_dirs, photos, tmp_path, capsys, monkeypatch):
    """`serve --max-calls 1` with its call held: gRPC refuses label's first call (RESOURCE_EXHAUSTED, "Concurrent RPC
    limit exceeded!") and label asks again after a pause; every image is then labeled once."""
    limited = RunningServer(
        {"detect": served("detect", model_dirs["detect"])}, replace(ServeOptions(), port=0, slo_ms=60_000, max_calls=1)
    )
    out = tmp_path / "labels.jsonl"
    try:
        held = _HeldCall(limited, monkeypatch)
        code, _, stderr = run_cli(capsys, "label", photos, "--server", limited.address, "--out", out, "--quiet")
    finally:
        limited.stop()
    assert code == 0, stderr
    assert held.pauses >= 1  # refused at least once
    assert sorted(Path(r["path"]).name for r in lines(out)) == ["bus.jpg", "bus_again.jpg", "zidane.jpg"]


def test_the_stream_is_opened_again_when_a_server_at_its_call_limit_refuses_it(model_dirs, photos, monkeypatch):
    """The labeler's stream itself refused at the call limit goes again after a pause, as a broken stream does."""
    from yolojet.client import remote

    limited = RunningServer(
        {"detect": served("detect", model_dirs["detect"])}, replace(ServeOptions(), port=0, slo_ms=60_000, max_calls=1)
    )
    answered: list[str] = []
    try:
        held = _HeldCall(limited, monkeypatch)
        labeler = remote.RemoteLabeler(remote.Connection(limited.address), window=8, options={})
        paths = sorted(str(p) for p in photos.rglob("*.jpg"))
        labeler.run(paths, on_reply=lambda path, reply: answered.append(path), on_error=lambda p, why: pytest.fail(why))
    finally:
        limited.stop()
    assert held.pauses == 1 and labeler.reconnects == 1
    assert sorted(answered) == paths


def test_images_travel_several_a_message_within_the_window(photos, monkeypatch):
    """The labeler's messages: IMAGES_A_MESSAGE images each while the window has room, a smaller message when the
    window fills, the next only once replies free room; a message stops growing at MESSAGE_BYTES."""
    from yolojet.client import remote
    from yolojet.serve.proto.yolojet.v1 import inference_pb2 as pb

    paths = [str(p) for p in sorted(photos.rglob("*.jpg"))] * 20  # 60 files
    labeler = remote.RemoteLabeler(remote.Connection("127.0.0.1:1"), window=20, options={})
    window = remote._Window(20)
    answered: list[str] = []
    messages = labeler._requests(window, 0, iter(paths), on_error=lambda path, why: pytest.fail(why))
    first, second = next(messages), next(messages)
    assert [len(m.requests) for m in (first, second)] == [remote.IMAGES_A_MESSAGE, 20 - remote.IMAGES_A_MESSAGE]
    assert len({r.id for m in (first, second) for r in m.requests}) == 20
    assert [r.image for r in first.requests[:3]] == [Path(p).read_bytes() for p in paths[:3]]
    for request in first.requests[:6]:
        labeler._answered(window, pb.InferReply(id=request.id), lambda path, reply: answered.append(path), pytest.fail)
    assert len(next(messages).requests) == 6 and len(answered) == 6

    monkeypatch.setattr(remote, "MESSAGE_BYTES", 2 * max(len(Path(p).read_bytes()) for p in paths[:3]) - 1)
    window = remote._Window(20)
    messages = labeler._requests(window, 0, iter(paths), on_error=lambda path, why: pytest.fail(why))
    assert len(next(messages).requests) == 2  # the second image takes it to the bound


def test_a_refusal_for_load_holds_the_window_as_long_as_the_server_says(photos):
    """A reply refusing an image for load carries the server's estimate of when it would be admitted (retry_delay_ms):
    the labeler sends nothing before then (up to LONGEST_SUGGESTED_PAUSE_S), and at least its own growing backoff
    where the server's estimate is shorter; the refused image goes back to be sent again."""
    import grpc

    from yolojet.client import remote
    from yolojet.serve.proto.yolojet.v1 import inference_pb2 as pb

    paths = [str(p) for p in sorted(photos.rglob("*.jpg"))]
    labeler = remote.RemoteLabeler(remote.Connection("127.0.0.1:1"), window=20, options={})

    def held_after(delay_ms: int) -> tuple[float, remote._Window]:
        window = remote._Window(20)
        message = next(labeler._requests(window, 0, iter(paths[:1]), on_error=lambda path, why: pytest.fail(why)))
        full = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        refusal = pb.Error(code=full, reason="QUEUE_FULL", retry_delay_ms=delay_ms)
        labeler._answered(window, pb.InferReply(id=message.requests[0].id, error=refusal), pytest.fail, pytest.fail)
        return window.hold_until - time.monotonic(), window

    held, window = held_after(400)
    assert 0.3 < held <= 0.4
    assert [path for _, path, _ in window.again] == paths[:1] and not window.sent
    assert held_after(30_000)[0] == pytest.approx(remote.LONGEST_SUGGESTED_PAUSE_S, abs=0.1)
    assert 0 < held_after(0)[0] <= remote.refusal_pause(1)
    # A shorter estimate after a longer one leaves the longer hold.
    window = remote._Window(20)
    message = next(labeler._requests(window, 0, iter(paths[:1]), on_error=lambda path, why: pytest.fail(why)))
    window.hold_until = time.monotonic() + 0.4  # what a refusal of 400 ms left
    short = pb.Error(code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], reason="QUEUE_FULL", retry_delay_ms=0)
    labeler._answered(window, pb.InferReply(id=message.requests[0].id, error=short), pytest.fail, pytest.fail)
    assert window.hold_until - time.monotonic() > 0.3


def test_a_hold_that_ends_as_the_window_looks_at_it_is_not_a_wait_without_end(photos, monkeypatch):
    """Every image in flight was refused (no reply is to come) and the window is held: the hold ending between the
    check and the wait (a thread switch) must still let the next message go, not wait for a reply for ever."""
    from yolojet.client import remote

    real = time
    readings = []

    class LateTime:  # every reading after the first lands past the hold, as after a thread switch
        def __getattr__(self, name: str):
            return getattr(real, name)

        def monotonic(self) -> float:
            readings.append(None)
            return real.monotonic() + (0.0 if len(readings) == 1 else 0.006)

    labeler = remote.RemoteLabeler(remote.Connection("127.0.0.1:1"), window=4, options={})
    window = remote._Window(4)
    path = str(sorted(photos.rglob("*.jpg"))[0])
    window.again.append(("1:" + path, path, Path(path).read_bytes()))
    window.hold_until = real.monotonic() + 0.005
    monkeypatch.setattr(remote, "time", LateTime())
    messages = labeler._requests(window, 0, iter([]), on_error=lambda path, why: pytest.fail(why))
    sent: list = []
    worker = threading.Thread(target=lambda: sent.append(next(messages)), daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "the generator waited for a reply that was never to come"
    assert [r.id for r in sent[0].requests] == ["1:" + path]


@pytest.mark.parametrize("break_at", [15, 18])
def test_a_stream_that_ends_while_its_message_is_made_gives_the_images_back(photos, break_at):
    """The call ends (a broken connection: its generation moves on) while the generator reads the image at `break_at`:
    the 16th, which completes a message, or the 3rd of the second message. Nothing it took is sent into the finished
    call or lost: the message's images go back after those sent before them, and the next stream's generator sends
    them first."""
    from yolojet.client import remote

    paths = [str(p) for p in sorted(photos.rglob("*.jpg"))] * 10  # 30 files
    labeler = remote.RemoteLabeler(remote.Connection("127.0.0.1:1"), window=100, options={})
    window = remote._Window(100)

    def source():
        for n, path in enumerate(paths):
            if n == break_at:
                with window.lock:  # what RemoteLabeler.run does when the call breaks
                    window.generation += 1
                    window.again.extendleft(reversed([(i, p, d) for i, (p, d) in window.sent.items()]))
                    window.sent.clear()
            yield path

    messages = list(labeler._requests(window, 0, source(), on_error=lambda path, why: pytest.fail(why)))
    assert [len(m.requests) for m in messages] == ([] if break_at < 16 else [16])
    assert not window.sent
    assert [request_id for request_id, _, _ in window.again] == [f"{n + 1}:{paths[n]}" for n in range(break_at + 1)]
    resent = next(labeler._requests(window, 1, source(), on_error=lambda path, why: pytest.fail(why)))
    assert [r.id for r in resent.requests] == [f"{n + 1}:{paths[n]}" for n in range(16)]


def test_messages_stay_within_the_servers_limit_and_a_larger_image_is_its_own_error(
    model_dirs, photos, tmp_path, capsys
):
    """A server taking at most 200,000 bytes a message (ListModels says so): the labeler's messages stay under it (a
    larger one would fail the whole stream), and a file larger than that alone goes to the error log."""
    from PIL import Image

    noise = np.random.default_rng(0).integers(0, 255, (400, 400, 3), dtype=np.uint8)
    Image.fromarray(noise).save(photos / "big.png")  # ~480 KB of noise
    small = RunningServer(
        {"detect": served("detect", model_dirs["detect"])},
        replace(ServeOptions(), port=0, slo_ms=60_000, max_message_bytes=200_000),
    )
    out = tmp_path / "labels.jsonl"
    try:
        code, _, stderr = run_cli(capsys, "label", photos, "--server", small.address, "--out", out, "--quiet")
    finally:
        small.stop()
    assert code == 1, stderr  # an image failed
    assert sorted(Path(r["path"]).name for r in lines(out)) == ["bus.jpg", "bus_again.jpg", "zidane.jpg"]
    (error,) = lines(tmp_path / "labels.jsonl.errors.jsonl")
    assert Path(error["path"]).name == "big.png"
    assert "more than the server takes in a message (200,000 bytes)" in error["error"]
