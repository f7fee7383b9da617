"""yolojet: ultralytics YOLO models on NVIDIA GPUs through hand-written Triton kernels.

The exporter (and so ultralytics) is imported only when `export` is called: running an exported
model directory needs neither.
"""

from __future__ import annotations

from yolojet.errors import YolojetError
from yolojet.export import export
from yolojet.ir import Graph, ModelMeta
from yolojet.runtime.reference import ReferenceExecutor, load_reference

__version__ = "0.1.0"
__all__ = ["Graph", "ModelMeta", "ReferenceExecutor", "YolojetError", "export", "load_reference"]
