"""load_frame and expand_sources: every kind of image a user can pass gives the same pixels, every bad one an
ImageReadError that names it, and directories and globs expand to image files in a stable order.

The reference pixels come from decoders other than the one under test (OpenCV, PIL) or from arrays the test
wrote itself.
"""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from PIL import Image
from ultralytics.utils import ASSETS

from yolojet.errors import ImageReadError
from yolojet.images import Frame, expand_sources, load_frame

BUS = ASSETS / "bus.jpg"
# yolojet decodes JPEG files and bytes on the CPU with OpenCV, so its pixels equal cv2.imread's exactly. Another
# JPEG decoder (PIL's) may differ by rounding in the inverse DCT and chroma upsampling, a level or two per pixel, so
# that comparison allows 4 levels at any pixel and 0.5 on average. An orientation, channel-order or colour-space
# mistake is off by tens of levels.
JPEG_MAX_DIFF, JPEG_MEAN_DIFF = 4, 0.5


def rgb(frame: Frame) -> np.ndarray:
    """The frame's pixels as an RGB (or grey) numpy array, from its own `bgr` flag."""
    pixels = frame.pixels.cpu().numpy()
    if frame.bgr and pixels.shape[2] in (3, 4):
        pixels = np.concatenate([pixels[..., 2::-1], pixels[..., 3:]], axis=2)
    return pixels


def random_image(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Seeded uint8 pixels: smooth gradients plus noise, so a shifted or flipped channel cannot pass."""
    rng = np.random.default_rng(seed)
    h, w = shape[:2]
    base = np.add.outer(np.arange(h) * 3, np.arange(w) * 5)
    if len(shape) == 3:
        base = base[..., None] + np.arange(shape[2]) * 60
    return ((base + rng.integers(0, 40, shape)) % 256).astype(np.uint8)


@pytest.fixture(scope="module")
def bus_rgb() -> np.ndarray:
    return np.ascontiguousarray(cv2.imread(str(BUS))[..., ::-1])


def assert_jpeg_close(ours: np.ndarray, reference: np.ndarray) -> None:
    assert ours.shape == reference.shape
    diff = np.abs(ours.astype(np.int16) - reference.astype(np.int16))
    assert diff.max() <= JPEG_MAX_DIFF and diff.mean() <= JPEG_MEAN_DIFF, (diff.max(), diff.mean())


def test_jpeg_path_and_bytes_decode_to_cv2_imread_pixels(bus_rgb):
    for source in (BUS, str(BUS)):
        frame = load_frame(source)
        assert frame.bgr is True and frame.path == str(BUS)
        assert frame.pixels.dtype == torch.uint8 and tuple(frame.pixels.shape) == (1080, 810, 3)
        assert frame.shape == (1080, 810)
        assert np.array_equal(rgb(frame), bus_rgb)
    from_path = load_frame(BUS)
    for data in (BUS.read_bytes(), bytearray(BUS.read_bytes()), memoryview(BUS.read_bytes())):
        frame = load_frame(data)
        assert frame.bgr is True and frame.path == ""
        assert torch.equal(frame.pixels, from_path.pixels), "bytes and path go through the same decoder"
    # PIL is a third decoder, an independent check of the same bound.
    assert_jpeg_close(rgb(from_path), np.asarray(Image.open(BUS).convert("RGB")))


def test_in_memory_images_keep_their_pixels(bus_rgb):
    """A numpy BGR array (as cv2 decodes it), a PIL RGB image, a uint8 HWC tensor and a float CHW tensor in [0, 1]
    (also with a batch dimension) all give bus.jpg's pixels exactly, with the right channel order flag."""
    bgr = np.ascontiguousarray(bus_rgb[..., ::-1])
    chw = torch.from_numpy(bus_rgb.copy()).permute(2, 0, 1).float() / 255
    cases = {
        "numpy BGR": (bgr, True),
        "PIL RGB": (Image.fromarray(bus_rgb), False),
        "uint8 HWC tensor": (torch.from_numpy(bus_rgb.copy()), False),
        "float CHW tensor": (chw, False),
        "float 1CHW tensor": (chw[None], False),
    }
    for kind, (source, bgr_flag) in cases.items():
        frame = load_frame(source)
        assert frame.bgr is bgr_flag, kind
        assert frame.pixels.dtype == torch.uint8 and tuple(frame.pixels.shape) == (1080, 810, 3), kind
        assert frame.shape == (1080, 810) and frame.path == "", kind
        assert np.array_equal(rgb(frame), bus_rgb), kind
    # The numpy frame is the array as given, in BGR order.
    assert np.array_equal(load_frame(bgr).pixels.numpy(), bgr)


def test_jpeg_decoders_agree_across_kinds(bus_rgb):
    """The file through yolojet and cv2's decode of it handed over as an array give the same picture."""
    from_file = rgb(load_frame(str(BUS)))
    from_array = rgb(load_frame(cv2.imread(str(BUS))))
    assert np.array_equal(from_file, from_array)


def test_float_tensor_is_clamped_and_rounded_and_one_of_0_to_255_divided():
    """A float tensor is RGB in [0, 1], clamped below 0; one with values past 1 holds 0-255 pixels, which ultralytics
    divides by 255 (clamping it would leave an almost white image)."""
    g = torch.Generator().manual_seed(4)
    chw = torch.rand(3, 17, 23, generator=g) * 1.2 - 0.2  # values below 0 too
    frame = load_frame(chw)
    expected = (np.clip(chw.numpy(), 0, 1) * 255 + 0.5).astype(np.uint8).transpose(1, 2, 0)
    assert np.array_equal(frame.pixels.numpy(), expected)
    grey = load_frame(chw[:1])
    assert tuple(grey.pixels.shape) == (17, 23, 1)
    assert np.array_equal(grey.pixels.numpy(), expected[..., :1])
    pixels = torch.randint(0, 256, (3, 17, 23), generator=g).float()
    assert np.array_equal(load_frame(pixels).pixels.numpy(), pixels.permute(1, 2, 0).numpy().astype(np.uint8))


def test_uint8_tensor_in_torchvision_layout():
    """torchvision.io.read_image gives uint8 (C, H, W) RGB: the same frame as the (H, W, C) tensor, with or
    without a batch dimension of one; a shape that could be either stays (H, W, C)."""
    from torchvision.io import read_image

    chw = read_image(str(BUS))
    hwc = chw.permute(1, 2, 0).contiguous()
    for source in (chw, chw[None]):
        frame = load_frame(source)
        assert frame.bgr is False and tuple(frame.pixels.shape) == tuple(hwc.shape)
        assert torch.equal(frame.pixels, hwc)
    assert torch.equal(load_frame(chw[:1]).pixels, hwc[..., :1])  # grey
    ambiguous = torch.randint(0, 256, (3, 8, 3), dtype=torch.uint8)
    assert torch.equal(load_frame(ambiguous).pixels, ambiguous)
    with pytest.raises(ImageReadError, match="expected an"):
        load_frame(torch.zeros(2, 3, 8, 9, dtype=torch.uint8))  # a batch of two is not one image


def test_png_file_is_exact(tmp_path):
    bgr = random_image((37, 53, 3), seed=1)
    path = tmp_path / "picture.png"
    assert cv2.imwrite(str(path), bgr)
    for source in (path, path.read_bytes()):
        frame = load_frame(source)
        assert frame.bgr is True and frame.shape == (37, 53)
        assert np.array_equal(frame.pixels.numpy(), bgr)


def test_grey_and_rgba_inputs(tmp_path):
    grey = random_image((29, 41), seed=2)
    frame = load_frame(grey)
    assert tuple(frame.pixels.shape) == (29, 41, 1) and frame.shape == (29, 41)
    assert np.array_equal(frame.pixels.numpy()[..., 0], grey)
    assert tuple(load_frame(grey[..., None]).pixels.shape) == (29, 41, 1)

    bgra = random_image((29, 41, 4), seed=3)
    frame = load_frame(bgra)
    assert frame.bgr is True and tuple(frame.pixels.shape) == (29, 41, 4)
    assert np.array_equal(frame.pixels.numpy(), bgra)

    rgba = np.ascontiguousarray(bgra[..., [2, 1, 0, 3]])
    frame = load_frame(Image.fromarray(rgba, mode="RGBA"))
    assert frame.bgr is False and tuple(frame.pixels.shape) == (29, 41, 4)
    assert np.array_equal(frame.pixels.numpy(), rgba)

    frame = load_frame(Image.fromarray(grey, mode="L"))  # PIL grey comes back as RGB
    assert frame.bgr is False and np.array_equal(frame.pixels.numpy(), np.repeat(grey[..., None], 3, axis=2))

    # Files: a grey PNG decodes to three equal channels, an RGBA PNG to its RGB part.
    assert cv2.imwrite(str(tmp_path / "grey.png"), grey)
    assert np.array_equal(load_frame(tmp_path / "grey.png").pixels.numpy(), np.repeat(grey[..., None], 3, axis=2))
    assert cv2.imwrite(str(tmp_path / "rgba.png"), bgra)
    assert np.array_equal(load_frame(tmp_path / "rgba.png").pixels.numpy(), bgra[..., :3])  # BGR, as cv2 reads it


def test_errors_name_the_input(tmp_path):
    data = BUS.read_bytes()
    text_file = tmp_path / "notes.jpg"
    text_file.write_text("these are notes, not a picture\n")
    truncated_file = tmp_path / "half.jpg"
    truncated_file.write_bytes(data[: len(data) // 2])
    missing = tmp_path / "nowhere" / "missing.jpg"
    rng = np.random.default_rng(5)
    cases = [
        (missing, [str(missing), "no such file"]),
        (str(missing), [str(missing), "no such file"]),
        (tmp_path, [str(tmp_path), "is a directory, not an image file"]),
        (text_file, [str(text_file), "cannot decode"]),
        (truncated_file, [str(truncated_file), "cannot decode"]),
        (data[: len(data) // 2], [f"<{len(data) // 2} bytes>", "cannot decode"]),
        (b"", ["<0 bytes>", "empty"]),
        (np.zeros((0, 5, 3), np.uint8), ["ndarray (0, 5, 3)", "zero size"]),
        (rng.random((4, 5, 3)), ["ndarray (4, 5, 3)", "float64"]),
        (rng.integers(0, 256, (4, 5, 5), dtype=np.uint8), ["ndarray (4, 5, 5)", "(H, W, 3)"]),
        (rng.integers(0, 256, (2, 4, 5, 3), dtype=np.uint8), ["ndarray (2, 4, 5, 3)"]),
        (torch.randint(0, 256, (4, 5, 3), dtype=torch.int32), ["Tensor (4, 5, 3)", "torch.int32"]),
        (torch.rand(5, 7, 3), ["Tensor (5, 7, 3)", "(C, H, W)"]),  # a float tensor in HWC order
        (torch.rand(3, 0, 7), ["Tensor (3, 0, 7)", "zero size"]),
        (7, ["7", "a camera index, which is not supported yet"]),  # ultralytics' source=0: a webcam
        ([str(BUS)], ["<list>", "not an image"]),
    ]
    for source, fragments in cases:
        with pytest.raises(ImageReadError) as info:
            load_frame(source)
        message = str(info.value)
        assert all(f in message for f in fragments), f"{fragments} not all in {message!r}"


def touch(path: Path, data: bytes = b"x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_expand_sources(tmp_path):
    root = tmp_path / "photos"
    # Created out of order, so the result's order cannot come from the file system's.
    for name in ["zebra.png", "sub/deeper/b.webp", "sub/a.JPG", "apple.jpeg", "Mixed.Gif", "notes.txt", "sub/c.bmp"]:
        touch(root / name)
    touch(root / "sub" / "readme.md")
    touch(root / "no_suffix")

    tree = expand_sources([str(root)])
    names = ["Mixed.Gif", "apple.jpeg", "sub/a.JPG", "sub/c.bmp", "sub/deeper/b.webp", "zebra.png"]  # sorted
    expected_tree = [str(root / name) for name in names]
    assert tree == expected_tree

    globs = [str(root / "*.png"), str(root / "*.jpeg")]
    assert expand_sources(globs) == [str(root / "zebra.png"), str(root / "apple.jpeg")]  # in the order given
    assert expand_sources([str(root / "**" / "*.[jJ]*")]) == [str(root / "apple.jpeg"), str(root / "sub/a.JPG")]

    missing = str(tmp_path / "missing.jpg")
    unmatched = str(tmp_path / "*.png")
    only_text = str(root / "*.txt")
    sources = [missing, str(root / "sub"), "plain_name", unmatched, only_text, str(root / "zebra.png")]
    assert expand_sources(sources) == [
        missing,
        str(root / "sub/a.JPG"),
        str(root / "sub/c.bmp"),
        str(root / "sub/deeper/b.webp"),
        "plain_name",
        unmatched,  # a glob matching nothing is kept, so loading it reports it
        only_text,  # likewise a glob matching no image
        str(root / "zebra.png"),
    ]
    assert expand_sources([]) == []
    assert expand_sources([str(root), str(root)]) == expected_tree * 2
    # A file whose name holds glob characters is that file, not the pattern (which would name photo1.jpg here).
    touch(root / "photo[1].jpg")
    touch(root / "photo1.jpg")
    assert expand_sources([str(root / "photo[1].jpg")]) == [str(root / "photo[1].jpg")]
    assert expand_sources([str(root / "photo[0-9].jpg")]) == [str(root / "photo1.jpg")]


def test_expand_sources_skips_directories_named_like_images(tmp_path):
    """A folder called `2024.jpg` inside a directory is not an image file: it must not be handed to load_frame."""
    touch(tmp_path / "a.jpg")
    (tmp_path / "2024.jpg").mkdir()
    touch(tmp_path / "2024.jpg" / "b.png")
    assert expand_sources([str(tmp_path)]) == [str(tmp_path / "2024.jpg" / "b.png"), str(tmp_path / "a.jpg")]


def test_expand_sources_keeps_links_to_files_and_does_not_follow_links_to_folders(tmp_path):
    """Links to image files are images (a broken one too, so that reading it reports it); a link to a folder is not
    searched (a link to a parent would never end), nor kept when it is named like an image."""
    root = tmp_path / "photos"
    touch(root / "a.jpg")
    touch(tmp_path / "elsewhere" / "b.png")
    (root / "b_link.png").symlink_to(tmp_path / "elsewhere" / "b.png")
    (root / "gone.jpg").symlink_to(tmp_path / "missing.jpg")
    (root / "loop").symlink_to(root)
    (root / "folder.jpg").symlink_to(tmp_path / "elsewhere")
    assert expand_sources([str(root)]) == [str(root / name) for name in ("a.jpg", "b_link.png", "gone.jpg")]
    assert expand_sources([str(root) + "/"]) == [str(root / name) for name in ("a.jpg", "b_link.png", "gone.jpg")]


def test_a_folder_that_cannot_be_listed_is_named_in_a_warning_and_the_others_are_searched(tmp_path):
    """A folder without read permission below a source: its images cannot be found, which is said (a YolojetWarning
    naming it), and the other folders' images are still found. Run in a process that cannot read past permissions (a
    root user's is made to drop that right), as a user's would be."""
    import shutil
    import subprocess
    import sys

    touch(tmp_path / "a.jpg")
    locked = tmp_path / "locked"
    locked.mkdir()
    touch(locked / "hidden.jpg")
    locked.chmod(0)
    prefix = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("as root, dropping the right to read past permissions needs setpriv (util-linux)")
        prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--inh-caps", "-all"]
    code = "import sys; from yolojet.images import expand_sources; print(expand_sources([sys.argv[1]]))"
    try:
        done = subprocess.run([*prefix, sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
    finally:
        locked.chmod(0o755)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr([str(tmp_path / "a.jpg")])
    assert f"YolojetWarning: {locked}: cannot list this folder (Permission denied)" in done.stderr


def test_expand_sources_passes_over_fifos_and_sockets_named_like_images(tmp_path):
    """A FIFO called pipe.jpg in a folder would hold the run for ever at its first read (no writer ever comes); a
    socket cannot be read at all: neither is an image file. A link to a FIFO is passed over too."""
    import os
    import socket

    touch(tmp_path / "a.jpg")
    os.mkfifo(tmp_path / "pipe.jpg")
    (tmp_path / "pipe_link.jpg").symlink_to(tmp_path / "pipe.jpg")
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(tmp_path / "socket.png"))
        assert expand_sources([str(tmp_path)]) == [str(tmp_path / "a.jpg")]


def test_expand_sources_names_files_below_the_current_folder_as_pathlib_does(tmp_path, monkeypatch):
    for name in ("p/a.jpg", "p/..jpg", "p/.hidden.jpg", "p/.jpg", "p/q/b.PNG"):
        touch(tmp_path / name)
    monkeypatch.chdir(tmp_path)
    assert expand_sources(["."]) == ["p/..jpg", "p/.hidden.jpg", "p/a.jpg", "p/q/b.PNG"]
    assert expand_sources(["./p"]) == ["p/..jpg", "p/.hidden.jpg", "p/a.jpg", "p/q/b.PNG"]


def test_expanded_files_load(tmp_path):
    """Every file expand_sources collects from a directory loads and yields its pixels."""
    bgr = random_image((12, 18, 3), seed=6)
    assert cv2.imwrite(str(tmp_path / "image.png"), bgr)
    assert cv2.imwrite(str(tmp_path / "image.webp"), bgr, [cv2.IMWRITE_WEBP_QUALITY, 101])  # 101: lossless
    assert cv2.imwrite(str(tmp_path / "image.jpg"), bgr, [cv2.IMWRITE_JPEG_QUALITY, 100])
    Image.fromarray(np.ascontiguousarray(bgr[..., ::-1])).save(tmp_path / "image.gif")
    touch(tmp_path / "image.txt", b"not collected")
    files = expand_sources([str(tmp_path)])
    assert [Path(f).suffix for f in files] == [".gif", ".jpg", ".png", ".webp"]
    for file in files:
        frame = load_frame(file)
        assert frame.shape == (12, 18) and frame.path == file
        if file.endswith((".png", ".webp")):
            assert np.array_equal(rgb(frame), bgr[..., ::-1]), file
        else:  # lossy: JPEG at quality 100, GIF's 256-colour palette
            assert np.abs(rgb(frame).astype(int) - bgr[..., ::-1]).mean() < 12, file


def test_bmp_files_that_expand_sources_collects_load(tmp_path):
    """`.bmp` is among the suffixes expand_sources collects (as ultralytics reads them), so a BMP must decode."""
    bgr = random_image((12, 18, 3), seed=7)
    assert cv2.imwrite(str(tmp_path / "image.bmp"), bgr)
    (file,) = expand_sources([str(tmp_path)])
    assert np.array_equal(rgb(load_frame(file)), bgr[..., ::-1])


def test_16_bit_png_loads_as_8_bit_pixels(tmp_path):
    """A 16-bit PNG is a valid PNG: OpenCV (what ultralytics reads with) gives its top 8 bits; so must we."""
    deep = (random_image((15, 22, 3), seed=8).astype(np.uint16) << 8) | random_image((15, 22, 3), seed=9)
    path = tmp_path / "deep.png"
    assert cv2.imwrite(str(path), deep)
    reference = cv2.imread(str(path))
    assert reference.dtype == np.uint8
    frame = load_frame(path)
    assert frame.pixels.dtype == torch.uint8
    assert np.array_equal(rgb(frame), reference[..., ::-1])


def test_an_animated_gif_is_a_video_and_a_corrupt_one_is_named(tmp_path):
    """ultralytics' predict runs every frame of a GIF, as a video's: its first frame alone would be an answer predict
    never gives, so an animated GIF is refused as video is; a still GIF is an image. A GIF whose header is corrupt is
    named as the file, not as the in-memory buffer Pillow read it from."""
    frames = [Image.fromarray(np.full((14, 20, 3), level, np.uint8)) for level in (40, 200)]
    path = tmp_path / "moving.gif"
    frames[0].save(path, save_all=True, append_images=frames[1:])
    with pytest.raises(ImageReadError, match=r"moving.gif: an animated GIF of 2 frames, a video, which is not supp"):
        load_frame(path)
    frames[0].save(tmp_path / "still.gif")
    frame = load_frame(tmp_path / "still.gif")
    assert frame.shape == (14, 20)
    assert np.array_equal(rgb(frame), cv2.imread(str(tmp_path / "still.gif"))[..., ::-1])
    (tmp_path / "broken.gif").write_bytes(b"GIF89a" + bytes(20))
    with pytest.raises(ImageReadError, match=r"broken.gif: cannot decode as an image \(its GIF header is corrupt\)"):
        load_frame(tmp_path / "broken.gif")


def test_pil_image_is_turned_upright_by_its_exif_orientation():
    """A PIL image whose EXIF says "rotate 90°" (orientation 6) loads upright, as ultralytics' loader turns it."""
    upright = Image.open(BUS).convert("RGB")
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: the stored pixels are turned 90° counterclockwise of upright
    stored = upright.transpose(Image.Transpose.ROTATE_90)
    stored.info["exif"] = exif.tobytes()
    stored.getexif()[0x0112] = 6
    frame = load_frame(stored)
    assert frame.shape == (upright.height, upright.width)
    assert np.array_equal(frame.pixels.numpy(), np.asarray(upright))


def test_16_bit_arrays_and_pil_images_load_their_top_8_bits():
    """uint16 numpy frames and PIL "I;16" images give their top 8 bits, as ultralytics scales them."""
    deep = (random_image((9, 13, 1), seed=10).astype(np.uint16) << 8) | random_image((9, 13, 1), seed=11)
    top = (deep >> 8).astype(np.uint8)
    assert np.array_equal(load_frame(deep).pixels.numpy(), top)
    pil = Image.fromarray(deep[..., 0])
    assert pil.mode == "I;16"
    assert np.array_equal(load_frame(pil).pixels.numpy(), np.repeat(top, 3, axis=2))


def test_16_bit_grey_tiff_loads_as_8_bit_pixels(tmp_path):
    """A 16-bit TIFF (decoded by Pillow) gives its top 8 bits, as cv2.imread does, not values clipped at 255."""
    deep = (np.arange(48 * 64, dtype=np.uint32).reshape(48, 64) * 21).astype(np.uint16)
    path = tmp_path / "deep.tif"
    assert cv2.imwrite(str(path), deep)
    np.testing.assert_array_equal(rgb(load_frame(path)), cv2.imread(str(path))[..., ::-1])


def test_a_glob_matching_nothing_says_so(tmp_path):
    (source,) = expand_sources([str(tmp_path / "nomatch*.jpg")])
    with pytest.raises(ImageReadError, match=r"nomatch\*\.jpg: no image file matches it"):
        load_frame(source)


def test_png_size_comes_from_its_header_so_max_pixels_can_exceed_pillows_bound():
    """A 20000x20000 PNG's header (the pixels never read): within a raised max_pixels it passes the check Pillow's
    own bomb bound (178,956,970 pixels) would fail; at the default it is refused by ours, naming its size."""
    import struct
    import zlib

    from yolojet.images.codecs import check_encoded

    ihdr = struct.pack(">IIBBBBB", 20000, 20000, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    header = b"\x89PNG\r\n\x1a\n" + chunk
    info = check_encoded(header, "huge.png", max_pixels=500_000_000)
    assert (info.height, info.width) == (20000, 20000)
    with pytest.raises(ImageReadError, match="20000x20000 is 400,000,000 pixels, over the limit of 89,478,485"):
        check_encoded(header, "huge.png", max_pixels=89_478_485)


def test_files_in_the_page_cache_are_read_whole_and_anything_else_is_left_to_the_ordinary_read(tmp_path):
    """`read_cached_file` (a read holding the GIL, for the hardware decoder's feed) gives a cached file's exact bytes,
    and None for what `read_image_file` must read or name: empty, a folder, missing, a video, a pipe, a URL."""
    from yolojet.images.sources import read_cached_file, read_image_file

    photo = tmp_path / "photo.jpg"
    photo.write_bytes((ASSETS / "bus.jpg").read_bytes() + os.urandom(1000))  # just written: in the page cache
    grown = tmp_path / "big.png"
    grown.write_bytes(os.urandom(3 << 20))
    for path in (photo, grown):
        assert read_cached_file(str(path)) == read_image_file(path)
    (tmp_path / "empty.jpg").write_bytes(b"")
    (tmp_path / "folder.jpg").mkdir()
    (tmp_path / "clip.mp4").write_bytes(b"\x00" * 100)
    os.mkfifo(tmp_path / "pipe.jpg")
    for name in ("empty.jpg", "folder.jpg", "missing.jpg", "clip.mp4", "pipe.jpg"):
        assert read_cached_file(str(tmp_path / name)) is None, name
    assert read_cached_file("https://example.com/bus.jpg") is None


KEEPS_FREED_MEMORY = r"""
import json, resource
from yolojet.images.sources import keep_freed_memory

kept = keep_freed_memory()
faults = []
for round in range(4):  # 64 images at a time, as a batch's files read into new bytes objects are
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    held = [bytes(bytearray(137_000 + i)) for i in range(64)]
    del held
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"kept": kept, "faults": faults}))
"""


def test_freed_memory_is_kept_for_the_next_images():
    """After keep_freed_memory, a batch's worth of JPEG-sized blocks reuses the memory the batch before freed (few
    page faults from the second batch on) where glibc's defaults, which YOLOJET_KEEP_FREED_MEMORY=0 keeps, give it
    back and fault every page in again."""
    import json
    import subprocess
    import sys

    said = {}
    for how, switch in (("kept", ""), ("off", "0")):
        env = {**os.environ, "YOLOJET_KEEP_FREED_MEMORY": switch}
        run = subprocess.run([sys.executable, "-c", KEEPS_FREED_MEMORY], capture_output=True, text=True, env=env)
        assert run.returncode == 0, run.stderr
        said[how] = json.loads(run.stdout)
    pages = 64 * 137_000 // 4096  # the pages of a batch's bytes objects
    assert said["kept"]["kept"] is True and said["off"]["kept"] is False
    assert max(said["kept"]["faults"][1:]) < pages // 10, said
    assert min(said["off"]["faults"][1:]) > pages // 2, said
