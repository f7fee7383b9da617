"""Decoding files and bytes in batches (yolojet/images/decoders.py, codecs.py): OpenCV's pixels (what ultralytics
reads with), EXIF orientation as cv2 applies it, errors per image naming it (cut-short files, pixel bombs), and each
decoder on the machines it runs on. The references are OpenCV's `imdecode` and Pillow."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from ultralytics.utils import ASSETS

from yolojet.errors import EngineConfigError, ImageReadError
from yolojet.images import Frame
from yolojet.images.codecs import check_encoded, jpeg_info
from yolojet.images.decoders import CpuDecoder, Encoded, OutputPool, _upright, make_decoder

BUS = ASSETS / "bus.jpg"
CUDA = torch.cuda.is_available()


def cv2_rgb(data: bytes) -> np.ndarray:
    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)[..., ::-1]


def jpeg(image: Image.Image, **save) -> bytes:
    out = io.BytesIO()
    image.save(out, format="JPEG", **save)
    return out.getvalue()


def with_orientation(image: Image.Image, orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return jpeg(image, exif=exif.tobytes(), quality=95)


@pytest.fixture(scope="module")
def cpu_decoder():
    decoder = CpuDecoder(torch.device("cpu"), threads=2)
    yield decoder
    decoder.close()


def gpu_decoder_or_skip(name: str):
    """The decoder `name` on the GPU, or the test skipped with the reason it cannot run here."""
    try:
        return make_decoder(name, torch.device("cuda"))
    except EngineConfigError as e:
        pytest.skip(str(e))


def rgb(frame: Frame) -> np.ndarray:
    """The frame's pixels in RGB order, from its own `bgr` flag (the CPU pool decodes to BGR, the GPU to RGB)."""
    pixels = frame.pixels.cpu().numpy()
    return pixels[..., ::-1] if frame.bgr else pixels


def test_a_batch_keeps_its_order_and_each_error_to_its_image(cpu_decoder, tmp_path):
    data = BUS.read_bytes()
    (tmp_path / "half.jpg").write_bytes(data[: len(data) // 2])
    (tmp_path / "head.jpg").write_bytes(data[:600])
    (tmp_path / "folder.jpg").mkdir()
    png = io.BytesIO()
    Image.open(BUS).save(png, format="PNG")
    items = [
        BUS,
        tmp_path / "half.jpg",
        data,
        tmp_path / "head.jpg",
        tmp_path / "folder.jpg",
        png.getvalue(),
        tmp_path / "missing.jpg",
        b"not an image at all",
        f"{BUS}\0.png",  # a name no file can have, which the system would read only up to the NUL
    ]
    batch = cpu_decoder.decode([Encoded.of(i) for i in items])
    kinds = [type(o).__name__ for o in batch.items]
    assert kinds == [
        "Frame",
        "ImageReadError",
        "Frame",
        "ImageReadError",
        "ImageReadError",
        "Frame",
        "ImageReadError",
        "ImageReadError",
        "ImageReadError",
    ]
    messages = [str(o) for o in batch.items if isinstance(o, ImageReadError)]
    assert f"{tmp_path / 'half.jpg'}: cannot decode as an image (a JPEG cut short" in messages[0]
    assert f"{tmp_path / 'head.jpg'}: cannot decode" in messages[1]
    assert "is a directory" in messages[2] and "no such file" in messages[3]
    assert "<19 bytes>: cannot decode as an image (not a JPEG, PNG" in messages[4]
    assert "a path with a NUL character" in messages[5]
    reference = cv2_rgb(data)
    for frame in (batch.items[0], batch.items[2], batch.items[5]):
        assert frame.pixels.shape == (1080, 810, 3) and frame.bgr
        assert np.array_equal(rgb(frame), reference)
    assert batch.items[0].path == str(BUS) and batch.items[2].path == ""
    assert batch.items[0].encoded == data  # kept to decode the original image again on demand


def test_cut_short_jpegs_are_errors_even_where_only_the_end_marker_is_missing(cpu_decoder):
    data = BUS.read_bytes()
    for cut in (len(data) // 2, 600, len(data) - 2):
        with pytest.raises(ImageReadError, match="cannot decode"):
            cpu_decoder.decode_one(Encoded.of(data[:cut]))
    assert jpeg_info(data).complete and not jpeg_info(data[: len(data) - 2]).complete


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_as_opencv_applies_it(cpu_decoder, orientation):
    stored = Image.open(BUS).convert("RGB").resize((203, 270))
    data = with_orientation(stored, orientation)
    assert jpeg_info(data).orientation == orientation
    frame = cpu_decoder.decode_one(Encoded.of(data))
    assert np.array_equal(rgb(frame), cv2_rgb(data))
    # The orientation step the GPU's nvJPEG path applies itself, against Pillow's on the pixels as stored.
    as_stored = torch.from_numpy(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).copy())
    upright = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))
    assert np.array_equal(_upright(as_stored, orientation).numpy(), upright)


def test_cmyk_grey_progressive_and_one_pixel_jpegs(cpu_decoder):
    photo = Image.open(BUS).convert("RGB").resize((120, 160))
    cases = {
        "cmyk": jpeg(photo.convert("CMYK")),
        "grey": jpeg(photo.convert("L")),
        "progressive": jpeg(photo, progressive=True),
        "one pixel": jpeg(Image.new("RGB", (1, 1), (10, 200, 30))),
    }
    assert jpeg_info(cases["progressive"]).progressive and jpeg_info(cases["cmyk"]).components == 4
    for name, data in cases.items():
        frame = cpu_decoder.decode_one(Encoded.of(data))
        diff = np.abs(rgb(frame).astype(int) - cv2_rgb(data).astype(int))
        assert diff.max() <= (1 if name == "cmyk" else 0), name  # CMYK: the colour conversion rounds differently


def test_pixel_limit_refuses_before_decoding(tmp_path):
    decoder = CpuDecoder(torch.device("cpu"), max_pixels=100 * 100, threads=1)
    try:
        small = jpeg(Image.new("RGB", (100, 100)))
        big = io.BytesIO()
        Image.new("RGB", (101, 100)).save(big, format="PNG")
        assert decoder.decode_one(Encoded.of(small)).shape == (100, 100)
        with pytest.raises(ImageReadError, match=r"100x101 is 10,100 pixels, over the limit of 10,000"):
            decoder.decode_one(Encoded.of(big.getvalue()))
    finally:
        decoder.close()
    with pytest.raises(ImageReadError, match="empty"):
        check_encoded(b"", "<0 bytes>", 10)


def test_decoder_choice(monkeypatch):
    cpu = torch.device("cpu")
    decoder = make_decoder("auto", cpu)
    assert decoder.name == "cpu" and "threads" in decoder.describe()
    decoder.close()
    with pytest.raises(EngineConfigError, match="decoder 'nvimgcodec' decodes on a CUDA GPU"):
        make_decoder("nvimgcodec", cpu)
    expected = "decoder 'fast': expected one of auto, nvimgcodec, hardware, cpu, nvjpeg"
    with pytest.raises(EngineConfigError, match=expected):
        make_decoder("fast", cpu)
    with pytest.raises(EngineConfigError, match="max_pixels 0"):
        make_decoder("cpu", cpu, max_pixels=0)
    with pytest.raises(EngineConfigError, match="decoder 'hardware' decodes on a CUDA GPU"):
        make_decoder("hardware", cpu)


@pytest.mark.skipif(CUDA, reason="the error of a machine without a usable GPU")
def test_nvjpeg_hardware_without_a_gpu_says_so():
    """nvJPEG's library is installed with yolojet on Linux; without a GPU its handle cannot be made, and the error
    says why in nvJPEG's words, not a ctypes crash."""
    from yolojet.images.nvjpeg_hardware import NvjpegHardware, find_library

    if find_library() is None:
        pytest.skip("nvJPEG's library is not installed here")
    with pytest.raises(EngineConfigError, match=r"decoder 'hardware': no hardware JPEG decoder here \(nvJPEG status"):
        NvjpegHardware()


@pytest.mark.gpu(reason="the GPU decoders need a CUDA GPU")
@pytest.mark.parametrize("name", ["nvimgcodec", "hardware", "nvjpeg", "cpu"])
def test_gpu_decoders_on_real_and_awkward_jpegs(name):
    """Every decoder that can run here: frames on the GPU, within a level of OpenCV's pixels (nvimgcodec, cpu) or
    close (nvjpeg); CMYK, progressive, EXIF-rotated, one-pixel and cut-short JPEGs handled per image."""
    decoder = gpu_decoder_or_skip(name)
    photo = Image.open(BUS).convert("RGB")
    data = BUS.read_bytes()
    one_pixel = jpeg(Image.new("RGB", (1, 1), (10, 200, 30)))
    items = [
        data,
        (ASSETS / "zidane.jpg").read_bytes(),
        jpeg(photo.convert("CMYK")),
        jpeg(photo, progressive=True),
        with_orientation(photo, 6),
        one_pixel,
        data[: len(data) // 2],
    ]
    try:
        batch = decoder.decode([Encoded.of(i) for i in items])
        batch.wait_on(torch.cuda.current_stream())
        assert isinstance(batch.items[-1], ImageReadError) and "cut short" in str(batch.items[-1])
        limit = 1 if name != "nvjpeg" else 60
        for i, (data_i, frame) in enumerate(zip(items[:-1], batch.items[:-1], strict=True)):
            assert isinstance(frame, Frame), f"item {i}: {frame}"
            assert frame.pixels.device.type == "cuda"
            ours, reference = rgb(frame).astype(int), cv2_rgb(data_i).astype(int)
            assert ours.shape == reference.shape, f"item {i}"
            assert np.abs(ours - reference).max() <= limit, f"item {i}"
    finally:
        decoder.close()


@pytest.mark.gpu(reason="the hardware decoder needs a CUDA GPU")
def test_auto_is_the_hardware_decoder_through_nvjpeg_where_the_gpu_has_one():
    """`auto` on a GPU: nvJPEG's hardware decoder where it starts (its pixels within a level of OpenCV's), else the CPU
    pool (OpenCV's exactly); an image at once either way, frames on the GPU."""
    device = torch.device("cuda")
    decoder = make_decoder("auto", device)
    try:
        assert decoder.name in ("hardware", "cpu")
        try:
            make_decoder("hardware", device).close()
            assert decoder.name == "hardware", "the hardware decoder starts here, so auto must be it"
        except EngineConfigError:
            assert decoder.name == "cpu"
        data = BUS.read_bytes()
        for count in (1, 3):
            batch = decoder.decode([Encoded.of(data)] * count)
            batch.wait_on(torch.cuda.current_stream())
            limit = 1 if decoder.name == "hardware" else 0
            assert all(np.abs(rgb(f).astype(int) - cv2_rgb(data).astype(int)).max() <= limit for f in batch.items)
            assert all(f.pixels.device.type == "cuda" for f in batch.items)
    finally:
        decoder.close()


def awkward_files(folder: Path) -> dict[str, Path]:
    """JPEG files the hardware decoder's file route must take or leave to the ordinary path, and other odd files."""
    photo = Image.open(BUS).convert("RGB")
    data = BUS.read_bytes()
    contents = {
        "whole.jpg": data,
        "zidane.jpg": (ASSETS / "zidane.jpg").read_bytes(),
        "rotated.jpg": with_orientation(photo, 6),
        "grey.jpg": jpeg(photo.convert("L")),
        "trailer.jpg": data + b"\x00" * 200,  # data after the end marker, as some phones write
        "progressive.jpg": jpeg(photo, progressive=True),
        "cmyk.jpg": jpeg(photo.convert("CMYK")),
        "half.jpg": data[: len(data) // 2],
        "short.jpg": data[:600],
        "empty.jpg": b"",
        "junk.jpg": b"not an image " * 20,
    }
    files = {}
    for name, content in contents.items():
        files[name] = folder / name
        files[name].write_bytes(content)
    png = folder / "bus.png"
    photo.save(png)
    files["bus.png"] = png
    (folder / "folder.jpg").mkdir()
    files["folder.jpg"] = folder / "folder.jpg"
    files["missing.jpg"] = folder / "missing.jpg"
    return files


def test_only_whole_jpeg_files_the_hardware_takes_are_read_by_nvimgcodec(tmp_path):
    """The hardware decoder's file route (nvImageCodec reading the file itself) takes whole baseline-or-progressive
    JPEGs of 1 or 3 components within the pixel limit; cut-short files, CMYK, other formats, odd paths and files
    with data after their end marker take the ordinary path, which reads and checks them in Python."""
    nvimgcodec = pytest.importorskip("nvidia.nvimgcodec")
    from yolojet.images.decoders import jpeg_file_stream

    files = awkward_files(tmp_path)
    taken = {name for name, path in files.items() if jpeg_file_stream(nvimgcodec, str(path), 10**8) is not None}
    assert taken == {"whole.jpg", "zidane.jpg", "rotated.jpg", "grey.jpg", "progressive.jpg"}
    stream = jpeg_file_stream(nvimgcodec, str(files["whole.jpg"]), 10**8)
    assert (stream.width, stream.height, stream.size) == (810, 1080, BUS.stat().st_size)
    assert jpeg_file_stream(nvimgcodec, str(files["whole.jpg"]), 810 * 1080 - 1) is None  # over the limit
    assert jpeg_file_stream(nvimgcodec, "https://example.com/bus.jpg", 10**8) is None
    assert jpeg_file_stream(nvimgcodec, str(tmp_path / "clip.mp4"), 10**8) is None


def test_an_original_image_read_again_from_its_file():
    frame = Frame(torch.empty(0, 0, 3, dtype=torch.uint8), bgr=False, path=str(BUS), encoded_at_path=True)
    assert frame.reads_again and np.array_equal(frame.original_bgr(), cv2.imread(str(BUS)))


@pytest.mark.gpu(reason="the hardware decoder needs a CUDA GPU")
def test_hardware_decoder_reads_files_itself_and_decodes_into_released_images(tmp_path):
    """Files given by path: what nvImageCodec reads itself has the pixels the bytes route gives, the rest go the
    ordinary way with the errors the CPU decoder gives; a batch decoded into an earlier batch's released images has
    its own pixels."""
    decoder = gpu_decoder_or_skip("nvimgcodec")
    files = awkward_files(tmp_path)
    cpu = CpuDecoder(torch.device("cpu"), threads=2)
    try:
        by_path = decoder.decode([Encoded.of(p) for p in files.values()])
        by_bytes = decoder.decode([Encoded.of(p.read_bytes() if p.is_file() else p) for p in files.values()])
        on_cpu = cpu.decode([Encoded.of(p) for p in files.values()])
        for batch in (by_path, by_bytes):
            batch.wait_on(torch.cuda.current_stream())
        frames = {}
        for name, ours, theirs, cpus in zip(files, by_path.items, by_bytes.items, on_cpu.items, strict=True):
            if isinstance(cpus, ImageReadError):
                assert isinstance(ours, ImageReadError) and str(ours) == str(cpus), name
                continue
            assert isinstance(ours, Frame) and isinstance(theirs, Frame), f"{name}: {ours}"
            assert np.array_equal(rgb(ours), rgb(theirs)), name
            assert ours.reads_again and np.array_equal(ours.original_bgr(), cv2.imread(str(files[name]))), name
            frames[name] = rgb(ours)
        assert by_path.outputs, "the file route's images are handed back for reuse"
        # Released: the next batch (other images, another order) decodes into the same images, taking what it needs.
        again = ["zidane.jpg", "whole.jpg", "grey.jpg", "rotated.jpg", "whole.jpg"]
        pool = OutputPool()
        pool.give(by_path.outputs)
        reused = decoder.finish([decoder.prepare(Encoded.of(files[n])) for n in again], pool)
        reused.wait_on(torch.cuda.current_stream())
        for name, frame in zip(again, reused.items, strict=True):
            assert isinstance(frame, Frame) and np.array_equal(rgb(frame), frames[name]), name
        assert {id(o) for o in reused.outputs} <= {id(o) for o in by_path.outputs}, "decoded into released images"
        assert len(pool) == len(by_path.outputs) - len(reused.outputs)  # the rest stay for the next batch
    finally:
        decoder.close()
        cpu.close()


@pytest.mark.gpu(reason="the hardware decoder needs a CUDA GPU")
def test_nvjpeg_hardware_decoder_gives_nvimgcodecs_pixels_and_decodes_into_released_buffers(tmp_path):
    """The `hardware` decoder (nvJPEG's C API): from files and from bytes, every image nvImageCodec's hardware decoder
    decodes has the same pixels (the same nvJPEG call underneath), EXIF turned as cv2 turns it; the rest the CPU
    decoder's pixels or errors; a later batch decoded into a released batch's buffer has its own pixels."""
    decoder = gpu_decoder_or_skip("hardware")
    files = awkward_files(tmp_path)
    cpu = CpuDecoder(torch.device("cpu"), threads=2)
    try:
        reference = make_decoder("nvimgcodec", torch.device("cuda"))
    except EngineConfigError:
        reference = None
    try:
        by_path = decoder.decode([Encoded.of(p) for p in files.values()])
        by_bytes = decoder.decode([Encoded.of(p.read_bytes() if p.is_file() else p) for p in files.values()])
        on_cpu = cpu.decode([Encoded.of(p) for p in files.values()])
        theirs = reference.decode([Encoded.of(p) for p in files.values()]) if reference is not None else None
        for batch in (by_path, by_bytes, theirs):
            if batch is not None:
                batch.wait_on(torch.cuda.current_stream())
        frames = {}
        decoded = zip(files, by_path.items, by_bytes.items, on_cpu.items, strict=True)
        for i, (name, ours, again, cpus) in enumerate(decoded):
            if isinstance(cpus, ImageReadError):
                assert isinstance(ours, ImageReadError) and str(ours) == str(cpus), name
                continue
            assert isinstance(ours, Frame) and isinstance(again, Frame), f"{name}: {ours}"
            assert ours.pixels.device.type == "cuda", name
            assert np.array_equal(rgb(ours), rgb(again)), name
            assert np.abs(rgb(ours).astype(int) - rgb(cpus).astype(int)).max() <= 1, name
            if theirs is not None and isinstance(theirs.items[i], Frame):
                assert np.array_equal(rgb(ours), rgb(theirs.items[i])), name
            frames[name] = rgb(ours)
        assert {"whole.jpg", "rotated.jpg", "grey.jpg", "trailer.jpg", "cmyk.jpg", "bus.png"} <= set(frames)
        assert by_path.outputs, "the batch's buffer is handed back for reuse"
        again_names = ["zidane.jpg", "whole.jpg", "grey.jpg", "rotated.jpg", "whole.jpg"]
        pool = OutputPool()
        pool.give(by_path.outputs)
        reused = decoder.finish([decoder.prepare(Encoded.of(files[n])) for n in again_names], pool)
        assert reused.outputs == [by_path.outputs[0]], "decoded into the released buffer, which is large enough"
        reused.wait_on(torch.cuda.current_stream())
        for name, frame in zip(again_names, reused.items, strict=True):
            assert isinstance(frame, Frame) and np.array_equal(rgb(frame), frames[name]), name

        # Batches decoded three ahead of their release, many times over: the buffers stay as many as are held at once
        # (each batch carried every spare buffer before, and the next batch made a new one each round).
        pool, made = OutputPool(), set()
        bus = [Encoded.of(files["whole.jpg"])] * 4
        for _ in range(6):
            held = [decoder.decode(bus, pool) for _ in range(3)]
            made |= {o.data_ptr() for batch in held for o in batch.outputs}
            torch.cuda.synchronize()
            for batch in held:
                pool.give(batch.outputs)
        assert len(made) == 3 and len(pool) == 3, (made, len(pool))
    finally:
        decoder.close()
        cpu.close()
        if reference is not None:
            reference.close()


@pytest.mark.gpu(reason="the hardware decoder needs a CUDA GPU")
def test_hardware_decode_waits_for_the_work_queued_on_its_stream():
    """nvJPEG's hardware engine may write its outputs before the work queued on the stream it is given has run (seen
    on H100s). The decoder's output buffer comes from the caching allocator, which hands back a block freed on the
    decoder's stream at once: reductions of freed tensors, queued behind a long kernel, must still read their values.
    The sums are exact, so any early write shows."""
    decoder = gpu_decoder_or_skip("hardware")
    try:
        data = BUS.read_bytes()
        expected_pixels = cv2_rgb(data)
        size = expected_pixels.size  # the batch's output buffer: one image
        values = (1, 2, 3, 4)
        for _ in range(5):
            with torch.cuda.stream(decoder.stream):
                victims = [torch.full((size,), v, dtype=torch.uint8, device="cuda") for v in values]
                torch.cuda.synchronize()
                torch.cuda._sleep(200_000_000)  # the stream busy for ~0.1 s
                total = torch.zeros((), dtype=torch.float64, device="cuda")
                for victim in victims:
                    total = total + victim.sum(dtype=torch.float64)
                del victim
                victims.clear()  # freed while their sums are still queued
            batch = decoder.decode([Encoded.of(data)])
            torch.cuda.synchronize()
            assert float(total) == float(sum(v * size for v in values))
            (frame,) = batch.items
            assert isinstance(frame, Frame)
            assert np.abs(rgb(frame).astype(int) - expected_pixels.astype(int)).max() <= 1
    finally:
        decoder.close()


@pytest.mark.gpu(reason="the hardware decoder needs a CUDA GPU")
def test_two_nvjpeg_lanes_decode_a_batch_as_one_does():
    """The hardware decoder with two nvJPEG states, each decoding part of a batch on its own thread: every image as
    one state decodes it, two sizes in turn over a batch long enough to split. The device is named without an index,
    which the second lane's thread must find for itself."""
    from yolojet.images.decoders import NvjpegHardwareDecoder

    device = torch.device("cuda")
    try:
        one = NvjpegHardwareDecoder(CpuDecoder(device, threads=2), lanes=1)
    except EngineConfigError as e:
        pytest.skip(str(e))
    two = NvjpegHardwareDecoder(CpuDecoder(device, threads=2), lanes=2)
    try:
        items = [Encoded.of(BUS.read_bytes()), Encoded.of((ASSETS / "zidane.jpg").read_bytes())] * 20
        alone, split = one.decode(items), two.decode(items)
        for batch in (alone, split):
            batch.wait_on(torch.cuda.current_stream())
        for i, (a, b) in enumerate(zip(alone.items, split.items, strict=True)):
            assert isinstance(a, Frame) and isinstance(b, Frame) and np.array_equal(rgb(a), rgb(b)), i
    finally:
        one.close()
        two.close()


def test_nvimgcodec_loads_its_jpeg_extension_alone_and_keeps_a_users_folder(tmp_path):
    """The hardware decoder's start points nvImageCodec at a folder holding its nvJPEG extension alone (a link into
    the package), so that its import neither loads the other seven extensions nor prints their install hints; a
    folder the user named is kept. Each case in a fresh process: the setting is read at nvImageCodec's import."""
    pytest.importorskip("nvidia.nvimgcodec")
    script = (
        "import os, sys\n"
        "from yolojet.images.decoders import _load_only_the_jpeg_extension\n"
        "_load_only_the_jpeg_extension()\n"
        "from nvidia import nvimgcodec\n"
        "print(os.environ.get('NVIMGCODEC_EXTENSIONS_PATH', ''))\n"
    )
    env = {**os.environ, "YOLOJET_CACHE": str(tmp_path / "cache")}
    env.pop("NVIMGCODEC_EXTENSIONS_PATH", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    folder = Path(done.stdout.strip())
    assert folder.is_relative_to(tmp_path / "cache")
    (link,) = folder.iterdir()
    assert link.name.startswith("libnvjpeg_ext.so") and link.resolve().parent.name == "extensions"
    assert "Failed to load" not in done.stderr, done.stderr  # no extension, nvJPEG's included, failed to load

    users = tmp_path / "mine"
    users.mkdir()
    env["NVIMGCODEC_EXTENSIONS_PATH"] = str(users)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == str(users), done.stderr


def test_output_pool_hands_out_the_smallest_buffer_that_fits_and_keeps_the_rest():
    """A decoder takes only what it decodes into; a buffer too small for every batch is replaced, not kept beside
    the new one; images (nvImageCodec's) go out all or none."""
    pool = OutputPool()
    small, middle, large = torch.empty(10), torch.empty(20), torch.empty(30)
    pool.give([large, small, "image-a", middle, "image-b"])
    assert pool.take_buffer(15) is middle and len(pool) == 4
    assert pool.take_buffer(40) is None and len(pool) == 3  # `large`, the largest too small, dropped
    assert pool.take_buffer(5) is small and len(pool) == 2
    assert pool.take_images(3) == [] and len(pool) == 2
    assert pool.take_images(2) == ["image-a", "image-b"] and len(pool) == 0


def test_output_pool_stays_as_large_as_the_batches_held_at_once():
    """Decodes running ahead of releases by a depth that rises and falls, as a server's batches do: the buffers made
    are at most the most held at once, however long it runs (before, a batch carried every spare buffer until its
    release, and each rise of the depth made one more)."""
    rng = np.random.default_rng(0)
    pool, held, most = OutputPool(), [], 0
    for step in range(2000):
        size = int(rng.integers(1, 65)) * 100
        buffer = pool.take_buffer(size)
        held.append(torch.empty(size) if buffer is None else buffer)
        most = max(most, len(held))
        assert len(pool) + len(held) <= most, step  # the old way held 876 buffers by the end, at most 4 at once
        while len(held) > int(rng.integers(1, 4)):
            pool.give([held.pop(0)])
