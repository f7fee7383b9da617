"""Turning what a user passes as an image into a uint8 HWC frame, and finding image files.

Accepted: a path (str or Path), encoded bytes, a numpy array (HWC uint8, BGR like OpenCV, or
HW grey; uint16 gives its top 8 bits), a PIL image (turned upright by its EXIF orientation), a torch
tensor (uint8 HWC or, as torchvision's `read_image` gives it, CHW, RGB, CPU or CUDA; or float CHW in [0, 1],
RGB, as ultralytics takes). Files and
bytes are decoded by torchvision (JPEG, PNG, WebP, GIF: an animated one's first frame), on the GPU's
nvJPEG when the frame is wanted there, and BMP/TIFF by Pillow. Anything else is an `ImageReadError`
that names the input.
"""

from __future__ import annotations

import glob
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from yolojet.errors import ImageReadError

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff"}


@dataclass
class Frame:
    """An image as uint8 (H, W, C), C in {1, 3, 4}; `bgr` says the channel order of C = 3 or 4."""

    pixels: torch.Tensor
    bgr: bool
    path: str = ""

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.pixels.shape[0]), int(self.pixels.shape[1])


def _describe(source: Any) -> str:
    if isinstance(source, (str, Path)):
        return str(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return f"<{len(source)} bytes>"
    shape = getattr(source, "shape", None)
    return f"<{type(source).__name__}{' ' + str(tuple(shape)) if shape is not None else ''}>"


def _pil_pixels(image: Any) -> np.ndarray:
    """A PIL image's pixels as uint8 RGB (RGBA where it has alpha); 16-bit images give their top 8 bits, as
    cv2.imread and ultralytics read them (PIL's convert() would clip them at 255)."""
    from PIL import Image

    if image.mode.startswith("I;16"):
        image = Image.fromarray((np.asarray(image) >> 8).astype(np.uint8))
    return np.asarray(image.convert("RGBA" if "A" in image.getbands() else "RGB"))


def _decode_with_pillow(data: bytes, name: str) -> torch.Tensor:
    """BMP and TIFF, which torchvision does not decode (identified by their magic bytes first, so Pillow is never
    handed arbitrary bytes)."""
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            rgb = _pil_pixels(image)
    except OSError as e:
        raise ImageReadError(f"{name}: cannot decode as an image ({e})") from e
    return torch.from_numpy(rgb.copy())


def _decode(data: bytes, name: str, device: torch.device | None) -> torch.Tensor:
    from torchvision.io import ImageReadMode, decode_image, decode_jpeg

    if len(data) == 0:
        raise ImageReadError(f"{name}: empty, not an image")
    if data[:2] == b"BM" or data[:4] in (b"II*\x00", b"MM\x00*"):
        return _decode_with_pillow(data, name)
    encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    try:
        if device is not None and device.type == "cuda" and data[:2] == b"\xff\xd8":
            chw = decode_jpeg(encoded, mode=ImageReadMode.RGB, device=device, apply_exif_orientation=True)
        else:
            # EXIF orientation applied, as cv2.imread (and so ultralytics) does.
            chw = decode_image(encoded, mode=ImageReadMode.RGB, apply_exif_orientation=True)
    except RuntimeError as e:
        # torchvision prefixes its messages with the C++ function, file and line: keep only the reason.
        reason = re.sub(r"^\w+, \S+:\d+, ", "", str(e)).strip()
        if reason.startswith("Unsupported image file"):  # torchvision then lists its own optional decoders
            reason = "not a JPEG, PNG, WebP, GIF, BMP or TIFF image"
        raise ImageReadError(f"{name}: cannot decode as an image ({reason})") from e
    if chw.dim() == 4:  # an animated GIF: its first frame, the one cv2.imread gives
        chw = chw[0]
    if chw.dtype == torch.uint16:
        chw = (chw.to(torch.int32) // 256).to(torch.uint8)  # 16-bit PNGs: the top 8 bits, as cv2.imread gives
    return chw.permute(1, 2, 0)


def _channels_first(pixels: torch.Tensor) -> bool:
    """A uint8 (C, H, W) or (1, C, H, W) tensor, as torchvision decodes images: C of 1, 3 or 4 first and a last
    dimension no channel count could be. (H, W, C) wins where both could be meant."""
    if pixels.ndim == 4 and pixels.shape[0] != 1:
        return False
    c, last = pixels.shape[-3], pixels.shape[-1]
    return c in (1, 3, 4) and last not in (1, 3, 4)


def _check_pixels(pixels: torch.Tensor, name: str) -> torch.Tensor:
    if pixels.ndim == 2:
        pixels = pixels[..., None]
    if pixels.ndim != 3 or pixels.shape[2] not in (1, 3, 4):
        raise ImageReadError(f"{name}: expected an (H, W), (H, W, 1), (H, W, 3) or (H, W, 4) image")
    if pixels.dtype != torch.uint8:
        raise ImageReadError(f"{name}: dtype {pixels.dtype}, expected uint8 pixels")
    if pixels.shape[0] == 0 or pixels.shape[1] == 0:
        raise ImageReadError(f"{name}: the image has zero size")
    return pixels


def load_frame(source: Any, device: torch.device | None = None) -> Frame:
    """One image as a `Frame`; decoding happens on `device` where that is a CUDA device and the file a JPEG."""
    name = _describe(source)
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            pattern = any(ch in str(source) for ch in "*?[")  # a glob expand_sources found nothing for
            raise ImageReadError(f"{path}: {'no image file matches it' if pattern else 'no such file'}")
        return Frame(_check_pixels(_decode(path.read_bytes(), str(path), device), name), bgr=False, path=str(path))
    if isinstance(source, (bytes, bytearray, memoryview)):
        return Frame(_check_pixels(_decode(bytes(source), name, device), name), bgr=False)
    if isinstance(source, np.ndarray):
        if source.dtype == np.uint16:  # 16-bit frames (cv2.IMREAD_UNCHANGED): the top 8 bits, as ultralytics
            source = (source >> 8).astype(np.uint8)
        if source.dtype != np.uint8:
            raise ImageReadError(f"{name}: dtype {source.dtype}, expected uint8 pixels (BGR, as OpenCV reads them)")
        return Frame(_check_pixels(torch.from_numpy(np.ascontiguousarray(source)), name), bgr=True)
    if isinstance(source, torch.Tensor):
        if source.is_floating_point():
            if source.ndim == 4 and source.shape[0] == 1:
                source = source[0]
            if source.ndim != 3 or source.shape[0] not in (1, 3):
                raise ImageReadError(f"{name}: a float tensor must be (C, H, W) or (1, C, H, W) RGB in [0, 1]")
            source = (source.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0)
        elif source.ndim in (3, 4) and _channels_first(source):  # torchvision's read_image / decode_jpeg layout
            source = (source[0] if source.ndim == 4 else source).permute(1, 2, 0)
        return Frame(_check_pixels(source, name), bgr=False)
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow comes with torchvision
        Image = None
    if Image is not None and isinstance(source, Image.Image):
        from PIL import ImageOps

        # Turned upright by its EXIF orientation, as ultralytics' loader does with PIL images.
        rgb = _pil_pixels(ImageOps.exif_transpose(source))
        return Frame(_check_pixels(torch.from_numpy(rgb.copy()), name), bgr=False)
    raise ImageReadError(f"{name}: not an image (expected a path, bytes, numpy array, PIL image or torch tensor)")


def expand_sources(sources: list[str]) -> list[str]:
    """Files, globs and directories → the image files they name, in a stable order; a name matching nothing is kept
    as is so that loading it reports it."""
    files: list[str] = []
    for source in sources:
        path = Path(source)
        if path.is_dir():
            files += sorted(str(p) for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        elif any(ch in source for ch in "*?["):
            matches = sorted(glob.glob(source, recursive=True))
            files += [m for m in matches if Path(m).suffix.lower() in IMAGE_SUFFIXES and Path(m).is_file()] or [source]
        else:
            files.append(source)
    return files
