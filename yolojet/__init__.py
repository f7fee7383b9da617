"""yolojet: ultralytics YOLO models on NVIDIA GPUs through hand-written Triton kernels.

The exporter (and so ultralytics) is imported only when `export` is called: running an exported
model directory needs neither.
"""

from __future__ import annotations

from yolojet.errors import YolojetError
from yolojet.export import export
from yolojet.ir import Graph, ModelMeta

__version__ = "0.1.0"
__all__ = ["Engine", "Graph", "ModelMeta", "ReferenceExecutor", "Results", "YolojetError", "export", "load_reference"]


def __getattr__(name: str) -> object:
    # The engine pulls in Triton and every kernel module, the reference executor torch: each is loaded on first use,
    # not on `import yolojet` (so that `yolojet --help` answers at once).
    if name in ("ReferenceExecutor", "load_reference"):
        from yolojet.reference import executor

        return getattr(executor, name)
    if name == "Engine":
        from yolojet.engine.engine import Engine

        return Engine
    if name == "Results":
        from yolojet.tasks import Results

        return Results
    raise AttributeError(f"module 'yolojet' has no attribute {name!r}")
