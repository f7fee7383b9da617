"""Encoded images in memory: what their bytes say before decoding (format, size, whether a JPEG is whole, its EXIF
orientation), and their decoding on the CPU.

CPU decoding is OpenCV's `imdecode` (libjpeg-turbo, libpng, libwebp), what ultralytics reads images with, so the pixels
are ultralytics' own; Pillow decodes BMP and TIFF, and GIFs where OpenCV has no GIF decoder (before 4.11). OpenCV
releases the GIL while it decodes, so a pool of threads decodes in parallel, and it imports in a few hundredths of a
second (torchvision's image decoding, used before, took 1.5-2.4 s to import, and is deprecated since 0.29).
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass

import numpy as np
import torch

from yolojet.errors import ImageReadError
from yolojet.images.sources import NOT_YET
from yolojet.options import DEFAULT_MAX_PIXELS  # noqa: F401 - where the images room names it

_JPEG_SOI = b"\xff\xd8"
JPEG_EOI = b"\xff\xd9"
# Markers with no length field: TEM, RST0-7, SOI, EOI.
_STANDALONE = {0x01, *range(0xD0, 0xD8), 0xD8, 0xD9}
# Start-of-frame markers (size and coding); C4 (DHT), C8 (JPG) and CC (DAC) share the range but are not frames.
_SOF = {*range(0xC0, 0xD0)} - {0xC4, 0xC8, 0xCC}


def image_format(data: bytes) -> str | None:
    """'jpeg', 'png', 'webp', 'gif', 'bmp' or 'tiff' from the magic bytes, else None."""
    if data[:2] == _JPEG_SOI:
        return "jpeg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if data[:2] == b"BM":
        return "bmp"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    return None


@dataclass(frozen=True)
class JpegInfo:
    """What a JPEG's markers say: its stored size, colour components, whether it is progressive, its EXIF
    orientation (1: upright), and whether an end-of-image marker follows its first scan (a file cut short has none)."""

    height: int
    width: int
    components: int
    progressive: bool
    orientation: int
    complete: bool


def jpeg_info(data: bytes) -> JpegInfo | None:
    """The markers of a JPEG up to its first scan, or None where they are not a JPEG's.

    Inside the entropy-coded data a 0xFF byte is always followed by 0x00 or a restart marker, so an end-of-image
    marker after the first scan's header can only be the real one (an EXIF thumbnail's lies before the scan).
    """
    if data[:2] != _JPEG_SOI:
        return None
    pos, size, orientation = 2, None, 1
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill bytes before a marker
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        segment = data[pos + 4 : pos + 2 + length]
        if length < 2 or len(segment) < length - 2:
            return None
        if marker in _SOF and len(segment) >= 6:
            height, width = struct.unpack(">HH", segment[1:5])
            size = (height, width, segment[5], marker in (0xC2, 0xC6, 0xCA, 0xCE))
        elif marker == 0xE1 and segment[:6] == b"Exif\x00\x00":
            orientation = _exif_orientation(segment[6:])
        elif marker == 0xDA:  # start of scan: the coded data follows this header
            if size is None:
                return None
            # Searched from the end: a whole file ends with it (or with a little padding after it).
            complete = data.rfind(JPEG_EOI, pos + 2 + length) != -1
            return JpegInfo(size[0], size[1], size[2], size[3], orientation, complete)
        pos += 2 + length
    return None


def _exif_orientation(tiff: bytes) -> int:
    """The Orientation tag (0x0112) of IFD0 in an EXIF block's TIFF structure; 1 where it is missing or unreadable."""
    if tiff[:2] not in (b"II", b"MM") or len(tiff) < 8:
        return 1
    order = "<" if tiff[:2] == b"II" else ">"
    (ifd,) = struct.unpack(order + "I", tiff[4:8])
    if ifd + 2 > len(tiff):
        return 1
    (count,) = struct.unpack(order + "H", tiff[ifd : ifd + 2])
    for i in range(count):
        entry = tiff[ifd + 2 + 12 * i : ifd + 14 + 12 * i]
        if len(entry) < 12:
            return 1
        tag, kind = struct.unpack(order + "HH", entry[:4])
        if tag == 0x0112 and kind == 3:  # SHORT
            (value,) = struct.unpack(order + "H", entry[8:10])
            return value if 1 <= value <= 8 else 1
    return 1


@dataclass(frozen=True)
class EncodedInfo:
    """What an encoded image's header says: its format, stored size, and for a JPEG its markers."""

    format: str
    height: int
    width: int
    jpeg: JpegInfo | None = None


def encoded_info(data: bytes, name: str) -> EncodedInfo:
    """The format and stored size from the header alone (nothing is decoded); an ImageReadError where the bytes are
    not an image yolojet reads."""
    kind = image_format(data)
    if kind == "jpeg":
        info = jpeg_info(data)
        if info is None:
            raise ImageReadError(f"{name}: cannot decode as an image (a JPEG whose markers are corrupt)")
        return EncodedInfo(kind, info.height, info.width, info)
    if kind is None:
        raise ImageReadError(f"{name}: cannot decode as an image (not a JPEG, PNG, WebP, GIF, BMP or TIFF image)")
    if kind == "png" and len(data) >= 24 and data[12:16] == b"IHDR":
        # Read here rather than by Pillow, whose own bomb check would refuse a size max_pixels allows.
        return EncodedInfo(kind, int.from_bytes(data[20:24], "big"), int.from_bytes(data[16:20], "big"))
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:  # reads the header only
            frames = getattr(image, "n_frames", 1) if kind == "gif" else 1  # a GIF's frames: read through once
            found = EncodedInfo(kind, image.height, image.width)
    except Exception:  # Pillow raises many types for a corrupt header, each naming its buffer or an opener it tried
        raise ImageReadError(f"{name}: cannot decode as an image (its {kind.upper()} header is corrupt)") from None
    if frames > 1:  # ultralytics predicts every frame of a GIF, as a video's; its first alone would be a wrong answer
        raise ImageReadError(
            f"{name}: an animated GIF of {frames} frames, a video, which is not supported yet ({NOT_YET})"
        )
    return found


def check_encoded(data: bytes, name: str, max_pixels: int) -> EncodedInfo:
    """The header of an encoded image that may be decoded: not empty, a known format, whole (for a JPEG) and within
    `max_pixels`; otherwise an ImageReadError naming what is wrong."""
    if len(data) == 0:
        raise ImageReadError(f"{name}: empty, not an image")
    info = encoded_info(data, name)
    if info.height < 1 or info.width < 1:
        raise ImageReadError(f"{name}: the image has zero size")
    if info.height * info.width > max_pixels:
        raise ImageReadError(
            f"{name}: {info.height}x{info.width} is {info.height * info.width:,} pixels, over the limit of "
            f"{max_pixels:,} (raise it with --max-pixels, or max_pixels= in Python)"
        )
    if info.jpeg is not None and not info.jpeg.complete:
        raise ImageReadError(f"{name}: cannot decode as an image (a JPEG cut short: no end-of-image marker)")
    return info


def decoded_size(data: bytes, name: str) -> tuple[int, int]:
    """The (height, width) an encoded image decodes to, from its header alone: a JPEG's EXIF orientations 5-8 turn
    it a quarter, as the decoders apply them. An ImageReadError where the header is not an image's."""
    info = encoded_info(data, name)
    if info.jpeg is not None and info.jpeg.orientation in (5, 6, 7, 8):
        return info.width, info.height
    return info.height, info.width


def pil_pixels(image) -> np.ndarray:
    """A PIL image's pixels as uint8 RGB (RGBA where it has alpha); 16-bit images give their top 8 bits, as
    cv2.imread and ultralytics read them (PIL's convert() would clip them at 255)."""
    from PIL import Image

    if image.mode.startswith("I;16"):
        image = Image.fromarray((np.asarray(image) >> 8).astype(np.uint8))
    return np.asarray(image.convert("RGBA" if "A" in image.getbands() else "RGB"))


def _decode_with_pillow(data: bytes, name: str) -> torch.Tensor:
    """BMP and TIFF (and GIFs where OpenCV has no GIF decoder) as BGR(A), the first frame of an animation."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            rgb = pil_pixels(image)
    except (OSError, ValueError) as e:
        raise ImageReadError(f"{name}: cannot decode as an image ({e})") from e
    order = [2, 1, 0, 3] if rgb.shape[2] == 4 else [2, 1, 0]
    return torch.from_numpy(np.ascontiguousarray(rgb[..., order]))


def decode_cpu(data: bytes, name: str) -> torch.Tensor:
    """An encoded image → uint8 (H, W, C) BGR pixels (BGRA for a BMP or TIFF with alpha) on the CPU, as cv2.imread
    reads them: turned upright by the EXIF orientation, grey as three channels, 16 bits to their top 8."""
    import cv2

    kind = image_format(data)
    if kind in ("bmp", "tiff"):
        return _decode_with_pillow(data, name)
    try:
        bgr = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)
    except cv2.error as e:  # OpenCV raises for some corrupt headers rather than returning None
        raise ImageReadError(f"{name}: cannot decode as an image ({str(e).strip().splitlines()[-1]})") from e
    if bgr is None:
        if kind == "gif":  # an OpenCV built without its GIF decoder
            return _decode_with_pillow(data, name)
        raise ImageReadError(f"{name}: cannot decode as an image (its {kind or 'image'} data is corrupt)")
    return torch.from_numpy(bgr)
