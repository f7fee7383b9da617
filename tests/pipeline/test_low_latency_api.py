"""The embedded-style trio: preprocess(frame, slot) / run(batch) / get(slot), and options without re-capture."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from support import calibrated_model, real_photos

import yolojet
from yolojet.engine.engine import Engine
from yolojet.errors import EngineConfigError


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    imgsz = 640 if torch.cuda.is_available() else 128
    model_dir = yolojet.export(
        calibrated_model("yolov8n.yaml", imgsz), out=tmp_path_factory.mktemp("ll") / "m", imgsz=imgsz
    )
    return Engine.load(model_dir, backend="triton", half=False, max_batch=2, tune=False)


def test_trio_equals_call_and_options_apply_without_recapture(engine):
    photos = real_photos()
    bus, zidane = photos["bus.jpg"], photos["zidane.jpg"]
    expected = engine([bus, zidane], conf=0.0005)
    assert sum(len(r) for r in expected) > 0
    engine.configure(conf=0.0005)
    engine.preprocess(bus, 0)
    engine.preprocess(torch.from_numpy(zidane[..., ::-1].copy()).to(engine.device), 1)  # RGB tensor on the device
    engine.run(2)
    for slot, want in enumerate(expected):
        got = engine.get(slot)
        assert got.orig_shape == want.orig_shape
        np.testing.assert_allclose(got.boxes.data, want.boxes.data, atol=1e-3)

    graphs = len(getattr(engine._path, "graphs", {}))
    strict = float(expected[0].boxes.conf.max()) - 1e-6 if len(expected[0]) else 0.5
    engine.configure(conf=strict, max_det=5)
    engine.run(2)
    assert len(engine.get(0)) <= 1
    assert len(getattr(engine._path, "graphs", {})) == graphs  # same frames, new thresholds: the same graph


def test_trio_errors(engine):
    with pytest.raises(EngineConfigError, match="slot 2"):
        engine.preprocess(real_photos()["bus.jpg"], 2)
    with pytest.raises(EngineConfigError, match=r"conf 1\.5"):
        engine.configure(conf=1.5)
    with pytest.raises(EngineConfigError, match="max_det 301"):
        engine.configure(max_det=301)
    with pytest.raises(EngineConfigError, match="class ids are ints from 0 to 79"):
        engine.configure(classes=[80])
    with pytest.raises(EngineConfigError, match=r"class ids are ints"):
        engine.configure(classes=[1.7])  # would match no class at all
    with pytest.raises(EngineConfigError, match="conf None"):
        engine.configure(conf=None)
    with pytest.raises(EngineConfigError, match=r"max_det 5\.5"):
        engine.configure(max_det=5.5)
    engine.configure(classes=0)  # one class id, as ultralytics takes it
    engine.configure()
    fresh = Engine(engine.network, engine.max_batch)
    with pytest.raises(EngineConfigError, match="stage a frame"):
        fresh.run(1)
    with pytest.raises(EngineConfigError, match=rf"run\({engine.max_batch + 1}\): this engine runs 1\.\."):
        fresh.run(engine.max_batch + 1)
    with pytest.raises(EngineConfigError, match="slot 0: no frame staged there"):
        fresh.get(0)
    with pytest.raises(EngineConfigError, match="slot 5"):
        fresh.get(5)
    with pytest.raises(EngineConfigError, match="slot '0': this engine has slots"):
        fresh.preprocess(real_photos()["bus.jpg"], "0")
    bus = real_photos()["bus.jpg"]
    fresh.preprocess(bus, 0)
    fresh.run(1)
    assert fresh.get(0).orig_shape == bus.shape[:2]
    fresh.preprocess(np.zeros((100, 100, 3), np.uint8), 0)  # staged after the run: its results are not the bus's
    with pytest.raises(EngineConfigError, match="no results for the frame staged there"):
        fresh.get(0)
    fresh.close()  # then every way in says so, for files (whose decoder threads are gone) and arrays alike
    for call in (
        lambda: fresh(bus),
        lambda: fresh("bus.jpg"),
        lambda: next(fresh.stream([bus])),
        lambda: fresh.preprocess(bus),
    ):
        with pytest.raises(EngineConfigError, match="this engine is closed"):
            call()


def test_call_keeps_configured_options_and_its_own_hold_for_the_call(engine):
    photo = real_photos()["bus.jpg"]
    loose = engine(photo, conf=0.0005)[0]
    assert len(loose) > 1
    assert np.array_equal(loose.orig_img, photo)  # BGR, as ultralytics' orig_img
    h, w = photo.shape[:2]
    np.testing.assert_allclose(loose.boxes.xywhn, loose.boxes.xywh / [w, h, w, h], rtol=1e-6)
    strict = float(loose.boxes.conf.max()) - 1e-6
    engine.configure(conf=strict)
    try:
        assert len(engine(photo)[0]) <= 1  # configure's conf holds for calls that set none
        assert len(engine(photo, conf=0.0005)[0]) == len(loose)  # one that does, for that call
        assert len(engine(photo)[0]) <= 1  # and only that call
        ultralytics_name = engine(photo, agnostic_nms=True, conf=0.0005)[0].boxes.data
        np.testing.assert_array_equal(ultralytics_name, engine(photo, agnostic=True, conf=0.0005)[0].boxes.data)
    finally:
        engine.configure()
    with pytest.raises(EngineConfigError, match=r"unknown option\(s\) imgsz"):
        engine(photo, imgsz=320)


def test_fewer_images_than_slots(engine):
    """One image in a two-slot engine runs in the smaller bucket with the scratch of one image."""
    photo = real_photos()["bus.jpg"]
    one = engine(photo, conf=0.0005)[0]
    both = engine([photo, photo], conf=0.0005)
    # fp32 rounding, at two batch sizes and two places in a batch (where an image's pixels fall in the GEMM tiles):
    # 2e-4 relative, 0.006 px once scaled from the 128x96 rectangle to the 1080x810 photo
    np.testing.assert_allclose(one.boxes.data, both[0].boxes.data, rtol=5e-4, atol=1e-2)
    np.testing.assert_allclose(both[0].boxes.data, both[1].boxes.data, rtol=5e-4, atol=1e-2)


@pytest.fixture
def camera(engine):
    """A camera's two frames (bus.jpg and its mirror image: one shape, other detections) as RGB tensors on the CPU,
    each with what `engine(...)` finds on it; the engine configured to the same conf while the test runs."""
    bus = real_photos()["bus.jpg"]
    images = [bus, np.ascontiguousarray(bus[:, ::-1])]
    wants = engine(images, conf=0.0005)
    assert len(wants[0]) > 0 and not np.allclose(wants[0].boxes.data[:1], wants[1].boxes.data[:1])
    engine.configure(conf=0.0005)
    try:
        yield [torch.from_numpy(image[..., ::-1].copy()) for image in images], wants
    finally:
        engine.configure()


def assert_found(engine, slot, want):
    np.testing.assert_allclose(engine.get(slot).boxes.data, want.boxes.data, rtol=5e-4, atol=1e-2)


def test_a_reused_device_tensor_is_copied_when_staged(engine, camera):
    """A camera writing each frame into one tensor: what runs is the frame as it was when staged, and staging the
    tensor again (into the slot's same buffer) runs the new frame."""
    (first, second), (want_first, want_second) = camera
    buffer = first.to(engine.device)
    engine.preprocess(buffer, 0)
    staged_at = engine._staged[0].frame.pixels.data_ptr()
    buffer.copy_(second)  # the next frame arrives before the run
    engine.run(1)
    assert_found(engine, 0, want_first)
    engine.preprocess(buffer, 0)
    assert engine._staged[0].frame.pixels.data_ptr() == staged_at  # the slot's own buffer, written again
    engine.run(1)
    assert_found(engine, 0, want_second)


@pytest.mark.gpu(reason="pinned host memory needs a CUDA GPU")
def test_a_pinned_host_frame_may_be_written_again_once_staged(engine, camera):
    """A camera's pinned host buffer rewritten right after `preprocess` returns: the run sees the frame as staged
    (the GPU would otherwise read the buffer later, on its copy stream)."""
    (first, second), (want_first, _) = camera
    buffer = first.pin_memory()
    engine.preprocess(buffer, 0)
    buffer.copy_(second)
    engine.run(1)
    assert_found(engine, 0, want_first)


@pytest.mark.gpu(reason="CUDA streams need a CUDA GPU")
def test_frames_staged_on_one_stream_run_on_another(engine, camera):
    """Frames copied in on one stream (a camera thread's) and run on another: each run sees the frame staged last."""
    frames, wants = camera
    staging, running = torch.cuda.Stream(engine.device), torch.cuda.Stream(engine.device)
    for frame, want in zip([f.to(engine.device) for f in frames] * 2, wants * 2, strict=True):
        with torch.cuda.stream(staging):
            torch.cuda._sleep(2_000_000)  # the copy lands late: a run that did not wait would read the old frame
            engine.preprocess(frame, 0)
        with torch.cuda.stream(running):
            engine.run(1)
        assert_found(engine, 0, want)


@pytest.mark.gpu(reason="CUDA streams need a CUDA GPU")
def test_threads_each_on_its_own_stream_get_their_own_results(engine):
    """Two threads calling one engine, each under a CUDA stream of its own: the runs share the engine's activations,
    so a run launched from the other stream waits for the one before it, and each caller gets its own results."""
    photos = real_photos()
    calls = [[photos["bus.jpg"]], [photos["zidane.jpg"], photos["bus.jpg"]]]
    expected = [engine(images, conf=0.0005) for images in calls]
    failures: list[str] = []

    def caller(i: int) -> None:
        with torch.cuda.stream(torch.cuda.Stream(engine.device)):
            for _ in range(12):
                for ours, want in zip(engine(calls[i], conf=0.0005), expected[i], strict=True):
                    if ours.boxes.data.shape != want.boxes.data.shape or not np.allclose(
                        ours.boxes.data, want.boxes.data, rtol=5e-4, atol=1e-2
                    ):
                        failures.append(f"thread {i}: other boxes")

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(caller, range(2)))  # a caller's exception is raised here
    assert not failures, failures[:4]


@pytest.mark.gpu(reason="CUDA streams need a CUDA GPU")
def test_a_float_frame_written_on_the_callers_stream_is_read_after_the_write(engine, camera):
    """A float frame written on the caller's stream, landing late there: the feed thread's conversion to pixels runs on
    the caller's stream too, so it reads the frame as written, not what the tensor held before."""
    (first, _), (want, _) = camera
    chw = first.permute(2, 0, 1).float().div(255).to(engine.device)
    frame = torch.zeros_like(chw)
    stream = torch.cuda.Stream(engine.device)
    with torch.cuda.stream(stream):
        torch.cuda._sleep(20_000_000)  # the write lands late: a conversion that did not wait would read zeros
        frame.copy_(chw)
        got = engine([frame])[0]
    np.testing.assert_allclose(got.boxes.data, want.boxes.data, rtol=5e-4, atol=1e-2)


@pytest.mark.gpu(reason="a second CUDA GPU")
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_an_engine_on_the_second_gpu_while_the_first_is_current(engine, camera, tmp_path):
    """An engine loaded on cuda:1 in a process whose current device stays cuda:0 (a worker of `--devices 0,1`, a
    second GPU in an API user's process): its tuning, eager first runs, graph replays and result events all on
    cuda:1, so the call, the stream and the trio find what the engine on cuda:0 finds."""
    (first, second), wants = camera
    torch.cuda.set_device(0)
    model_dir = yolojet.export(calibrated_model("yolov8n.yaml", 640), out=tmp_path / "m", imgsz=640)
    other = Engine.load(model_dir, device="cuda:1", backend="triton", half=False, max_batch=2, tune=True)
    other.configure(conf=0.0005)
    bus = real_photos()["bus.jpg"]
    images = [bus, np.ascontiguousarray(bus[:, ::-1])]
    for got, want in zip(other(images), wants, strict=True):
        np.testing.assert_allclose(got.boxes.data, want.boxes.data, rtol=5e-4, atol=1e-2)
    for got, want in zip(other.stream(iter(images)), wants, strict=True):
        np.testing.assert_allclose(got.boxes.data, want.boxes.data, rtol=5e-4, atol=1e-2)
    buffer = first.to("cuda:1")
    other.preprocess(buffer, 0)
    buffer.copy_(second)
    other.run(1)
    np.testing.assert_allclose(other.get(0).boxes.data, wants[0].boxes.data, rtol=5e-4, atol=1e-2)
    assert torch.cuda.current_device() == 0
