"""`yolojet detect`: real photos in, the same detections as ultralytics' predict out (printed, as JSON lines and
as annotated images); bad images reported without stopping the others; bad options a clear error; and no
half-written output files when the command fails.

The model is yolov8n with random weights and BatchNorm statistics measured on the shipped photos (see
`support.calibrated_model`), so scores depend on the image; conf 0.005 gives bus.jpg a few dozen boxes.
Without a GPU the command runs the float32 reference executor (the test clears TRITON_INTERPRET, which the
conftest sets for the kernel tests, so that the CLI takes the CPU fallback a user without a GPU gets); with
one it runs our kernels, in fp32 and on OpenCV's pixels, which ultralytics reads (the GPU's hardware JPEG decoder,
the default there, differs from OpenCV by a grey level on a few pixels: enough to move a box scoring within a
quarter of a percent of conf across it), so that boxes scoring right at the threshold cannot flip.
"""

from __future__ import annotations

import functools
import json
import shutil
from collections import Counter
from copy import deepcopy
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from support import calibrated_model, match_detections, run_cli, sigint_as_in_a_terminal
from ultralytics.utils import ASSETS

import yolojet

CFG = "yolov8n.yaml"
CONF = "0.005"
PHOTOS = {"bus.jpg": (1080, 810), "zidane.jpg": (720, 1280)}  # name: (height, width)
# class, confidence (two decimals, or two significant digits under 0.1), x1 y1 x2 y2
DETECTION_LINE = r"^  (.+?)\s+(\d(?:\.\d+)?(?:e-\d+)?)\s+(-?\d+\.\d)\s+(-?\d+\.\d)\s+(-?\d+\.\d)\s+(-?\d+\.\d)$"
COLUMNS = r"^  class\s+conf\s+x1\s+y1\s+x2\s+y2$"
SAME_PIXELS = ("--fp32", "--decoder", "cpu")  # the network and the pixels ultralytics' predict has


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return yolojet.export(calibrated_model(CFG, 640), out=tmp_path_factory.mktemp("cli_detect") / "model", imgsz=640)


@pytest.fixture(autouse=True)
def cpu_fallback(monkeypatch, tmp_path):
    if not torch.cuda.is_available():
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("YOLOJET_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def photos(tmp_path) -> Path:
    folder = tmp_path / "photos"
    folder.mkdir()
    for name in PHOTOS:
        shutil.copy(ASSETS / name, folder / name)
    return folder


@functools.cache
def ultralytics_detections(name: str, classes: tuple[int, ...] | None = None, max_det: int = 300):
    """ultralytics' plain predict on the photo with the same weights (each image at its own rectangle, as `yolojet
    detect` by default), the same conf: rows [x1, y1, x2, y2, conf, cls] and the class names."""
    from ultralytics import YOLO

    wrapper = YOLO(CFG, verbose=False)
    wrapper.model = deepcopy(calibrated_model(CFG, 640))  # predict fuses the model it is given in place
    result = wrapper.predict(
        str(ASSETS / name),
        imgsz=640,
        conf=float(CONF),
        verbose=False,
        classes=list(classes) if classes is not None else None,
        max_det=max_det,
    )[0]
    rows = torch.cat([result.boxes.xyxy, result.boxes.conf[:, None], result.boxes.cls[:, None]], 1)
    return rows, result.names


def rows_of(detections: list[dict]) -> torch.Tensor:
    """JSON detections as rows [x1, y1, x2, y2, conf, cls]."""
    return torch.tensor(
        [
            [d["box"]["x1"], d["box"]["y1"], d["box"]["x2"], d["box"]["y2"], d["confidence"], d["class"]]
            for d in detections
        ],
        dtype=torch.float32,
    ).reshape(-1, 6)


def detect_at_conf(capsys, model_dir: Path, image: Path, out_json: Path, *options) -> tuple[int, str, str]:
    """`yolojet detect` of one image at the tests' conf, on the pixels and network ultralytics' predict has."""
    return run_cli(capsys, "detect", model_dir, image, "--conf", CONF, *options, "--json", out_json, *SAME_PIXELS)


def read_json_lines(path: Path) -> list[dict]:
    text = path.read_text()
    assert text.endswith("\n") or text == ""
    return [json.loads(line) for line in text.splitlines()]


def assert_matches_ultralytics(record: dict, name: str, **options) -> torch.Tensor:
    expected, names = ultralytics_detections(name, **options)
    problems = match_detections(rows_of(record["detections"]), expected)
    assert not problems, f"{name}: {problems[:3]}"
    for d in record["detections"]:
        assert d["name"] == names[d["class"]]
    return expected


def printed_detections(stdout: str, path: str) -> list[tuple[str, float, list[float]]]:
    """The lines `detect` printed under `path: HxW, 2 person, 1 bus, 3.1ms`, parsed (the column names, printed once, may
    come first); checks the size is the photo's height x width, and the counts per class add up to the number of
    lines and agree with them."""
    import re

    from PIL import Image, ImageOps

    lines = stdout.splitlines()
    header = [i for i, line in enumerate(lines) if line.startswith(f"{path}: ")]
    assert len(header) == 1, f"no single line for {path} in {stdout[:500]!r}"
    size, *found, took = lines[header[0]].removeprefix(f"{path}: ").split(", ")
    width, height = ImageOps.exif_transpose(Image.open(path)).size  # bus.jpg 1080x810, as predict(verbose=True) says
    assert size == f"{height}x{width}", lines[header[0]]
    assert re.fullmatch(r"\d+\.\dms", took), lines[header[0]]
    counts = {} if found == ["no detections"] else {name: int(n) for n, name in (f.split(" ", 1) for f in found)}
    first = header[0] + 1 + (header[0] + 1 < len(lines) and bool(re.match(COLUMNS, lines[header[0] + 1])))
    n = sum(counts.values())
    parsed = []
    for line in lines[first : first + n]:
        match = re.match(DETECTION_LINE, line)
        assert match, f"not a detection line: {line!r}"
        parsed.append((match[1], float(match[2]), [float(v) for v in match.groups()[2:]]))
    following = lines[first + n] if first + n < len(lines) else ""
    assert not re.match(DETECTION_LINE, following), "more detection lines than the counts say"
    assert Counter(label for label, _, _ in parsed) == Counter(counts)
    return parsed


def close_confidence(printed: float, exact: float) -> bool:
    """Two decimals from 0.1, two significant digits below."""
    return abs(printed - exact) <= (5e-3 if exact >= 0.095 else 0.05 * exact + 1e-9)


def outline_mask(shape: tuple[int, int], detections: list[dict], width: int) -> np.ndarray:
    mask = np.zeros(shape, np.uint8)
    for d in detections:
        b = d["box"]
        x1, y1, x2, y2 = (round(b[k]) for k in ("x1", "y1", "x2", "y2"))
        cv2.rectangle(mask, (min(x1, x2), min(y1, y2)), (max(x1, x2), max(y1, y2)), 1, width)
    return mask.astype(bool)


def test_detect_directory_matches_ultralytics_predict(model_dir, photos, tmp_path, capsys):
    out_json, out_dir = tmp_path / "results" / "out.jsonl", tmp_path / "annotated"
    code, stdout, stderr = run_cli(
        capsys, "detect", model_dir, photos, "--conf", CONF, "--json", out_json, "--save", out_dir, *SAME_PIXELS
    )
    assert code == 0, stderr

    records = read_json_lines(out_json)
    assert [r["path"] for r in records] == [str(photos / name) for name in PHOTOS]
    total = 0
    for record, (name, (h, w)) in zip(records, PHOTOS.items(), strict=True):
        assert set(record) == {"path", "width", "height", "detections"}
        assert (record["height"], record["width"]) == (h, w)
        total += len(assert_matches_ultralytics(record, name))

        printed = printed_detections(stdout, record["path"])
        assert len(printed) == len(record["detections"])
        for (label, conf, box), d in zip(printed, record["detections"], strict=True):
            assert label == d["name"] and close_confidence(conf, d["confidence"]), (conf, d["confidence"])
            assert np.allclose(box, [d["box"][k] for k in ("x1", "y1", "x2", "y2")], atol=0.051)

        original = cv2.imread(str(ASSETS / name)).astype(np.int16)
        annotated = cv2.imread(str(out_dir / name))
        assert annotated is not None and annotated.shape == (h, w, 3), name
        diff = np.abs(annotated.astype(np.int16) - original).max(2)
        if record["detections"]:
            # Boxes are drawn: along their outlines the picture changed by far more than JPEG re-encoding does.
            outlines = outline_mask((h, w), record["detections"], width=2)
            assert diff[outlines].mean() > 40, f"{name}: the boxes are not drawn"
        else:
            assert diff.mean() < 3, f"{name}: nothing to draw, yet the image changed"
    assert total >= 10, "the comparison needs detections to mean something"
    assert f"2 images, {total:,} detections (" in stdout and "), 0 errors" in stdout
    # Written through staging files renamed into place: nothing else is left beside the outputs.
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(PHOTOS)
    assert [p.name for p in out_json.parent.iterdir()] == ["out.jsonl"]


def test_bad_images_are_reported_and_the_good_ones_still_detected(model_dir, photos, tmp_path, capsys):
    missing = tmp_path / "missing.jpg"
    not_an_image = photos / "notes.jpg"
    not_an_image.write_text("a shopping list, not a photo\n")
    good = photos / "bus.jpg"
    out_json, out_dir = tmp_path / "out.jsonl", tmp_path / "annotated"
    code, stdout, stderr = run_cli(
        capsys,
        "detect",
        model_dir,
        missing,
        good,
        not_an_image,
        "--conf",
        CONF,
        "--json",
        out_json,
        "--save",
        out_dir,
        *SAME_PIXELS,
        "--batch",
        2,  # the missing file and the good one share a batch
    )
    assert code == 1, stderr
    errors = [line for line in stderr.splitlines() if ": error: " in line]
    assert len(errors) == 2, stderr
    assert errors[0].startswith(f"{missing}: error:") and "no such file" in errors[0]
    assert errors[1].startswith(f"{not_an_image}: error:") and "cannot decode" in errors[1]
    assert all(line.count(str(path)) == 1 for line, path in zip(errors, (missing, not_an_image), strict=True))
    assert "2 of 3 images could not be read" in stderr
    assert str(missing) not in stdout and str(not_an_image) not in stdout

    (record,) = read_json_lines(out_json)
    assert record["path"] == str(good) and (record["height"], record["width"]) == PHOTOS["bus.jpg"]
    expected = assert_matches_ultralytics(record, "bus.jpg")
    assert len(expected) > 0
    assert len(printed_detections(stdout, str(good))) == len(expected)
    assert f"1 image, {len(expected):,} detections" in stdout and ", 2 errors" in stdout  # the summary
    assert sorted(p.name for p in out_dir.iterdir()) == ["bus.jpg"]


def test_a_name_that_is_not_utf8_is_shown_escaped_and_a_run_of_errors_leaves_no_old_lines(
    model_dir, photos, tmp_path, capsys
):
    import os
    import shutil

    odd = tmp_path / "odd"
    odd.mkdir()
    shutil.copy(photos / "bus.jpg", odd / os.fsdecode(b"bus\xff.jpg"))
    out_json = tmp_path / "out.jsonl"
    code, stdout, stderr = run_cli(  # on the CPU wherever it runs (--device)
        capsys, "detect", model_dir, odd, "--conf", CONF, "--json", out_json, *SAME_PIXELS, "--device", "cpu"
    )
    assert code == 0, stderr
    (record,) = read_json_lines(out_json)
    assert record["path"] == str(odd / "bus\\xff.jpg") and len(record["detections"]) > 0
    assert "bus\\xff.jpg" in stdout
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "x.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    code, _, _ = run_cli(capsys, "detect", model_dir, broken, "--json", out_json, "--quiet")
    assert code == 1 and out_json.read_bytes() == b""  # not the last run's record


def test_classes_keeps_only_those_classes(model_dir, photos, tmp_path, capsys):
    everything, _ = ultralytics_detections("bus.jpg")
    counts = torch.bincount(everything[:, 5].long())
    chosen = tuple(sorted(counts.argsort(descending=True)[:2].tolist()))
    assert counts[list(chosen)].sum() < len(everything), "the filter must have something to remove"
    out_json = tmp_path / "out.jsonl"
    code, _, stderr = detect_at_conf(capsys, model_dir, photos / "bus.jpg", out_json, "--classes", *chosen)
    assert code == 0, stderr
    (record,) = read_json_lines(out_json)
    found = {d["class"] for d in record["detections"]}
    assert found and found <= set(chosen)
    assert_matches_ultralytics(record, "bus.jpg", classes=chosen)


def test_max_det_caps_the_count(model_dir, photos, tmp_path, capsys):
    out_json = tmp_path / "out.jsonl"
    code, stdout, stderr = detect_at_conf(capsys, model_dir, photos / "bus.jpg", out_json, "--max-det", 2)
    assert code == 0, stderr
    (record,) = read_json_lines(out_json)
    assert len(record["detections"]) == 2
    assert_matches_ultralytics(record, "bus.jpg", max_det=2)
    everything, _ = ultralytics_detections("bus.jpg")
    top = sorted((float(c) for c in everything[:, 4]), reverse=True)[:2]
    assert np.allclose([d["confidence"] for d in record["detections"]], top, atol=0.01)
    assert len(printed_detections(stdout, str(photos / "bus.jpg"))) == 2


def test_save_keeps_one_annotated_image_per_input(model_dir, tmp_path, capsys):
    """Directories are searched recursively, so two inputs can share a file name (a/x.jpg, b/x.jpg): each must
    get its own annotated image, not overwrite the other's."""
    for folder, name in (("a", "bus.jpg"), ("b", "zidane.jpg")):
        (tmp_path / "photos" / folder).mkdir(parents=True)
        shutil.copy(ASSETS / name, tmp_path / "photos" / folder / "x.jpg")
    out_dir = tmp_path / "annotated"
    code, _, stderr = run_cli(capsys, "detect", model_dir, tmp_path / "photos", "--save", out_dir, "--quiet")
    assert code == 0, stderr
    saved = sorted(out_dir.iterdir())
    shapes = sorted(cv2.imread(str(p)).shape[:2] for p in saved)
    assert shapes == sorted(PHOTOS.values()), f"annotated images {[p.name for p in saved]} of sizes {shapes}"


def test_save_replaces_its_own_annotated_images_and_no_other_file(model_dir, tmp_path, capsys):
    """photo.png is annotated as photo.jpg: beside the user's own photo.jpg that is refused before any work, the file
    untouched; into a folder of its own it is written, and a second run replaces it (the annotated image says it is
    one). An annotated image JPEG cannot hold (a side over 65,500 pixels) is that image's error: the others are
    still detected and saved."""
    import PIL.Image

    photos, shared = tmp_path / "photos", tmp_path / "shared"
    photos.mkdir()
    shared.mkdir()
    PIL.Image.open(ASSETS / "bus.jpg").save(photos / "photo.png")
    shutil.copy(ASSETS / "zidane.jpg", shared / "photo.jpg")
    mine = (shared / "photo.jpg").read_bytes()
    code, _, stderr = run_cli(capsys, "detect", model_dir, photos, "--save", shared, "--quiet")
    assert code == 2 and "photo.jpg is there and is not an annotated image detect wrote" in stderr, stderr
    assert (shared / "photo.jpg").read_bytes() == mine

    saved = tmp_path / "annotated"
    for _ in range(2):
        code, _, stderr = run_cli(capsys, "detect", model_dir, photos, "--save", saved, "--quiet")
        assert code == 0, stderr
        assert cv2.imread(str(saved / "photo.jpg")).shape[:2] == PHOTOS["bus.jpg"]

    cv2.imwrite(str(photos / "wide.png"), np.random.default_rng(0).integers(0, 255, (4, 70_000, 3), dtype=np.uint8))
    code, _, stderr = run_cli(capsys, "detect", model_dir, photos, "--save", tmp_path / "wide", "--quiet")
    assert code == 1 and "wide.png: error: its annotated image cannot be saved" in stderr, stderr
    assert sorted(p.name for p in (tmp_path / "wide").iterdir()) == ["photo.jpg"]


@pytest.mark.parametrize(
    ("option", "fragment"),
    [
        (["--conf", "1.5"], "'1.5': expected a number in [0, 1]"),
        (["--conf", "-0.1"], "'-0.1': expected a number in [0, 1]"),
        (["--iou", "1.2"], "'1.2': expected a number in [0, 1]"),
        (["--max-det", "0"], "max_det 0"),
        (["--classes", "3", "80"], "classes 80: class ids are ints from 0 to 79"),
        (["--imgsz", "0"], "'0': expected an integer or HEIGHTxWIDTH"),
        (["--batch", "0"], "'0': expected a positive integer"),
    ],
)
def test_invalid_options_are_clear_errors_that_write_nothing(model_dir, photos, tmp_path, capsys, option, fragment):
    out_json, out_dir = tmp_path / "out.jsonl", tmp_path / "annotated"
    code, stdout, stderr = run_cli(
        capsys, "detect", model_dir, photos, *option, "--json", out_json, "--save", out_dir, "--quiet"
    )
    assert code == 2, stderr
    assert stderr.strip().splitlines()[-1].startswith("yolojet detect: error:"), stderr
    assert fragment in stderr, stderr
    assert "Traceback" not in stderr
    assert stdout == ""
    assert not out_json.exists() and not out_dir.exists()


def test_failure_before_writing_leaves_no_outputs(photos, tmp_path, capsys):
    """A model that does not exist: the command fails, no output file or folder appears, and an existing JSON file
    from an earlier run is left as it was."""
    model = tmp_path / "no_such_model"
    out_json, out_dir = tmp_path / "out.jsonl", tmp_path / "annotated"
    code, _, stderr = run_cli(capsys, "detect", model, photos, "--json", out_json, "--save", out_dir)
    assert code == 2
    assert f"yolojet detect: error: {model}" in stderr and "no such file" in stderr
    assert not out_json.exists() and not out_dir.exists()

    earlier = '{"path": "earlier.jpg", "width": 1, "height": 1, "detections": []}\n'
    out_json.write_text(earlier)
    code, _, stderr = run_cli(capsys, "detect", model, photos, "--json", out_json, "--save", out_dir)
    assert code == 2
    assert out_json.read_text() == earlier and not out_dir.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "photos"]


def test_no_images_found_is_an_error(model_dir, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "readme.txt").write_text("no pictures here")
    out_json = tmp_path / "out.jsonl"
    code, _, stderr = run_cli(capsys, "detect", model_dir, empty, "--json", out_json)
    assert code == 2
    assert f"{empty}: no images found" in stderr
    assert not out_json.exists()


def test_outputs_never_overwrite_inputs_and_go_where_asked(model_dir, photos, tmp_path, capsys):
    """--save into the photos' own folder would write bus.jpg over bus.jpg: refused before any work, the photos
    untouched. --json - writes to standard output; a directory given as --json is a clear error. Written files get
    the permissions of an ordinary write."""
    import os

    before = {p.name: p.read_bytes() for p in photos.iterdir()}
    code, _, stderr = run_cli(capsys, "detect", model_dir, photos, "--save", photos, "--quiet")
    assert code == 2 and "would overwrite the input" in stderr, stderr
    assert {p.name: p.read_bytes() for p in photos.iterdir()} == before

    code, _, stderr = run_cli(capsys, "detect", model_dir, photos, "--json", photos, "--quiet")
    assert code == 2 and "is a directory" in stderr, stderr
    # JSON lines written over a photo or a file of the model would destroy it: refused, nothing touched (a copy of
    # the model, so that a refusal that failed would not spoil the other tests'). Beside the model's files they are
    # written, and written again.
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    for target in (photos / "bus.jpg", model / "graph.json", model / "weights.safetensors"):
        kept = target.read_bytes()
        code, _, stderr = run_cli(capsys, "detect", model, photos, "--json", target, "--quiet")
        assert code == 2 and "writing there would destroy it" in stderr and target.read_bytes() == kept, stderr
    for _ in range(2):
        found = model / "found.jsonl"
        code, _, stderr = run_cli(capsys, "detect", model, photos / "bus.jpg", "--json", found, "--quiet")
        assert code == 0 and found.is_file(), stderr

    code, stdout, stderr = run_cli(capsys, "detect", model_dir, photos / "bus.jpg", "--json", "-")
    assert code == 0, stderr
    assert [json.loads(line)["path"] for line in stdout.splitlines()] == [str(photos / "bus.jpg")]
    assert f"{photos / 'bus.jpg'}: " in stderr  # the readable lines, kept off the JSON stream
    assert not Path("-").exists()

    out_json = tmp_path / "out" / "found.jsonl"
    code, _, stderr = run_cli(capsys, "detect", model_dir, photos / "bus.jpg", "--json", out_json, "--quiet")
    assert code == 0, stderr
    umask = os.umask(0)
    os.umask(umask)
    assert out_json.stat().st_mode & 0o777 == 0o666 & ~umask


def _cli_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a `yolojet` process the tests start: the CPU fallback a user without a GPU gets (no
    interpreter), its own cache."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["YOLOJET_CACHE"] = str(tmp_path / "cache")
    return env


def test_json_through_a_link_writes_its_target_and_keeps_the_link(model_dir, photos, tmp_path, capsys):
    """`--json link.jsonl`, where link.jsonl points at real.jsonl: real.jsonl gets the records, the link stays a
    link (an atomic rename over the path would have replaced the link with a file and left the target as it was).
    Annotated images saved through a link are written to its target the same way."""
    real = tmp_path / "real.jsonl"
    real.write_text("old\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(real.name)
    saved = tmp_path / "annotated"
    saved.mkdir()
    elsewhere = tmp_path / "kept" / "bus_annotated.jpg"
    elsewhere.parent.mkdir()
    (saved / "bus.jpg").symlink_to(elsewhere)
    code, _, stderr = run_cli(
        capsys, "detect", model_dir, photos / "bus.jpg", "--conf", CONF, "--json", link, "--save", saved, "--quiet"
    )
    assert code == 0, stderr
    assert link.is_symlink() and (saved / "bus.jpg").is_symlink()
    (record,) = read_json_lines(real)
    assert record["path"] == str(photos / "bus.jpg")
    assert cv2.imread(str(elsewhere)).shape[:2] == PHOTOS["bus.jpg"]


def test_json_into_a_fifo_is_written_straight(model_dir, photos, tmp_path, capsys):
    """A special file (a FIFO here, /dev/stdout for a user) is written as it is: never renamed over, so the
    records reach whoever reads it and the FIFO is still a FIFO afterwards."""
    import os
    import stat
    import threading

    fifo = tmp_path / "records.fifo"
    os.mkfifo(fifo)
    received: list[str] = []
    reader = threading.Thread(target=lambda: received.extend(fifo.read_text().splitlines()))
    reader.start()
    code, _, stderr = run_cli(capsys, "detect", model_dir, photos, "--conf", CONF, "--json", fifo, "--quiet")
    reader.join(timeout=60)
    assert code == 0, stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(Path(json.loads(line)["path"]).name for line in received) == sorted(PHOTOS)


def test_no_json_file_when_no_image_succeeds(model_dir, tmp_path, capsys):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "a.jpg").write_bytes(b"not a jpeg")
    (broken / "b.png").write_bytes(b"")
    out_json = tmp_path / "out.jsonl"
    code, _, stderr = run_cli(capsys, "detect", model_dir, broken, "--json", out_json, "--quiet")
    assert code == 1 and "2 of 2 images could not be read" in stderr
    assert not out_json.exists()


def test_interrupted_run_keeps_every_finished_record(model_dir, tmp_path):
    """Ctrl-C after some images: the JSON lines of the images done so far are on disk, each one whole. Enough images
    that the run is still going when the interrupt comes, however fast the machine (40 were all done first once):
    one copy of the photo, then hard links to it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    folder = tmp_path / "many"
    folder.mkdir()
    shutil.copy(ASSETS / "bus.jpg", folder / "000.jpg")
    for i in range(1, 400):
        os.link(folder / "000.jpg", folder / f"{i:03d}.jpg")
    out_json = tmp_path / "out.jsonl"
    command = [
        sys.executable,
        "-m",
        "yolojet.cli",
        "detect",
        str(model_dir),
        str(folder),
        "--json",
        str(out_json),
        "--quiet",
    ]
    process = subprocess.Popen(
        command, env=_cli_env(tmp_path), stderr=subprocess.PIPE, text=True, preexec_fn=sigint_as_in_a_terminal
    )
    deadline = time.monotonic() + 300
    while (not out_json.exists() or not out_json.read_text().count("\n")) and time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read()
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    records = read_json_lines(out_json)
    assert 1 <= len(records) < 400
    assert [r["path"] for r in records] == [str(folder / f"{i:03d}.jpg") for i in range(len(records))]


def test_closed_pipe_ends_quietly(model_dir, photos, tmp_path):
    """`yolojet detect ... --json - | head -1`: the reader goes away after one line; the command stops without a
    traceback, with the status a shell gives a command whose pipe was closed."""
    import subprocess
    import sys

    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(12):
        shutil.copy(ASSETS / "zidane.jpg", folder / f"{i:02d}.jpg")
    command = [sys.executable, "-m", "yolojet.cli", "detect", str(model_dir), str(folder), "--json", "-", "--quiet"]
    process = subprocess.Popen(command, env=_cli_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = process.stdout.readline()
    process.stdout.close()
    _, stderr = process.communicate(timeout=300)
    assert json.loads(first)["path"] == str(folder / "00.jpg")
    assert process.returncode == 141, stderr.decode()
    assert b"Traceback" not in stderr and b"BrokenPipe" not in stderr


def test_json_to_standard_output_by_another_name(model_dir, photos, tmp_path):
    """`--json /dev/stdout > out.txt` (here a link to /proc/self/fd/1, so that no system file is at stake): the
    records go through the process's own standard output into out.txt, the readable lines to stderr, and the
    link stays a link."""
    import subprocess
    import sys

    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    out_txt = tmp_path / "out.txt"
    command = [
        sys.executable,
        "-m",
        "yolojet",
        "detect",
        str(model_dir),
        str(photos),
        "--conf",
        CONF,
        "--json",
        str(link),
    ]
    with open(out_txt, "w") as stdout:
        done = subprocess.run(command, env=_cli_env(tmp_path), stdout=stdout, stderr=subprocess.PIPE, text=True)
    assert done.returncode == 0, done.stderr
    assert link.is_symlink()
    records = read_json_lines(out_txt)
    assert sorted(Path(r["path"]).name for r in records) == sorted(PHOTOS)
    assert f"{photos / 'bus.jpg'}: " in done.stderr
