"""Code written for ultralytics runs on yolojet: results' torch-style calls, `verbose()`, `Engine.predict`, image
URLs, clear words for video, streams and cameras, and a `--help` that answers at once and lists the exit codes."""

from __future__ import annotations

import functools
import http.server
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
from support import calibrated_model
from ultralytics.utils import ASSETS

import yolojet
from yolojet.engine.engine import Engine
from yolojet.errors import EngineConfigError, ImageReadError
from yolojet.images import read_image_file
from yolojet.images.frames import frame_from_pixels
from yolojet.tasks import OBB, Boxes, Keypoints, Masks, Probs, Results


def docs_snippets(result) -> dict:
    """What ultralytics' documentation does with a result (Predict mode's "Working with Results"), as plain data."""
    found: dict = {"boxes": [], "xyxy": result.boxes.xyxy.cpu().numpy().tolist(), "cls": result.boxes.cls.tolist()}
    for box in result.boxes:  # one box at a time
        found["boxes"].append([*box.xyxy[0].cpu().numpy().tolist(), int(box.cls[0]), float(box.conf[0])])
    found["conf"] = result.boxes.conf.cpu().tolist()
    found["xywhn"] = result.boxes.cpu().numpy().xywhn.tolist()
    found["first"] = result.boxes[0].xyxy.tolist()
    found["masks"] = result.masks.data.cpu().numpy().astype(int).sum((1, 2)).tolist()
    found["keypoints"] = result.keypoints.xy.cpu().numpy().tolist()
    found["keypoints_conf"] = result.keypoints.conf.cpu().numpy().tolist()
    found["verbose"] = result.verbose()
    found["shapes"] = [*result.boxes.shape, *result.masks.shape, *result.keypoints.shape]
    return found


def test_ultralytics_style_code_runs_unchanged_on_our_results():
    from ultralytics.engine.results import Results as UltralyticsResults

    rng = np.random.default_rng(0)
    h, w = 48, 64
    xy1 = rng.uniform(0, 30, (5, 2))
    rows = np.concatenate(
        [xy1, xy1 + rng.uniform(5, 15, (5, 2)), rng.uniform(0.1, 1, (5, 1)), np.array([[0], [2], [2], [5], [0]])], 1
    ).astype(np.float32)
    masks = rng.random((5, h, w)) > 0.7
    points = np.concatenate([rng.uniform(0, 40, (5, 17, 2)), rng.random((5, 17, 1))], 2).astype(np.float32)
    names = {i: f"class{i}" for i in range(8)}
    ours = Results(
        names=names,
        orig_shape=(h, w),
        boxes=Boxes(rows, (h, w)),
        masks=Masks(masks),
        keypoints=Keypoints(points, (h, w)),
    )
    theirs = UltralyticsResults(
        np.zeros((h, w, 3), np.uint8),
        "x.jpg",
        names,
        boxes=torch.from_numpy(rows),
        masks=torch.from_numpy(masks),
        keypoints=torch.from_numpy(points),
    )
    mine, expected = docs_snippets(ours), docs_snippets(theirs)
    assert mine.keys() == expected.keys()
    for key in mine:
        if isinstance(mine[key], str):
            assert mine[key] == expected[key]
        else:
            np.testing.assert_allclose(
                np.array(mine[key], float), np.array(expected[key], float), rtol=1e-6, err_msg=key
            )

    probs = np.array([0.1, 0.6, 0.05, 0.2, 0.05], np.float32)
    mine = Results(names=names, probs=Probs(probs))
    theirs = UltralyticsResults(np.zeros((h, w, 3), np.uint8), "x.jpg", names, probs=torch.from_numpy(probs))
    assert mine.verbose() == theirs.verbose()
    assert mine.probs.data.cpu().numpy().tolist() == theirs.probs.data.cpu().numpy().tolist()
    assert mine.probs.top5 == theirs.probs.top5
    assert mine.probs.shape == tuple(theirs.probs.shape)
    rotated = np.array([[20, 20, 10, 5, 0.3, 0.9, 1]], np.float32)
    mine = Results(names=names, orig_shape=(h, w), obb=OBB(rotated, (h, w)))
    theirs = UltralyticsResults(np.zeros((h, w, 3), np.uint8), "x.jpg", names, obb=torch.from_numpy(rotated))
    np.testing.assert_allclose(mine.obb.xyxyxyxy.cpu().numpy(), theirs.obb.xyxyxyxy.cpu().numpy(), atol=1e-4)
    assert mine.verbose() == theirs.verbose()
    assert Results(names=names, boxes=Boxes(np.zeros((0, 6), np.float32), (h, w))).verbose() == "(no detections), "


def test_cuda_gives_a_gpu_tensor_or_says_there_is_no_gpu():
    xyxy = Boxes(np.random.default_rng(1).uniform(1, 40, (3, 6)).astype(np.float32), (48, 64)).xyxy
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
            xyxy.cuda()
        return
    on_gpu = xyxy.cuda()
    assert on_gpu.is_cuda and torch.equal(on_gpu.cpu(), torch.from_numpy(np.asarray(xyxy)))


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    model_dir = yolojet.export(calibrated_model("yolov8n.yaml", 64), out=tmp_path_factory.mktemp("m") / "m", imgsz=64)
    with Engine.load(model_dir, device="cpu", backend="reference") as engine:
        yield engine


def test_predict_takes_what_ultralytics_predict_takes(engine, tmp_path, capsys):
    folder = tmp_path / "photos"
    folder.mkdir()
    for name in ("bus.jpg", "zidane.jpg"):
        (folder / name).write_bytes((ASSETS / name).read_bytes())
    files = [str(folder / "bus.jpg"), str(folder / "zidane.jpg")]
    want = engine(files, conf=0.001)
    for got in (
        engine.predict(folder, conf=0.001),
        engine.predict(str(folder / "*.jpg"), conf=0.001, imgsz=64),
        list(engine.predict(files, stream=True, conf=0.001)),
    ):
        assert [r.path for r in got] == files
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a.boxes.data, b.boxes.data)
    assert len(engine.predict(files[0], agnostic_nms=True, conf=0.001)) == 1
    engine.predict(files, verbose=True, conf=0.001)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith(f"{files[0]}: 1080x810 ") and printed[1].startswith(f"{files[1]}: 720x1280 ")
    with pytest.raises(EngineConfigError, match="loaded for"):
        engine.predict(files, imgsz=320)
    with pytest.raises(EngineConfigError, match=r"predict\(save=...\): files are written by `yolojet detect`"):
        engine.predict(files, save=True)
    with pytest.raises(EngineConfigError, match=r"predict\(device=...\): fixed when the engine is loaded"):
        engine.predict(files, device="cuda:7" if engine.device.type == "cpu" else "cpu")
    # The values that ask for nothing, as ultralytics-style code passes them, are taken.
    half = getattr(engine.network, "dtype", torch.float32) == torch.float16
    quiet = {"save": False, "show": False, "augment": False, "vid_stride": 1, "batch": 8, "half": half}
    device = engine.device.index if engine.device.type == "cuda" else "cpu"
    for a, b in zip(engine.predict(files, conf=0.001, device=device, **quiet), want, strict=True):
        np.testing.assert_array_equal(a.boxes.data, b.boxes.data)
    with pytest.raises(EngineConfigError, match=r"predict\(augment=...\): not supported"):
        engine.predict(files, augment=True)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def test_image_urls_are_fetched_and_other_sources_named(engine):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(ASSETS)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        (fetched, missing) = engine([f"{base}/bus.jpg", f"{base}/absent.jpg"], conf=0.001)
        (local,) = engine([str(ASSETS / "bus.jpg")], conf=0.001)
        assert fetched.error is None and fetched.orig_shape == (1080, 810)
        np.testing.assert_array_equal(fetched.boxes.data, local.boxes.data)
        assert "HTTP 404" in missing.error and "absent.jpg" in missing.error
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(ImageReadError, match="cannot fetch it"):
        read_image_file(base + "/bus.jpg")  # the server is gone: refused
    for source, kind in (
        ("clip.mp4", "a video file"),
        ("rtsp://camera.local/stream", "a video stream"),
        ("0", "a camera index"),
    ):
        with pytest.raises(ImageReadError, match=f"{kind}, which is not supported yet"):
            read_image_file(source)
    with pytest.raises(ImageReadError, match="a camera index, which is not supported yet"):
        frame_from_pixels(0)


def test_help_answers_without_torch_and_lists_the_exit_codes():
    probe = (
        "import sys, contextlib, io\nfrom yolojet.cli import main\nout = io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n    main(['detect', '--help'])\n"
        "print('torch' in sys.modules, 'exit status' in out.getvalue(), '130' in out.getvalue())"
    )
    said = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert said == ["False", "True", "True"]


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"model": None}, "model None: expected the path or name of a model directory"),
        ({"model": 3}, "model 3: expected the path or name"),
        ({"switches": "fast"}, "switches 'fast': expected an EngineOptions"),
        ({"shapes": 64}, r"shapes 64: expected a list of \(height, width\) pairs"),
        ({"max_batch": 10**9}, "max_batch 1000000000: at most 4,096 images a batch"),
    ],
)
def test_load_arguments_of_the_wrong_kind_are_named_before_any_work(given, message):
    """Each refused before anything is built or allocated (a batch of 10**9 exhausted the memory of the machine)."""
    from yolojet import Engine

    arguments = {"model": "no_model_anywhere", "device": "cpu", **given}
    with pytest.raises(EngineConfigError, match=message):
        Engine.load(arguments.pop("model"), **arguments)
