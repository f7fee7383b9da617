"""Many images through one engine: `engine.stream` over any iterable yields one result per input, in order, with
bad inputs' errors in their own place; frames of different sizes share a batch (and a captured graph) and give
each the result it gets alone; an engine shared by threads gives every caller its own results; the original image
is made only when asked for.

The model is yolov8n with random weights and BatchNorm statistics measured on the shipped photos. The reference
backend runs where the interpreter would be too slow for a test of many calls; the Triton path (interpreter on the
CPU, the GPU where there is one) runs the mixed-size batch.
"""

from __future__ import annotations

import io
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar

import cv2
import numpy as np
import pytest
import torch
from PIL import Image
from support import calibrated_model, match_detections, real_photos
from ultralytics.utils import ASSETS

import yolojet
from yolojet.engine.engine import Engine
from yolojet.errors import EngineConfigError

CONF = 0.005


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return yolojet.export(calibrated_model("yolov8n.yaml", 320), out=tmp_path_factory.mktemp("stream") / "m", imgsz=320)


@pytest.fixture(scope="module")
def reference(model_dir):
    engine = Engine.load(model_dir, device="cpu", backend="reference", max_batch=3)
    yield engine
    engine.close()


def one_pixel_jpeg() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (1, 1), (120, 60, 200)).save(out, format="JPEG")
    return out.getvalue()


def test_stream_yields_every_input_in_order_with_errors_in_place(reference, tmp_path):
    photos = real_photos()
    zidane_path = ASSETS / "zidane.jpg"
    half = tmp_path / "half.jpg"
    half.write_bytes(zidane_path.read_bytes()[:5000])
    sources = [
        ASSETS / "bus.jpg",  # a path
        zidane_path.read_bytes(),  # bytes
        photos["astronaut"],  # numpy BGR
        half,  # a file cut short
        Image.fromarray(photos["coffee"][..., ::-1].copy()),  # PIL RGB
        b"\x00\x01 not an image",
        torch.from_numpy(photos["chelsea"][..., ::-1].copy()),  # uint8 RGB tensor
        one_pixel_jpeg(),
        tmp_path / "missing.jpg",
    ]

    def generated():  # any iterable: a generator, not a list
        yield from sources

    results = list(reference.stream(generated(), conf=CONF))
    assert len(results) == len(sources)
    errors = [i for i, r in enumerate(results) if r.error]
    assert errors == [3, 5, 8]
    assert str(half) in results[3].error and "cut short" in results[3].error
    assert results[3].path == str(half) and results[8].path == str(tmp_path / "missing.jpg")
    for i, (source, result) in enumerate(zip(sources, results, strict=True)):
        if i in errors:
            continue
        (alone,) = reference([source], conf=CONF)
        assert result.orig_shape == alone.orig_shape, i
        assert not match_detections(result.boxes.data, alone.boxes.data, iou_min=0.999, conf_tol=1e-5, px_tol=0.01), i
    assert results[0].path == str(ASSETS / "bus.jpg") and results[0].orig_shape == (1080, 810)
    assert results[7].orig_shape == (1, 1)


def test_a_failing_iterable_raises_after_the_results_before_it(reference):
    photo = real_photos()["bus.jpg"]

    def failing():
        yield photo
        yield photo
        raise OSError("camera unplugged")

    seen = []
    with pytest.raises(OSError, match="camera unplugged"):
        for result in reference.stream(failing(), conf=CONF):
            seen.append(result)
    assert len(seen) == 2 and all(r.error is None for r in seen)


def test_original_image_is_made_when_asked_for(reference):
    photo = real_photos()["bus.jpg"]
    from_path, from_array = reference([ASSETS / "bus.jpg", photo], conf=CONF)
    assert not isinstance(from_path.image, np.ndarray)  # nothing decoded for it yet
    assert np.array_equal(from_path.orig_img, cv2.imread(str(ASSETS / "bus.jpg")))  # OpenCV's pixels, BGR
    assert from_array.orig_img is photo  # the caller's own array, as ultralytics keeps it
    assert from_path.plot().shape == photo.shape


def test_an_engine_shared_by_threads_gives_each_caller_its_results(reference):
    photos = list(real_photos().values())
    expected = {i: reference([photos[i], photos[(i + 1) % 5]], conf=CONF) for i in range(4)}
    failures: list[str] = []

    def caller(i: int) -> None:
        for _ in range(5):
            got = reference([photos[i], photos[(i + 1) % 5]], conf=CONF)
            for ours, want in zip(got, expected[i], strict=True):
                if (
                    ours.error
                    or ours.orig_shape != want.orig_shape
                    or not np.array_equal(ours.boxes.data, want.boxes.data)
                ):
                    failures.append(f"thread {i}: {ours.error or 'other boxes'}")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(caller, range(4)))  # a caller's exception is raised here
    assert not failures, failures[:5]


def test_a_stream_of_one_tensor_rewritten_for_every_frame_gives_each_frame_its_own_result(reference):
    """A camera's iterable handing out one tensor rewritten for every frame: the feed reads ahead of the runs, so
    each frame is copied as it comes, and each result is its own frame's (on a GPU the same copy is made of a
    device tensor, ordered after the writes that made the frame)."""
    bus = real_photos()["bus.jpg"]
    frames = [bus, np.ascontiguousarray(bus[:, ::-1]), np.ascontiguousarray(bus[::-1])]
    wants = reference(frames, conf=CONF)
    assert len({tuple(np.round(w.boxes.data[0], 2)) for w in wants}) == 3  # three frames, three answers
    buffer = torch.empty(bus.shape, dtype=torch.uint8)

    def camera():
        for _ in range(2):
            for frame in frames:
                buffer.copy_(torch.from_numpy(frame[..., ::-1].copy()))  # RGB, as a camera's tensor
                yield buffer

    got = list(reference.stream(camera(), conf=CONF))
    assert len(got) == 6
    for i, ours in enumerate(got):  # batches of another size round differently (0.0016 px seen): a wrong frame's
        np.testing.assert_allclose(ours.boxes.data, wants[i % 3].boxes.data, rtol=1e-5, atol=1e-2)  # are pixels off


def test_leaving_a_stream_over_a_waiting_iterable_returns_at_once(reference):
    """A camera's iterable that waits for its next frame (a queue here): a caller that takes one result and leaves
    gets control back at once; the thread inside the iterable is not waited for (it held the caller 30 s)."""
    import queue

    frames: queue.Queue = queue.Queue()
    for _ in range(2):
        frames.put(real_photos()["bus.jpg"])

    def camera():
        while True:
            yield frames.get()  # waits for ever after the two frames

    started = time.monotonic()
    stream = reference.stream(camera(), conf=CONF)
    assert next(stream).boxes is not None
    stream.close()
    assert time.monotonic() - started < 10


def test_mixed_sizes_in_one_batch_give_each_the_result_it_gets_alone(tmp_path):
    """On our kernels (interpreter on the CPU, at 96 pixels to keep it short), letterboxed to the square input: one
    batch of three photos of three sizes, read through the frame table by one letterbox launch and one captured path,
    equals each photo run alone; the reference executor agrees. (Batches of several rectangles: test_rect_letterbox.)"""
    imgsz = 640 if torch.cuda.is_available() else 96
    model_dir = yolojet.export(calibrated_model("yolov8n.yaml", imgsz), out=tmp_path / "m", imgsz=imgsz)
    photos = real_photos()
    images = [photos["bus.jpg"], photos["zidane.jpg"], photos["astronaut"]]  # 1080x810, 720x1280, 512x512
    engine = Engine.load(model_dir, backend="triton", half=False, max_batch=3, tune=False, rect=False)
    truth = Engine.load(model_dir, device=engine.device, backend="reference", max_batch=3, rect=False)
    try:
        together = engine(images, conf=CONF)
        for image, result in zip(images, together, strict=True):
            (alone,) = engine([image], conf=CONF)
            assert result.orig_shape == image.shape[:2]
            assert not match_detections(result.boxes.data, alone.boxes.data, iou_min=0.999, conf_tol=1e-4, px_tol=0.01)
        for result, want in zip(together, truth(images, conf=CONF), strict=True):
            assert not match_detections(result.boxes.data, want.boxes.data)
        if engine.device.type == "cuda":  # one graph (keyed by the slots it runs first) served all three sizes
            assert len([k for k in engine._path.graphs if k[0] == engine._path.run_size(3)]) == 1
    finally:
        engine.close()
        truth.close()


def test_the_feed_hands_over_ready_chunks_as_full_batches_and_a_slow_source_at_once():
    """Decoded chunks waiting merge into batches of up to the engine's size, in order; images from a slow source
    are handed on as they come rather than held back to fill a batch."""
    import time

    from yolojet.engine.feed import FrameFeed
    from yolojet.images.decoders import CpuDecoder

    decoder = CpuDecoder(torch.device("cpu"), threads=2)
    try:
        images = [np.full((4, 6, 3), i, np.uint8) for i in range(40)]
        feed = FrameFeed(iter(images), decoder, batch=32, chunk=8)
        time.sleep(0.5)  # every chunk decoded and waiting
        sizes, values = [], []
        while (fed := feed.next_batch()) is not None:
            sizes.append(len(fed.sources))
            values += [int(frame.pixels[0, 0, 0]) for frame in fed.decoded.items]
        assert values == list(range(40)) and sizes == [32, 8]

        def slow():
            for image in images[:3]:
                time.sleep(0.2)
                yield image

        started = time.monotonic()
        feed = FrameFeed(slow(), decoder, batch=32, chunk=8)
        first = feed.next_batch()
        assert len(first.sources) == 1 and time.monotonic() - started < 0.4  # not held for the other two
        feed.close()
    finally:
        decoder.close()


def test_a_long_list_is_decoded_in_long_chunks():
    """A list of more than two batches goes to the decoder LONG_CHUNK images a call (a long stream's decode thread
    is its limit, and each call costs it a wait for the GIL); a shorter list CHUNK at a time, so that a call's first
    chunk runs while its next decodes."""
    from yolojet.engine.feed import CHUNK, LONG_CHUNK, FrameFeed, chunk_for
    from yolojet.images.decoders import CpuDecoder

    assert (chunk_for(list(range(128)), 64), chunk_for(list(range(129)), 64)) == (CHUNK, LONG_CHUNK)
    assert chunk_for(iter(range(10)), 64) == LONG_CHUNK  # an iterable of unknown length: its chunks are cut short

    class Recording(CpuDecoder):
        calls: ClassVar[list[int]] = []

        def finish(self, pending, pool=None):
            self.calls.append(len(pending))
            return super().finish(pending, pool)

    decoder = Recording(torch.device("cpu"), threads=2)
    try:
        for count, calls in ((200, [64, 64, 64, 8]), (100, [32, 32, 32, 4])):
            Recording.calls = []
            images = [np.full((4, 6, 3), i % 256, np.uint8) for i in range(count)]
            values = [int(f.pixels[0, 0, 0]) for fed in FrameFeed(images, decoder, batch=64) for f in fed.decoded.items]
            assert values == [i % 256 for i in range(count)] and Recording.calls == calls
    finally:
        decoder.close()


class _LendingDecoder:
    """The CPU decoder, whose batches also lend out a buffer an image (a token naming it) as the hardware decoder
    lends its images: records, at each decode, the buffers handed back to it and which images had been fully
    consumed (their results made) by then."""

    def __init__(self) -> None:
        from yolojet.images.decoders import CpuDecoder

        self.inner = CpuDecoder(torch.device("cpu"), threads=2)
        self.cpu, self.name = self.inner, "lending"
        self.consumed: set[str] = set()
        self.lock = threading.Lock()
        self.early: list[str] = []  # buffers handed back before their image's results were made
        self.reused = 0
        self.threads: set[str] = set()

    def prepare(self, item):
        self.threads.add(threading.current_thread().name)
        return self.inner.prepare(item)

    def finish(self, pending, pool=None, entering=None):
        from yolojet.images.decoders import DecodedBatch

        self.threads.add(threading.current_thread().name)
        if entering is not None:  # as the hardware decoder does before its long call: the other feed thread goes on
            entering.set()
            time.sleep(0.001)
        reuse = pool.take_images(len(pool)) if pool is not None else []  # every token released so far
        with self.lock:
            self.early += [token for token in reuse if token.split("#")[0] not in self.consumed]
            self.reused += len(reuse)
        decoded = self.inner.finish(pending)
        return DecodedBatch(decoded.items, decoded.ready, [f"{p.item.path}#{id(p)}" for p in pending])

    def describe(self) -> str:
        return "lending"

    def close(self) -> None:
        self.inner.close()


def test_a_list_feeds_on_one_thread_and_buffers_come_back_only_after_their_results(reference, tmp_path, monkeypatch):
    """engine.stream over a list: one feed thread prepares and decodes; each batch's decoder buffers are handed back
    (`release`) only once the batch's results have all been given to the caller, and later decodes get them."""
    from yolojet.engine.feed import FrameFeed

    bus = (ASSETS / "bus.jpg").read_bytes()
    paths = []
    for i in range(14):
        paths.append(str(tmp_path / f"{i:02d}.jpg"))
        Path(paths[-1]).write_bytes(bus)
    lending = _LendingDecoder()
    released_early: list[str] = []
    release = FrameFeed.release

    def checked_release(feed, fed):
        with lending.lock:
            released_early.extend(str(s) for s in fed.sources if str(s) not in lending.consumed)
        release(feed, fed)

    monkeypatch.setattr(FrameFeed, "release", checked_release)
    kept, reference.decoder = reference.decoder, lending
    try:
        for result in reference.stream(paths, conf=CONF):
            assert result.error is None
            with lending.lock:
                lending.consumed.add(result.path)
        assert lending.threads == {"yolojet-feed"}
        assert released_early == [] and lending.early == [] and lending.reused > 0
        lending.threads.clear()
        assert len(list(reference.stream(iter(paths[:4]), conf=CONF))) == 4  # unknown length: source + decode
        assert lending.threads == {"yolojet-feed-source", "yolojet-feed-decode"}
    finally:
        reference.decoder = kept
        lending.close()


@pytest.mark.gpu(reason="the hardware decoder needs a CUDA GPU")
@pytest.mark.parametrize("decoder", ["nvimgcodec", "hardware"])
def test_a_long_stream_of_files_on_the_hardware_decoder_gives_each_file_its_own_result(tmp_path, decoder):
    """Files of two sizes in turn, many batches long, and a call of two batches: the hardware decoder (nvImageCodec
    reading the files itself, or nvJPEG's C API fed by two threads) decodes later batches into earlier batches' released
    buffers, and every result equals the file's own run alone."""
    model_dir = yolojet.export(calibrated_model("yolov8n.yaml", 640), out=tmp_path / "m", imgsz=640)
    try:
        engine = Engine.load(model_dir, max_batch=16, decoder=decoder)
    except EngineConfigError as e:
        pytest.skip(str(e))
    originals = [ASSETS / "bus.jpg", ASSETS / "zidane.jpg"]
    paths = []
    for i in range(160):
        paths.append(tmp_path / f"{i:03d}.jpg")
        paths[-1].write_bytes(originals[i % 2].read_bytes())
    try:
        alone = [engine([path], conf=CONF)[0] for path in originals]
        results = list(engine.stream([str(p) for p in paths], conf=CONF))
        assert len(results) == len(paths)
        # A call's list (two batches: whole chunks handed to the hardware decoder's finishing thread) as well.
        results[:32] = engine([str(p) for p in paths[:32]], conf=CONF)
        for i, result in enumerate(results):
            want = alone[i % 2]
            assert result.error is None and result.orig_shape == want.orig_shape, i
            assert not match_detections(result.boxes.data, want.boxes.data, iou_min=0.99, conf_tol=1e-3, px_tol=0.5), i
        assert np.array_equal(results[3].orig_img, cv2.imread(str(paths[3])))
    finally:
        engine.close()


def test_a_blocking_decoder_is_fed_by_two_threads_and_every_image_arrives_in_order():
    """A decoder whose `finish` is one long call letting go of the GIL (the hardware decoder's) is fed by two threads:
    a list of at most two batches (one call's) by two taking turns chunk by chunk (up to four chunks of 4 here, full
    or not), a longer one handed over image by image to a decode thread. The turns and handovers lose and reorder
    nothing."""
    from yolojet.engine.feed import FrameFeed

    lending = _LendingDecoder()
    lending.blocking_finish = True
    try:
        for count in (0, 3, 8, 9, 13, 16, 37):
            lending.threads.clear()
            images = [np.full((4, 6, 3), i, np.uint8) for i in range(count)]
            feed = FrameFeed(images, lending, batch=8, chunk=4)
            values = [int(f.pixels[0, 0, 0]) for fed in feed for f in fed.decoded.items]
            assert values == list(range(count)), count
            # pixels in memory: the decoder's prepare is never called
            taking_turns = {"yolojet-feed-0", "yolojet-feed-1"} if count > 4 else {"yolojet-feed-0"} if count else set()
            assert lending.threads == (taking_turns if count <= 16 else {"yolojet-feed-decode"}), count
    finally:
        lending.close()


class _SlowBlockingDecoder:
    """A stand-in for the hardware decoder's costs: `prepare` holds the GIL 5 ms an image, `finish` lets go of it for
    80 ms (saying so first, as the hardware decoder does); records when each ran."""

    blocking_finish = True
    name = "slow-blocking"

    def __init__(self) -> None:
        from yolojet.images.decoders import CpuDecoder

        self.cpu = CpuDecoder(torch.device("cpu"), threads=1)
        self.prepared: list[float] = []
        self.finishing: list[tuple[float, float]] = []

    def prepare(self, item):
        from yolojet.images.decoders import Pending
        from yolojet.images.frames import Frame

        end = time.perf_counter() + 0.005
        while time.perf_counter() < end:
            pass
        self.prepared.append(time.perf_counter())
        return Pending(item, outcome=Frame(torch.full((2, 2, 3), item.read()[0], dtype=torch.uint8), bgr=True))

    def finish(self, pending, pool=None, entering=None):
        from yolojet.images.decoders import DecodedBatch

        start = time.perf_counter()
        if entering is not None:
            entering.set()
        time.sleep(0.08)
        self.finishing.append((start, time.perf_counter()))
        return DecodedBatch([p.result() for p in pending], [])

    def close(self) -> None:
        self.cpu.close()


@pytest.mark.parametrize("blocking", [True, False])
def test_a_short_list_prepares_its_next_chunk_while_a_blocking_decoder_decodes(blocking):
    """One call's list (two chunks of 4) on a decoder whose `finish` lets go of the GIL: the second chunk's images are
    prepared while the first decodes, not all before it; a decoder that does not say it blocks gets one thread, which
    prepares the next chunk before finishing the one before."""
    from yolojet.engine.feed import FrameFeed

    decoder = _SlowBlockingDecoder()
    decoder.blocking_finish = blocking
    try:
        fed = list(FrameFeed([bytes([i]) * 8 for i in range(8)], decoder, batch=4))
        assert [int(f.pixels[0, 0, 0]) for batch in fed for f in batch.decoded.items] == list(range(8))
        first_start, first_end = decoder.finishing[0]
        during = [t for t in decoder.prepared[4:] if first_start < t < first_end]
        assert (len(during) > 0) == blocking, (decoder.prepared, decoder.finishing)
    finally:
        decoder.close()


class _FailsAt:
    """A sized collection whose iteration raises at item `at` (a dataset whose loading of one item fails)."""

    def __init__(self, size: int, at: int) -> None:
        self.size, self.at = size, at

    def __len__(self) -> int:
        return self.size

    def __iter__(self):
        for i in range(self.size):
            if i == self.at:
                raise OSError(f"item {i} could not be loaded")
            yield np.full((4, 6, 3), i, np.uint8)


@pytest.mark.parametrize("blocking", [True, False])
@pytest.mark.parametrize("at", [0, 2, 6])
def test_a_collection_failing_midway_gives_every_image_before_it_then_its_error(blocking, at):
    """One call's list (two batches of 4) whose iteration raises at item `at`: the feed gives every image before it,
    in order, then raises the collection's error, on one thread and with a blocking decoder's two."""
    from yolojet.engine.feed import FrameFeed

    lending = _LendingDecoder()
    lending.blocking_finish = blocking
    values: list[int] = []
    try:
        with pytest.raises(OSError, match=f"item {at} could not be loaded"):
            for fed in FrameFeed(_FailsAt(8, at), lending, batch=4):
                values += [int(f.pixels[0, 0, 0]) for f in fed.decoded.items]
        assert values == list(range(at))
    finally:
        lending.close()


class _FailingOnSecondCall(_LendingDecoder):
    """The lending decoder, whose second `finish` raises (a decoder's own failure, not one image's), before or after
    saying it has entered its long call."""

    def __init__(self, after_entering: bool) -> None:
        super().__init__()
        self.calls = 0
        self.after_entering = after_entering

    def finish(self, pending, pool=None, entering=None):
        with self.lock:
            self.calls += 1
            second = self.calls == 2
        if second:
            if self.after_entering and entering is not None:
                entering.set()
                time.sleep(0.02)  # the other thread prepares (and may begin decoding) the next chunk meanwhile
            raise RuntimeError("the decoder broke")
        return super().finish(pending, pool, entering)


@pytest.mark.parametrize("blocking", [True, False])
@pytest.mark.parametrize("after_entering", [False, True])
@pytest.mark.parametrize("count", [8, 12, 16])
def test_a_decoder_failing_on_a_later_chunk_gives_the_chunks_before_it_then_its_error(blocking, after_entering, count):
    """One call's list (two batches of 8, in chunks of 4: two to four chunks) whose decoder raises at its second chunk,
    before or after entering its long call: the first chunk's images come first, in order, then the decoder's error,
    no chunk after the failed one is decoded, and no feed thread is left running even without closing the feed."""
    from yolojet.engine.feed import FrameFeed

    decoder = _FailingOnSecondCall(after_entering)
    decoder.blocking_finish = blocking
    images = [np.full((4, 6, 3), i, np.uint8) for i in range(count)]
    values: list[int] = []
    before = set(threading.enumerate())
    feed = FrameFeed(images, decoder, batch=8, chunk=4)
    try:
        with pytest.raises(RuntimeError, match="the decoder broke"):
            while (fed := feed.next_batch()) is not None:
                values += [int(f.pixels[0, 0, 0]) for f in fed.decoded.items]
        assert values == list(range(4))
        for thread in feed._threads:
            thread.join(timeout=5)
        assert not [t for t in threading.enumerate() if t not in before and t.name.startswith("yolojet-feed")]
        # the one thread prepares one chunk ahead and decodes nothing past the failure; two taking turns at most begin
        # the chunk after the failed one, and decode it only where the failure came before its turn was over
        assert decoder.calls <= (3 if blocking and after_entering else 2), decoder.calls
    finally:
        feed.close()
        decoder.close()


class _SizedFailingAtOnce:
    """A sized collection whose `__iter__` itself raises (not a generator, which raises at its first item)."""

    def __len__(self) -> int:
        return 8

    def __iter__(self):
        raise OSError("the collection could not be opened")


class _LyingLength(list):
    """A list that says it holds `said` items."""

    def __init__(self, items, said: int) -> None:
        super().__init__(items)
        self.said = said

    def __len__(self) -> int:
        return self.said


class _PrepareFailsAt(_SlowBlockingDecoder):
    """The slow blocking decoder, whose `prepare` raises (a decoder's own failure, not a bad image's) at image `at`."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at

    def prepare(self, item):
        if item.read()[0] == self.at:
            raise RuntimeError(f"prepare broke at {self.at}")
        return super().prepare(item)


def _feed_values(feed) -> list[int]:
    return [int(f.pixels[0, 0, 0]) for fed in feed for f in fed.decoded.items]


def test_a_short_list_taking_turns_handles_odd_collections():
    """The two threads taking turns over one call's list: a collection whose `__iter__` raises at once gives its error;
    one whose `len()` says more or fewer items than it holds gives every item it holds, in order; a decoder whose
    `prepare` raises at one image gives every image before it, then its error."""
    from yolojet.engine.feed import FrameFeed

    lending = _LendingDecoder()
    lending.blocking_finish = True
    try:
        with pytest.raises(OSError, match="could not be opened"):
            _feed_values(FrameFeed(_SizedFailingAtOnce(), lending, batch=8, chunk=4))
        for held, said in ((10, 4), (3, 16), (16, 12)):
            images = _LyingLength([np.full((4, 6, 3), i, np.uint8) for i in range(held)], said)
            assert _feed_values(FrameFeed(images, lending, batch=8, chunk=4)) == list(range(held)), (held, said)
    finally:
        lending.close()
    for at in (0, 5, 9):
        failing = _PrepareFailsAt(at)
        failing.blocking_finish = True
        values: list[int] = []
        try:
            with pytest.raises(RuntimeError, match=f"prepare broke at {at}"):
                for fed in FrameFeed([bytes([i]) * 8 for i in range(12)], failing, batch=8, chunk=4):
                    values += [int(f.pixels[0, 0, 0]) for f in fed.decoded.items]
            assert values == list(range(at)), at
        finally:
            failing.close()


def _feeds(decoder):
    """One feed of each kind over `decoder`: a list on one thread and a short list taking turns (16 images, batches of
    8, chunks of 4), a long list and an iterable handed over image by image (40 images, batches of 4); each of 8-byte
    images whose first byte is their index."""
    from yolojet.engine.feed import FrameFeed

    def made(images, blocking, batch, chunk=None):
        decoder.blocking_finish = blocking
        return FrameFeed(images, decoder, batch=batch, chunk=chunk)

    return {
        "one thread": lambda: made([bytes([i]) * 8 for i in range(16)], False, 8, 4),
        "turns": lambda: made([bytes([i]) * 8 for i in range(16)], True, 8, 4),
        "long list": lambda: made([bytes([i % 256]) * 8 for i in range(40)], True, 4),
        "iterable": lambda: made(iter([bytes([i % 256]) * 8 for i in range(40)]), True, 4),
    }


@pytest.mark.parametrize("kind", ["one thread", "turns", "long list", "iterable"])
def test_a_closed_feed_gives_no_more_batches_and_begins_no_decode(kind):
    """Closed after its first batch, a feed of each kind: `next_batch` then says the end at once, no image's prepare
    and no decode call begins after the close, no feed thread is left; closing inside a `for` over the feed ends the
    loop."""
    decoder = _SlowBlockingDecoder()
    before = set(threading.enumerate())
    try:
        feed = _feeds(decoder)[kind]()
        first = feed.next_batch()
        assert first is not None
        # In order from the first image; an iterable's feed may cut its first batch short (a busy machine's next image
        # arrives after the cut's linger), so only its length is left open.
        got = [int(f.pixels[0, 0, 0]) for f in first.decoded.items]
        assert got and got == list(range(len(got))), got
        closed_at = time.perf_counter()
        feed.close()
        assert feed.next_batch() is None
        # (an image's prepare takes 5 ms; a thread may pass its last look at the stop just before close sets it)
        assert all(ended - 0.005 < closed_at + 0.001 for ended in decoder.prepared), (closed_at, decoder.prepared)
        assert all(started < closed_at + 0.001 for started, _ in decoder.finishing), (closed_at, decoder.finishing)
        assert not [t for t in threading.enumerate() if t not in before and t.name.startswith("yolojet-feed")]
        looped = 0
        feed = _feeds(decoder)[kind]()
        for _fed in feed:
            looped += 1
            feed.close()
        assert looped == 1
    finally:
        decoder.close()


@pytest.mark.parametrize("kind", ["one thread", "turns", "long list", "iterable"])
def test_a_feed_closed_from_another_thread_wakes_its_waiting_consumer(kind):
    """A consumer waiting in `next_batch` for a slow decoder's first batch, and the feed closed from another thread:
    the consumer is told the end (or given the batch that was on its way) within a second, not left waiting."""
    decoder = _SlowBlockingDecoder()
    try:
        feed = _feeds(decoder)[kind]()
        closer = threading.Timer(0.01, feed.close)
        closer.start()
        start = time.perf_counter()
        while feed.next_batch() is not None:
            pass
        assert time.perf_counter() - start < 1.0
        closer.join()
    finally:
        decoder.close()


def test_a_decoder_failure_on_a_long_list_stops_its_source_thread():
    """A long list (1,000 images) whose decoder fails on its first chunk: the consumer gets the error, and the source
    thread stops reading the list without the feed being closed."""
    from yolojet.engine.feed import FrameFeed

    failing = _FailingOnSecondCall(after_entering=False)
    failing.calls = 1  # the first call is the failing one
    failing.blocking_finish = True
    feed = FrameFeed([np.full((4, 6, 3), i % 256, np.uint8) for i in range(1000)], failing, batch=4)
    try:
        with pytest.raises(RuntimeError, match="the decoder broke"):
            while feed.next_batch() is not None:
                pass
        for thread in feed._threads:
            thread.join(timeout=5)
        assert not [t.name for t in feed._threads if t.is_alive()]
    finally:
        feed.close()
        failing.close()
