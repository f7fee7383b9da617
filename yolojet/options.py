"""The engine's options that fronts (the CLI, the server) offer before anything heavy is imported."""

from __future__ import annotations

# How files and bytes are decoded (yolojet/images/decoders.py).
DECODER_NAMES = ("auto", "nvimgcodec", "cpu", "nvjpeg")
