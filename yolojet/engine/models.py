"""From what the user named (model directory, `.pt`, ultralytics name, `.yaml`) to a loaded graph.

Checkpoints are exported on first use into a cache directory keyed by the file's content and the
image size (by default the size the checkpoint was trained at), so later loads read the model
directory straight away. Architecture YAMLs build a fresh
random-weight model each time and are exported to a temporary directory.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from yolojet.engine.autotune import cache_dir
from yolojet.errors import ImageSizeError
from yolojet.ir import GRAPH_FILE, Graph


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def _size_tag(imgsz: int | tuple[int, int]) -> str:
    h, w = (imgsz, imgsz) if isinstance(imgsz, int) else imgsz
    return f"{h}x{w}"


def resolve_graph(model: str | Path, imgsz: int | tuple[int, int] | None = None) -> Graph:
    """Load `model` as a graph, exporting it first when it is not already a model directory."""
    from yolojet.export import export

    path = Path(model)
    if (path / GRAPH_FILE).is_file():
        graph = Graph.load(path)
        if imgsz is not None and _size_tag(imgsz) != _size_tag(tuple(graph.meta.imgsz)):
            raise ImageSizeError(
                f"{path} was exported for {_size_tag(tuple(graph.meta.imgsz))}, not {_size_tag(imgsz)}: "
                f"export the checkpoint again with --imgsz {_size_tag(imgsz)}"
            )
        return graph
    # Without a size, a checkpoint runs at the size it was trained at, as ultralytics' predict does.
    tag = _size_tag(imgsz) if imgsz is not None else "trained-size"
    if path.suffix.lower() in (".yaml", ".yml"):
        with tempfile.TemporaryDirectory(prefix="yolojet-") as tmp:
            return Graph.load(export(str(model), out=Path(tmp) / "model", imgsz=imgsz if imgsz is not None else 640))
    if path.is_file():
        target = cache_dir() / "models" / f"{path.stem}-{_file_digest(path)}-{tag}"
        if not (target / GRAPH_FILE).is_file():
            export(str(model), out=target, imgsz=imgsz)
        return Graph.load(target)
    # A bare name such as yolo11n.pt: the exporter fetches it through ultralytics, or says why it cannot.
    target = cache_dir() / "models" / f"{path.stem}-{tag}"
    if not (target / GRAPH_FILE).is_file():
        export(str(model), out=target, imgsz=imgsz)
    return Graph.load(target)
