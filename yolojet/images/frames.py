"""Decoded images: the `Frame` every path of the engine takes, and what users pass in memory turned into one.

Accepted in memory: a numpy array (HWC uint8, BGR like OpenCV, or HW grey; uint16 gives its top 8 bits), a PIL image
(turned upright by its EXIF orientation), a torch tensor (uint8 HWC or, as torchvision's `read_image` gives it, CHW,
RGB, CPU or CUDA; or float CHW in [0, 1], RGB, as ultralytics takes). Encoded images (files, bytes) are decoded by
the decoders in yolojet/images/decoders.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from yolojet.errors import ImageReadError
from yolojet.images.codecs import decode_cpu, pil_pixels
from yolojet.images.sources import NOT_YET, read_image_file


@dataclass
class Frame:
    """An image as uint8 (H, W, C), C in {1, 3, 4}, on the CPU or a GPU, any strides; `bgr` says the channel order
    of C = 3 or 4. `encoded` keeps the file's bytes where it was decoded from one, so that the original image can be
    decoded again when someone asks for it rather than held decoded; `encoded_at_path`: the decoder read the file
    at `path` itself (the hardware decoder's files), so the original image is read from it again when asked for."""

    pixels: torch.Tensor
    bgr: bool
    path: str = ""
    encoded: bytes | None = None
    encoded_at_path: bool = False

    @property
    def reads_again(self) -> bool:
        """Whether the original image can be decoded again (from bytes or the file), so need not be kept decoded."""
        return self.encoded is not None or self.encoded_at_path

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.pixels.shape[0]), int(self.pixels.shape[1])

    def original_bgr(self) -> np.ndarray:
        """The image as ultralytics' `orig_img`: uint8 (H, W, 3) BGR on the host (grey replicated, alpha dropped).
        From the file's bytes, decoded again on the CPU, where there are any: the pixels OpenCV would read."""
        if self.reads_again:
            data = self.encoded if self.encoded is not None else read_image_file(self.path)
            pixels, bgr = decode_cpu(data, self.path or "image"), True
        else:
            pixels, bgr = self.pixels, self.bgr
        if pixels.shape[2] == 1:
            return pixels.expand(-1, -1, 3).cpu().numpy()
        if bgr and pixels.shape[2] == 3 and pixels.device.type == "cpu" and pixels.is_contiguous():
            return pixels.numpy()  # the caller's own array (or the one just decoded), as ultralytics keeps it
        pixels = pixels[..., :3]
        return (pixels if bgr else pixels.flip(-1)).cpu().numpy()


def describe(source: Any) -> str:
    """How an input is named in messages: its path, or its kind and shape."""
    if isinstance(source, (str, Path)):
        return str(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return f"<{len(source)} bytes>"
    shape = getattr(source, "shape", None)
    return f"<{type(source).__name__}{' ' + str(tuple(shape)) if shape is not None else ''}>"


def _channels_first(pixels: torch.Tensor) -> bool:
    """A uint8 (C, H, W) or (1, C, H, W) tensor, as torchvision decodes images: C of 1, 3 or 4 first and a last
    dimension no channel count could be. (H, W, C) wins where both could be meant."""
    if pixels.ndim == 4 and pixels.shape[0] != 1:
        return False
    c, last = pixels.shape[-3], pixels.shape[-1]
    return c in (1, 3, 4) and last not in (1, 3, 4)


def check_pixels(pixels: torch.Tensor, source: Any) -> torch.Tensor:
    """uint8 (H, W, C), C in {1, 3, 4}, of a nonzero size (an (H, W) grey image gains its channel axis); an error
    names `source` as `describe` does (worked out only then: a camera's frame a millisecond pays for no name)."""
    if pixels.ndim == 2:
        pixels = pixels[..., None]
    if pixels.ndim != 3 or pixels.shape[2] not in (1, 3, 4):
        raise ImageReadError(f"{describe(source)}: expected an (H, W), (H, W, 1), (H, W, 3) or (H, W, 4) image")
    if pixels.dtype != torch.uint8:
        raise ImageReadError(f"{describe(source)}: dtype {pixels.dtype}, expected uint8 pixels")
    if pixels.shape[0] == 0 or pixels.shape[1] == 0:
        raise ImageReadError(f"{describe(source)}: the image has zero size")
    return pixels


def is_encoded(source: Any) -> bool:
    """Whether a source is a file or encoded bytes (decoded by a decoder) rather than pixels in memory."""
    return isinstance(source, (str, Path, bytes, bytearray, memoryview))


def frame_from_pixels(source: Any) -> Frame:
    """A numpy array, torch tensor or PIL image as a `Frame` (its pixels not copied where they can be used as they
    are), a `Frame` as it is; anything else is an ImageReadError naming it."""
    if isinstance(source, Frame):  # decoded already (load_frame's), its channel order known
        return source
    if isinstance(source, np.ndarray):
        if source.dtype == np.uint16:  # 16-bit frames (cv2.IMREAD_UNCHANGED): the top 8 bits, as ultralytics
            source = (source >> 8).astype(np.uint8)
        if source.dtype != np.uint8:
            raise ImageReadError(
                f"{describe(source)}: dtype {source.dtype}, expected uint8 pixels (BGR, as OpenCV reads them)"
            )
        return Frame(check_pixels(torch.from_numpy(np.ascontiguousarray(source)), source), bgr=True)
    if isinstance(source, torch.Tensor):
        given = source
        if source.is_floating_point():
            if source.ndim == 4 and source.shape[0] == 1:
                source = source[0]
            if source.ndim != 3 or source.shape[0] not in (1, 3):
                raise ImageReadError(
                    f"{describe(given)}: a float tensor must be (C, H, W) or (1, C, H, W) RGB in [0, 1]"
                )
            # Values past 1 are 0-255 pixels, which ultralytics divides by 255 (with a warning); decided on the
            # tensor's device, so that a GPU frame costs no wait for its maximum.
            if source.numel():  # an empty frame has no maximum: check_pixels names its zero size
                past_one = source.amax() > 1.0 + torch.finfo(source.dtype).eps
                source = torch.where(past_one, source / 255.0, source)
            source = (source.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0)
        elif source.ndim in (3, 4) and _channels_first(source):  # torchvision's read_image / decode_jpeg layout
            source = (source[0] if source.ndim == 4 else source).permute(1, 2, 0)
        return Frame(check_pixels(source, given), bgr=False)
    pil_image: type | None
    try:
        from PIL import Image

        pil_image = Image.Image
    except ImportError:  # pragma: no cover - Pillow comes with torchvision
        pil_image = None
    if pil_image is not None and isinstance(source, pil_image):
        from PIL import ImageOps

        # Turned upright by its EXIF orientation, as ultralytics' loader does with PIL images.
        rgb = pil_pixels(ImageOps.exif_transpose(source))
        return Frame(check_pixels(torch.from_numpy(rgb.copy()), source), bgr=False)
    if isinstance(source, int) and not isinstance(source, bool):  # ultralytics' source=0: a webcam
        raise ImageReadError(f"{source}: a camera index, which is not supported yet ({NOT_YET})")
    raise ImageReadError(
        f"{describe(source)}: not an image (expected a path, bytes, numpy array, PIL image or torch tensor)"
    )
