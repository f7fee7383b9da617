"""The hardware JPEG decoder's process (yolojet/images/hardware_process.py), run for real: a child process started
here, JPEGs sent to it and frames sent back, in order and with each error to its image; a child that dies leaves its
images and every later one to the CPU pool; a child that cannot start is an error naming why. Without a GPU the child
decodes with the CPU decoder (`kind="cpu"`, OpenCV's pixels); tests/test_decoders.py's GPU tests run nvImageCodec in
it. The reference is OpenCV's `imdecode`."""

from __future__ import annotations

import io
import os
import signal

import cv2
import numpy as np
import pytest
import torch
from PIL import Image
from ultralytics.utils import ASSETS

from yolojet.errors import EngineConfigError, ImageReadError
from yolojet.images.decoders import CpuDecoder, Encoded
from yolojet.images.hardware_process import HardwareJpegProcess

BUS, ZIDANE = ASSETS / "bus.jpg", ASSETS / "zidane.jpg"


def cv2_rgb(data: bytes) -> np.ndarray:
    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)[..., ::-1]


def encoded(image: Image.Image, fmt: str, **save) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **save)
    return out.getvalue()


def items_and_expected(tmp_path):
    """Images of every route: JPEGs the child takes (colour, grey, EXIF-rotated; paths and bytes), ones the CPU pool
    takes here (progressive JPEG, PNG), and errors (cut short, not an image, missing)."""
    rng = np.random.default_rng()
    noise = Image.fromarray(rng.integers(0, 256, (37, 53, 3), dtype=np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6
    bus = BUS.read_bytes()
    (tmp_path / "half.jpg").write_bytes(bus[: len(bus) // 2])
    good = {
        "bus path": (BUS, bus),
        "zidane bytes": (ZIDANE.read_bytes(), ZIDANE.read_bytes()),
        "noise": (encoded(noise, "JPEG", quality=90),) * 2,
        "grey": (encoded(noise.convert("L"), "JPEG"),) * 2,
        "rotated": (encoded(noise, "JPEG", exif=exif.tobytes()),) * 2,
        "progressive": (encoded(noise, "JPEG", progressive=True),) * 2,
        "png": (encoded(noise, "PNG"),) * 2,
    }
    bad = {"cut short": tmp_path / "half.jpg", "not an image": b"not an image", "missing": tmp_path / "missing.jpg"}
    return good, bad


def check(decoded, names, good) -> None:
    for name, outcome in zip(names, decoded.items, strict=True):
        if name in good:
            assert not isinstance(outcome, ImageReadError), (name, outcome)
            assert np.array_equal(outcome.pixels.cpu().numpy(), cv2_rgb(good[name][1])), name
        else:
            assert isinstance(outcome, ImageReadError), name


@pytest.fixture
def process_decoder():
    decoder = HardwareJpegProcess(CpuDecoder(torch.device("cpu"), threads=2), kind="cpu")
    yield decoder
    decoder.close()


def test_the_process_decodes_a_batch_in_order_with_each_error_to_its_image(process_decoder, tmp_path):
    good, bad = items_and_expected(tmp_path)
    names = [*good, *bad] * 3
    sources = {**{k: v[0] for k, v in good.items()}, **bad}
    assert "in a process of its own" in process_decoder.describe()
    decoded = process_decoder.decode([Encoded.of(sources[n]) for n in names])
    check(decoded, names, good)
    # The child read the file: its original image is that file read again here, as OpenCV reads it.
    from_path = decoded.items[names.index("bus path")]
    assert from_path.from_file and from_path.encoded is None
    assert np.array_equal(from_path.original_bgr(), cv2.imread(str(BUS)))
    # Later batches through the same child, prepared one by one as a feed does.
    for _ in range(2):
        pending = [process_decoder.prepare(Encoded.of(sources[n])) for n in names]
        check(process_decoder.finish(pending), names, good)
    child = process_decoder._child
    process_decoder.close()
    assert child.returncode == 0  # it ended at the end of its input


def test_a_child_that_dies_leaves_its_images_and_later_ones_to_the_cpu_pool(process_decoder, tmp_path, capfd):
    good, bad = items_and_expected(tmp_path)
    names = [*good, *bad]
    sources = {**{k: v[0] for k, v in good.items()}, **bad}
    check(process_decoder.decode([Encoded.of(sources[n]) for n in names]), names, good)
    os.kill(process_decoder._child.pid, signal.SIGKILL)
    process_decoder._child.wait()
    for _ in range(2):  # the first may be sent before this process has seen the child go
        check(process_decoder.decode([Encoded.of(sources[n]) for n in names * 2]), names * 2, good)
    assert "process has ended" in process_decoder.describe()
    assert "the hardware JPEG decoder's process ended (exit code -9)" in capfd.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a CUDA GPU: the child cannot start there")
def test_a_child_that_cannot_start_is_an_error_saying_why():
    cpu = CpuDecoder(torch.device("cpu"), threads=1)
    try:
        with pytest.raises(EngineConfigError, match="decoder 'nvimgcodec'"):
            HardwareJpegProcess(cpu)
    finally:
        cpu.close()


def test_the_ring_reuses_spans_once_every_earlier_one_is_given_back():
    from yolojet.images.hardware_process import _Ring

    ring = _Ring(100)
    try:
        rng = np.random.default_rng()
        a, b, c = (rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (40, 40, 30))
        (oa, _, sa), (ob, _, sb) = ring.put(a), ring.put(b)
        assert ring.put(c) is None  # 80 of 100 taken: no room for 30 at the end, none before the oldest
        sb[2] = True  # given back out of order: nothing is reused while the span before it is out
        assert ring.put(c) is None
        sa[2] = True
        oc, _, sc = ring.put(c)
        assert (oa, ob, oc) == (0, 40, 0)  # everything given back: from the start again
        d = rng.integers(0, 256, 60, dtype=np.uint8).tobytes()
        od, _, sd = ring.put(d)
        assert od == 30 and ring.put(b"x" * 20) is None
        sc[2] = True
        oe, _, _ = ring.put(b"y" * 20)  # wraps to the start, before the oldest span left (d at 30)
        assert oe == 0 and ring.put(b"z" * 20) is None  # 20..30 left: too small
        assert ring.memory[od : od + 60] == d and ring.memory[0:20] == b"y" * 20
    finally:
        ring.close()
