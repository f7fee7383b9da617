"""The graph IR: values, nodes, model metadata, shape rules and the model directory format.

A model directory holds `graph.json` (structure, attributes, metadata) and `weights.safetensors`
(every weight, by name). Loading never unpickles anything.

Shapes are logical NCHW with a symbolic batch `"N"`: feature maps are `("N", C, H, W)`, head
tensors `("N", C, A)` (A anchors) or `("N", K, C)`, vectors `("N", C)`. How a runtime lays them
out in memory (NHWC, channel slices of a concat buffer) is the runtime's business.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save_file

from yolojet.errors import GraphError, ImageSizeError, ModelDirError

FORMAT_VERSION = 1
GRAPH_FILE = "graph.json"
WEIGHTS_FILE = "weights.safetensors"
BATCH = "N"
ACTIVATIONS = ("identity", "silu", "relu", "sigmoid")
TASKS = ("detect", "segment", "classify", "obb", "pose")

Shape = tuple[Any, ...]


@dataclass
class Value:
    """A tensor flowing between nodes; `shape[0]` is the symbolic batch."""

    name: str
    shape: Shape
    dtype: str = "float32"


@dataclass
class Node:
    """One operation. `weights` maps a role ("weight", "bias") to a key of the graph's weight table."""

    name: str
    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    weights: dict[str, str] = field(default_factory=dict)
    source: str = ""  # the ultralytics module path this node came from, e.g. "model.6.m.0.cv1"


@dataclass
class ModelMeta:
    """What a runtime needs to know about the model beyond its graph."""

    task: str
    names: dict[int, str]
    imgsz: tuple[int, int]  # (height, width) the graph was exported for
    strides: list[int] = field(default_factory=list)
    reg_max: int = 0
    end2end: bool = False
    max_det: int = 300
    kpt_shape: tuple[int, int] | None = None
    source: str = ""
    random_weights: bool = False
    ultralytics_version: str = ""
    channels: int = 3

    @property
    def nc(self) -> int:
        return len(self.names)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["names"] = {str(k): v for k, v in self.names.items()}
        data["nc"] = self.nc
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelMeta:
        data = dict(data)
        data.pop("nc", None)
        data["names"] = {int(k): v for k, v in data["names"].items()}
        data["imgsz"] = tuple(data["imgsz"])
        if data.get("kpt_shape") is not None:
            data["kpt_shape"] = tuple(data["kpt_shape"])
        return cls(**data)


# ---------------------------------------------------------------------------------------------
# Shape rules: one function per op kind, (node, input shapes, weight shapes) -> output shapes.
# The op table doubles as the list of op kinds the IR knows.


def pair(v: int | list[int] | tuple[int, ...]) -> tuple[int, int]:
    """An attribute given as one int or as (h, w) (a kernel size, stride, padding, dilation), as (h, w)."""
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _window_out(size: int, kernel: int, stride: int, pad: int, dilation: int = 1) -> int:
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1


def _expect(cond: bool, node: Node, message: str) -> None:
    if not cond:
        raise GraphError(f"node {node.name} ({node.op}): {message}")


def _conv_shapes(node: Node, ins: list[Shape], w: dict[str, tuple[int, ...]]) -> list[Shape]:
    n, c, h, wd = ins[0]
    cout, cin_per_group, kh, kw = w["weight"]
    groups = node.attrs["groups"]
    _expect(c == cin_per_group * groups, node, f"input has {c} channels, weight expects {cin_per_group}x{groups}")
    _expect(node.attrs["activation"] in ACTIVATIONS, node, f"unknown activation {node.attrs['activation']}")
    (sy, sx), (py, px), (dy, dx) = (pair(node.attrs[k]) for k in ("stride", "padding", "dilation"))
    out = (n, cout, _window_out(h, kh, sy, py, dy), _window_out(wd, kw, sx, px, dx))
    if len(ins) > 1:
        _expect(tuple(ins[1]) == out, node, f"residual shape {ins[1]} differs from output {out}")
    return [out]


def _conv_transpose_shapes(node: Node, ins: list[Shape], w: dict[str, tuple[int, ...]]) -> list[Shape]:
    n, c, h, wd = ins[0]
    cin, cout, kh, kw = w["weight"]
    _expect(c == cin, node, f"input has {c} channels, weight expects {cin}")
    (sy, sx), (py, px) = pair(node.attrs["stride"]), pair(node.attrs["padding"])
    return [(n, cout, (h - 1) * sy - 2 * py + kh, (wd - 1) * sx - 2 * px + kw)]


def _maxpool_shapes(node: Node, ins: list[Shape], w: dict[str, tuple[int, ...]]) -> list[Shape]:
    n, c, h, wd = ins[0]
    (ky, kx), (sy, sx), (py, px) = (pair(node.attrs[k]) for k in ("kernel", "stride", "padding"))
    return [(n, c, _window_out(h, ky, sy, py), _window_out(wd, kx, sx, px))]


def _upsample_shapes(node: Node, ins: list[Shape], w: dict[str, tuple[int, ...]]) -> list[Shape]:
    n, c, h, wd = ins[0]
    s = int(node.attrs["scale"])
    return [(n, c, h * s, wd * s)]


def _concat_shapes(node: Node, ins: list[Shape], w: dict[str, tuple[int, ...]]) -> list[Shape]:
    _expect(node.attrs.get("axis", 1) == 1, node, "only channel concatenation is supported")
    rest = {tuple(s[2:]) for s in ins}
    _expect(len(rest) == 1, node, f"spatial sizes differ: {sorted(rest)}")
    return [(ins[0][0], sum(s[1] for s in ins), *ins[0][2:])]


def _split_shapes(node: Node, ins: list[Shape], w: dict[str, tuple[int, ...]]) -> list[Shape]:
    sizes = node.attrs["sizes"]
    _expect(sum(sizes) == ins[0][1], node, f"split sizes {sizes} do not add up to {ins[0][1]} channels")
    return [(ins[0][0], s, *ins[0][2:]) for s in sizes]


def _elementwise_shapes(node: Node, ins: list[Shape], w: dict[str, tuple[int, ...]]) -> list[Shape]:
    _expect(all(tuple(s) == tuple(ins[0]) for s in ins), node, f"operand shapes differ: {ins}")
    return [tuple(ins[0])]


def _attention_shapes(node: Node, ins: list[Shape], w: dict[str, tuple[int, ...]]) -> list[Shape]:
    q, k, v = ins
    heads = node.attrs["num_heads"]
    _expect(q == k, node, f"q {q} and k {k} differ")
    _expect(q[1] % heads == 0 and v[1] % heads == 0, node, f"channels not divisible by {heads} heads")
    _expect(tuple(q[2:]) == tuple(v[2:]), node, "q and v spatial sizes differ")
    return [tuple(v)]


def _global_avg_pool_shapes(node: Node, ins: list[Shape], w: dict[str, tuple[int, ...]]) -> list[Shape]:
    return [(ins[0][0], ins[0][1])]


def _linear_shapes(node: Node, ins: list[Shape], w: dict[str, tuple[int, ...]]) -> list[Shape]:
    out_features, in_features = w["weight"]
    _expect(ins[0][1] == in_features, node, f"input has {ins[0][1]} features, weight expects {in_features}")
    return [(ins[0][0], out_features)]


def _softmax_shapes(node: Node, ins: list[Shape], w: dict[str, tuple[int, ...]]) -> list[Shape]:
    return [tuple(ins[0])]


def decode_extra_channels(attrs: dict[str, Any]) -> int:
    """Channels a decode node appends after the class scores: mask coefficients, angle or keypoints."""
    return int(attrs.get("extra_channels", 0))


def _decode_shapes(node: Node, ins: list[Shape], w: dict[str, tuple[int, ...]]) -> list[Shape]:
    levels, nc, reg_max = node.attrs["levels"], node.attrs["nc"], node.attrs["reg_max"]
    extra = decode_extra_channels(node.attrs)
    groups = len(ins) // levels
    _expect(len(ins) % levels == 0 and groups in (2, 3), node, f"{len(ins)} inputs for {levels} levels")
    _expect(groups == 3 or extra == 0, node, "extra channels declared without extra inputs")
    boxes, scores, extras = ins[:levels], ins[levels : 2 * levels], ins[2 * levels :]
    _expect(all(s[1] == 4 * reg_max for s in boxes), node, f"box maps must have {4 * reg_max} channels")
    _expect(all(s[1] == nc for s in scores), node, f"score maps must have {nc} channels")
    _expect(all(s[1] == extra for s in extras), node, f"extra maps must have {extra} channels")
    anchors = sum(s[2] * s[3] for s in boxes)
    return [(ins[0][0], 4 + nc + extra, anchors)]


def _topk_shapes(node: Node, ins: list[Shape], w: dict[str, tuple[int, ...]]) -> list[Shape]:
    n, channels, anchors = ins[0]
    nc = node.attrs["nc"]
    return [(n, min(node.attrs["max_det"], anchors), channels - nc + 2)]


ShapeRule = Callable[[Node, list[Shape], dict[str, tuple[int, ...]]], list[Shape]]

OPS: dict[str, ShapeRule] = {
    "conv": _conv_shapes,  # act(conv(x) + bias) [+ residual]; attrs stride, padding, dilation, groups, activation
    "conv_transpose": _conv_transpose_shapes,  # weight (Cin, Cout, kh, kw); attrs stride, padding
    "maxpool": _maxpool_shapes,  # attrs kernel, stride, padding (implicit -inf padding)
    "upsample": _upsample_shapes,  # nearest, integer attrs scale
    "concat": _concat_shapes,  # channel axis
    "split": _split_shapes,  # channel axis, attrs sizes; one output per size
    "add": _elementwise_shapes,
    "mul": _elementwise_shapes,
    "attention": _attention_shapes,  # PSA core: inputs q, k, v (heads-major channels); attrs num_heads, scale
    "global_avg_pool": _global_avg_pool_shapes,  # (N, C, H, W) -> (N, C)
    "linear": _linear_shapes,  # weight (out, in), bias (out)
    "softmax": _softmax_shapes,  # over axis 1
    "decode": _decode_shapes,  # anchors + DFL/box decode + sigmoid scores + task extras -> (N, 4+nc+extra, A)
    "topk": _topk_shapes,  # one-to-one (end2end) selection -> (N, min(max_det, A), 6+extra)
}


# ---------------------------------------------------------------------------------------------


def _replaceable(path: Path) -> bool:
    """Whether saving a model directory may replace what is at `path`: an empty directory, or a yolojet model
    directory (its two files and nothing else)."""
    if not path.is_dir():
        return False
    return {p.name for p in path.iterdir()} <= {GRAPH_FILE, WEIGHTS_FILE}


@dataclass
class Graph:
    """A topologically ordered list of nodes over named values, plus weights and metadata."""

    meta: ModelMeta
    inputs: list[str]
    outputs: list[str]
    values: dict[str, Value]
    nodes: list[Node]
    weights: dict[str, np.ndarray]

    def validate(self) -> None:
        """Check definitions precede uses, op kinds are known, weights exist and shapes are consistent."""
        defined = set(self.inputs)
        for name in self.inputs:
            if name not in self.values:
                raise GraphError(f"graph input {name} has no value entry")
        for node in self.nodes:
            if node.op not in OPS:
                raise GraphError(f"node {node.name}: unknown op kind {node.op!r}")
            for name in node.inputs:
                if name not in defined:
                    raise GraphError(f"node {node.name} reads {name} before it is defined")
            for key in node.weights.values():
                if key not in self.weights:
                    raise GraphError(f"node {node.name} refers to missing weight {key}")
            shapes = infer_shapes(node, [self.values[i].shape for i in node.inputs], self.weight_shapes(node))
            for name, shape in zip(node.outputs, shapes, strict=True):
                if name in defined:
                    raise GraphError(f"value {name} is defined twice")
                if tuple(self.values[name].shape) != tuple(shape):
                    raise GraphError(f"value {name}: recorded shape {self.values[name].shape}, inferred {shape}")
                defined.add(name)
        for name in self.outputs:
            if name not in defined:
                raise GraphError(f"graph output {name} is never produced")

    def weight_shapes(self, node: Node) -> dict[str, tuple[int, ...]]:
        return {role: tuple(self.weights[key].shape) for role, key in node.weights.items()}

    def node_weights(self, node: Node) -> dict[str, np.ndarray]:
        return {role: self.weights[key] for role, key in node.weights.items()}

    # -- statistics ---------------------------------------------------------------------------

    def num_params(self) -> int:
        return int(sum(w.size for w in self.weights.values()))

    def node_flops(self, node: Node) -> int:
        """Multiply-adds counted as two FLOPs, per image; the cheap elementwise ops count zero."""
        out = self.values[node.outputs[0]].shape
        w = self.weight_shapes(node)
        if node.op == "conv":
            _, cin_g, kh, kw = w["weight"]
            return 2 * math.prod(out[1:]) * cin_g * kh * kw
        if node.op == "conv_transpose":
            cin, _, kh, kw = w["weight"]
            inp = self.values[node.inputs[0]].shape
            return 2 * math.prod(inp[2:]) * cin * w["weight"][1] * kh * kw
        if node.op == "linear":
            return 2 * w["weight"][0] * w["weight"][1]
        if node.op == "attention":
            q = self.values[node.inputs[0]].shape
            v = self.values[node.inputs[2]].shape
            tokens = q[2] * q[3]
            return 2 * tokens * tokens * (q[1] + v[1])
        return 0

    def flops(self) -> int:
        return sum(self.node_flops(n) for n in self.nodes)

    # -- model directory ----------------------------------------------------------------------

    def resized(self, height: int, width: int) -> Graph:
        """The same network for another input size (every value's shape inferred again; weights shared, not
        copied): what an engine runs for an image letterboxed to a rectangle. Both sides must be multiples of the
        model's largest stride."""
        stride = max(self.meta.strides or [1])
        if height < 1 or width < 1 or height % stride or width % stride:
            raise ImageSizeError(f"input {height}x{width}: each side must be a positive multiple of stride {stride}")
        if (height, width) == tuple(self.meta.imgsz):
            return self
        values = {name: Value(v.name, v.shape, v.dtype) for name, v in self.values.items()}
        for name in self.inputs:
            n, c = values[name].shape[:2]
            values[name] = Value(name, (n, c, height, width), values[name].dtype)
        for node in self.nodes:
            shapes = infer_shapes(node, [values[i].shape for i in node.inputs], self.weight_shapes(node))
            for name, shape in zip(node.outputs, shapes, strict=True):
                values[name] = Value(name, tuple(shape), values[name].dtype)
        meta = replace(self.meta, imgsz=(height, width))
        return Graph(meta, list(self.inputs), list(self.outputs), values, self.nodes, self.weights)

    def version(self) -> str:
        """The first 12 hex digits of a SHA-256 over the metadata and the weights (by name): two graphs with the same
        version compute the same function."""
        import hashlib

        digest = hashlib.sha256(json.dumps(self.meta.to_json(), sort_keys=True).encode())
        for name in sorted(self.weights):
            digest.update(name.encode())
            digest.update(np.ascontiguousarray(self.weights[name]).tobytes())
        return digest.hexdigest()[:12]

    def save(self, directory: str | Path) -> Path:
        """Write the model directory atomically: a half-written directory never appears under `directory`. A link is
        written through to the directory it leads to, as outputs are; nothing but the model directory it replaces is
        removed."""
        directory = Path(os.path.realpath(directory))
        self.validate()
        if directory.exists() and not _replaceable(directory):
            raise ModelDirError(
                f"{directory}: exists and is not a yolojet model directory; not overwriting it (choose another path, "
                "or an empty or absent one)"
            )
        try:
            directory.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
        except OSError as e:
            raise ModelDirError(f"{directory}: cannot write a model directory there ({e.strerror})") from e
        umask = os.umask(0)
        os.umask(umask)
        try:
            staging.chmod(0o777 & ~umask)  # mkdtemp makes it private; a model directory is as shareable as any
            document = {
                "format_version": FORMAT_VERSION,
                "meta": self.meta.to_json(),
                "inputs": self.inputs,
                "outputs": self.outputs,
                "values": [asdict(v) for v in self.values.values()],
                "nodes": [asdict(n) for n in self.nodes],
            }
            (staging / GRAPH_FILE).write_text(json.dumps(document, indent=1))
            save_file({k: np.ascontiguousarray(v) for k, v in self.weights.items()}, str(staging / WEIGHTS_FILE))
            for written in (GRAPH_FILE, WEIGHTS_FILE):
                (staging / written).chmod(0o666 & ~umask)
            if directory.exists():
                # The old directory is moved onto an empty one of a fresh name (a rename may replace an empty
                # directory), so that no file of the user's is in the way or removed.
                backup = Path(tempfile.mkdtemp(prefix=f".{directory.name}.old.", dir=directory.parent))
                os.replace(directory, backup)
                os.replace(staging, directory)
                shutil.rmtree(backup, ignore_errors=True)
            else:
                os.replace(staging, directory)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> Graph:
        directory = Path(directory)
        graph_file, weights_file = directory / GRAPH_FILE, directory / WEIGHTS_FILE
        if not directory.is_dir():
            raise ModelDirError(f"{directory}: not a model directory (expected {GRAPH_FILE} and {WEIGHTS_FILE})")
        for f in (graph_file, weights_file):
            if not f.is_file():
                raise ModelDirError(f"{directory}: missing {f.name}")
        try:
            document = json.loads(graph_file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ModelDirError(f"{graph_file}: not valid JSON ({e})") from e
        version = document.get("format_version")
        if version != FORMAT_VERSION:
            raise ModelDirError(f"{graph_file}: format version {version}, this yolojet reads {FORMAT_VERSION}")
        try:
            weights = load_file(str(weights_file))
        except Exception as e:  # safetensors raises its own error types for truncated or foreign files
            raise ModelDirError(f"{weights_file}: cannot read weights ({e})") from e
        values = {}
        for v in document["values"]:
            values[v["name"]] = Value(v["name"], tuple(v["shape"]), v["dtype"])
        graph = cls(
            meta=ModelMeta.from_json(document["meta"]),
            inputs=document["inputs"],
            outputs=document["outputs"],
            values=values,
            nodes=[Node(**n) for n in document["nodes"]],
            weights=weights,
        )
        graph.validate()
        return graph


def infer_shapes(node: Node, input_shapes: list[Shape], weight_shapes: dict[str, tuple[int, ...]]) -> list[Shape]:
    """Output shapes of `node` given its input and weight shapes; raises GraphError on a mismatch."""
    if node.op not in OPS:
        raise GraphError(f"node {node.name}: unknown op kind {node.op!r}")
    shapes = OPS[node.op](node, [tuple(s) for s in input_shapes], weight_shapes)
    if len(shapes) != len(node.outputs):
        raise GraphError(f"node {node.name} ({node.op}) names {len(node.outputs)} outputs, produces {len(shapes)}")
    return shapes
