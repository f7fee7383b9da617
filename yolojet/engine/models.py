"""From what the user named (model directory, `.pt`, ultralytics name, `.yaml`) to a loaded graph.

Checkpoints are exported on first use, at the size they were trained at, into a cache directory keyed by the file's
content, so later loads read the model directory straight away; any other input size is derived from that export
(`Graph.resized`). Architecture YAMLs build a fresh random-weight model each time and are exported to a temporary
directory.
"""

from __future__ import annotations

import hashlib
import math
import sys
import tempfile
from pathlib import Path

from yolojet.errors import ModelNotFoundError
from yolojet.ir import GRAPH_FILE, Graph
from yolojet.options import cache_dir


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def _size_tag(imgsz: int | tuple[int, int]) -> str:
    h, w = (imgsz, imgsz) if isinstance(imgsz, int) else imgsz
    return f"{h}x{w}"


def at_size(graph: Graph, imgsz: int | tuple[int, int] | None) -> Graph:
    """The graph for input size `imgsz` (None: as exported), each side rounded up to a multiple of the model's stride
    with a notice, as ultralytics' predict does (`--imgsz 33` runs at 64)."""
    if imgsz is None:
        return graph
    stride = max(graph.meta.strides or [32])
    h, w = (imgsz, imgsz) if isinstance(imgsz, int) else imgsz
    rounded = (max(math.ceil(h / stride), 1) * stride, max(math.ceil(w / stride), 1) * stride)
    if rounded != (h, w):
        print(
            f"yolojet: imgsz {_size_tag((h, w))} is not a multiple of the model's stride {stride}; "
            f"running at {_size_tag(rounded)}",
            file=sys.stderr,
        )
    return graph.resized(*rounded)


def check_model_exists(model: str | Path) -> None:
    """Refuse a model that names a file or folder that is not there before any other check (`bench` on a machine
    without a GPU names the missing model, not the GPU). A bare name of a checkpoint or architecture (yolo11n.pt,
    yolo11n.yaml) passes: ultralytics fetches the one and has the other."""
    from yolojet.export.loader import is_bare_name

    path = Path(model)
    if not path.exists() and not (is_bare_name(str(model)) and path.suffix.lower() in (".pt", ".yaml", ".yml")):
        raise ModelNotFoundError(f"{model}: no such file or model directory")


def resolve_graph(model: str | Path, imgsz: int | tuple[int, int] | None = None) -> Graph:
    """Load `model` as a graph, exporting it first when it is not already a model directory, for input size `imgsz`
    (see `at_size`). One export serves every size: the network of another size is derived from it."""
    from yolojet.export import export

    path = Path(model)
    if (path / GRAPH_FILE).is_file():
        return at_size(Graph.load(path), imgsz)
    if path.suffix.lower() in (".yaml", ".yml"):
        with tempfile.TemporaryDirectory(prefix="yolojet-") as tmp:
            return at_size(Graph.load(export(str(model), out=Path(tmp) / "model", imgsz=640)), imgsz)
    # A checkpoint is exported at the size it was trained at (what ultralytics' predict runs it at by default).
    if path.is_file():
        target = cache_dir() / "models" / f"{path.stem}-{_file_digest(path)}"
    else:  # a bare name such as yolo11n.pt: the exporter fetches it through ultralytics, or says why it cannot
        target = cache_dir() / "models" / path.stem
    if not (target / GRAPH_FILE).is_file():
        export(str(model), out=target)
    return at_size(Graph.load(target), imgsz)
