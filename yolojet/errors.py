"""Typed errors. Each carries what the user gave and what was expected, so the CLI can print it as is."""

from __future__ import annotations


class YolojetError(Exception):
    """Base class of every error yolojet raises on purpose."""


class ModelNotFoundError(YolojetError, FileNotFoundError):
    """A model path or name that is neither a local file nor something ultralytics could fetch."""


class CheckpointError(YolojetError):
    """A file that exists but cannot be read as a PyTorch checkpoint (truncated, corrupt, wrong format)."""


class NotAYoloModelError(YolojetError):
    """A readable checkpoint that does not hold an ultralytics YOLO model."""


class UnsupportedModuleError(YolojetError):
    """A module class (or setting) the exporter has no converter for."""

    def __init__(self, module_class: str, layer: int | str, detail: str = "") -> None:
        self.module_class = module_class
        self.layer = layer
        message = f"layer {layer}: unsupported module {module_class}"
        super().__init__(f"{message} ({detail})" if detail else message)


class ImageSizeError(YolojetError, ValueError):
    """An image size the model cannot take (not a multiple of its largest stride, or not positive)."""


class ModelDirError(YolojetError):
    """A model directory that is missing, incomplete or written by an incompatible version."""


class GraphError(YolojetError):
    """A graph that breaks an IR rule (use before definition, unknown op, shape mismatch)."""


class ImageReadError(YolojetError, ValueError):
    """A file or buffer that cannot be decoded as an image."""


class EngineConfigError(YolojetError, ValueError):
    """An engine option that cannot work on this machine or with this model, or an input it cannot take."""


class DatasetError(YolojetError, ValueError):
    """An evaluation dataset that is missing, malformed or inconsistent with its images."""


class OutputPathError(YolojetError, ValueError):
    """An output path that cannot be written, or whose writing would destroy an input."""


class RecordsError(YolojetError, ValueError):
    """A labeling output (JSON lines) holding a line that is not one of `yolojet label`'s records."""


class YolojetWarning(UserWarning):
    """Something the user should know that does not stop the work (a folder that could not be listed); the command
    line prints these as `yolojet COMMAND: warning: ...`."""
