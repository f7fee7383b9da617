"""The engine's options that fronts (the CLI, the server) offer before anything heavy is imported, and the
environment variables they read."""

from __future__ import annotations

import os

# How files and bytes are decoded (yolojet/images/decoders.py).
DECODER_NAMES = ("auto", "nvimgcodec", "cpu", "nvjpeg")
# Pillow's own decompression-bomb bound (PIL.Image.MAX_IMAGE_PIXELS): about 9,459 x 9,459.
DEFAULT_MAX_PIXELS = 89_478_485


def serve_token() -> str | None:
    """The bearer token `yolojet serve` requires, from YOLOJET_TOKEN (a flag would show in the process list)."""
    token = os.environ.get("YOLOJET_TOKEN", "").strip()
    return token or None
