"""What users pass as an image → a decoded `Frame`; the decoders and their choice; finding image files.

- `frames`: the `Frame` and images given in memory (numpy, torch, PIL);
- `codecs`: what encoded bytes say before decoding, and decoding on the CPU;
- `decoders`: batches of files or bytes decoded on the GPU's hardware JPEG decoders or a pool of CPU threads;
- `sources`: files, globs and directories.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from yolojet.images.sources import IMAGE_SUFFIXES, expand_sources, read_image_file
from yolojet.options import DEFAULT_MAX_PIXELS

if TYPE_CHECKING:
    from yolojet.images.frames import Frame, describe, is_encoded

# Loaded on first use: `frames` (and `codecs`) import torch, which a labeling client (files in, requests out) never
# needs, and which costs each of its processes seconds to start.
_LAZY = {
    "Frame": "frames",
    "describe": "frames",
    "is_encoded": "frames",
}

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "IMAGE_SUFFIXES",
    "Frame",
    "describe",
    "expand_sources",
    "is_encoded",
    "load_frame",
    "read_image_file",
]


def load_frame(source: Any, max_pixels: int = DEFAULT_MAX_PIXELS) -> Frame:
    """One image as a `Frame` on the CPU: a file or bytes decoded (as OpenCV decodes them), pixels in memory as
    they are."""
    from yolojet.images.codecs import check_encoded, decode_cpu
    from yolojet.images.frames import Frame, describe, frame_from_pixels, is_encoded

    if not is_encoded(source):
        return frame_from_pixels(source)
    name = describe(source)
    data = read_image_file(source) if isinstance(source, (str, Path)) else bytes(source)
    check_encoded(data, name, max_pixels)
    path = str(source) if isinstance(source, (str, Path)) else ""
    return Frame(decode_cpu(data, name), bgr=True, path=path, encoded=data)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"yolojet.images.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'yolojet.images' has no attribute {name!r}")
