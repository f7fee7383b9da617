"""The reference executor: runs the IR with plain torch ops in float32, NCHW, on CPU or GPU.

It is the truth every GPU kernel is checked against, and the CPU fallback. Each op is a small
function `(node, inputs, weights) -> outputs` in the `OPS` table, written to follow ultralytics'
own arithmetic so that the exported graph reproduces the checkpoint's forward pass.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from yolojet.errors import GraphError
from yolojet.ir import Graph, ModelMeta, Node

Tensors = list[torch.Tensor]
Weights = dict[str, torch.Tensor]


def _activation(x: torch.Tensor, name: str) -> torch.Tensor:
    if name == "silu":
        return F.silu(x)
    if name == "relu":
        return F.relu(x)
    if name == "sigmoid":
        return torch.sigmoid(x)
    return x


def _conv(node: Node, xs: Tensors, w: Weights) -> Tensors:
    a = node.attrs
    y = F.conv2d(xs[0], w["weight"], w["bias"], a["stride"], a["padding"], a["dilation"], a["groups"])
    y = _activation(y, a["activation"])
    return [y + xs[1] if len(xs) > 1 else y]


def _conv_transpose(node: Node, xs: Tensors, w: Weights) -> Tensors:
    return [F.conv_transpose2d(xs[0], w["weight"], w["bias"], node.attrs["stride"], node.attrs["padding"])]


def _maxpool(node: Node, xs: Tensors, w: Weights) -> Tensors:
    a = node.attrs
    return [F.max_pool2d(xs[0], a["kernel"], a["stride"], a["padding"])]


def _upsample(node: Node, xs: Tensors, w: Weights) -> Tensors:
    return [F.interpolate(xs[0], scale_factor=node.attrs["scale"], mode="nearest")]


def _concat(node: Node, xs: Tensors, w: Weights) -> Tensors:
    return [torch.cat(xs, 1)]


def _split(node: Node, xs: Tensors, w: Weights) -> Tensors:
    return list(xs[0].split(node.attrs["sizes"], 1))


def _add(node: Node, xs: Tensors, w: Weights) -> Tensors:
    return [xs[0] + xs[1]]


def _mul(node: Node, xs: Tensors, w: Weights) -> Tensors:
    return [xs[0] * xs[1]]


def _attention(node: Node, xs: Tensors, w: Weights) -> Tensors:
    """softmax(scale·qᵀk)·v per head, as ultralytics' Attention computes it."""
    q, k, v = xs
    b, _, h, wd = v.shape
    heads = node.attrs["num_heads"]
    q, k, v = (t.reshape(b, heads, t.shape[1] // heads, h * wd) for t in (q, k, v))
    attn = ((q * node.attrs["scale"]).transpose(-2, -1) @ k).softmax(dim=-1)
    return [(v @ attn.transpose(-2, -1)).reshape(b, -1, h, wd)]


def _global_avg_pool(node: Node, xs: Tensors, w: Weights) -> Tensors:
    return [xs[0].mean((2, 3))]


def _linear(node: Node, xs: Tensors, w: Weights) -> Tensors:
    return [F.linear(xs[0], w["weight"], w["bias"])]


def _softmax(node: Node, xs: Tensors, w: Weights) -> Tensors:
    return [xs[0].softmax(1)]


def make_anchors(sizes: Sequence[tuple[int, ...]], strides: list[int], like: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Anchor centres (2, A) in grid units and per-anchor stride (1, A), level by level, row-major."""
    points, stride_rows = [], []
    for (h, w), s in zip(sizes, strides, strict=True):
        sy, sx = torch.meshgrid(
            torch.arange(h, dtype=like.dtype, device=like.device) + 0.5,
            torch.arange(w, dtype=like.dtype, device=like.device) + 0.5,
            indexing="ij",
        )
        points.append(torch.stack((sx, sy), -1).view(-1, 2))
        stride_rows.append(torch.full((h * w, 1), float(s), dtype=like.dtype, device=like.device))
    return torch.cat(points).T, torch.cat(stride_rows).T


def _flatten_levels(maps: Tensors) -> torch.Tensor:
    return torch.cat([m.reshape(m.shape[0], m.shape[1], -1) for m in maps], -1)


def _distribution_to_distance(boxes: torch.Tensor, reg_max: int) -> torch.Tensor:
    """DFL: the expected bin under a softmax over `reg_max` bins, per box side. Identity when reg_max == 1."""
    if reg_max == 1:
        return boxes
    b, _, a = boxes.shape
    probs = boxes.view(b, 4, reg_max, a).softmax(2)
    bins = torch.arange(reg_max, dtype=boxes.dtype, device=boxes.device).view(1, 1, reg_max, 1)
    return (probs * bins).sum(2)


def _decode(node: Node, xs: Tensors, w: Weights) -> Tensors:
    """Raw head maps → (N, 4 + nc + extra, A): boxes in input pixels, sigmoid scores, task extras."""
    a = node.attrs
    levels, task = a["levels"], a["task"]
    box_maps, score_maps, extra_maps = xs[:levels], xs[levels : 2 * levels], xs[2 * levels :]
    anchors, strides = make_anchors([tuple(m.shape[2:]) for m in box_maps], a["strides"], box_maps[0])
    distance = _distribution_to_distance(_flatten_levels(box_maps), a["reg_max"])
    scores = _flatten_levels(score_maps).sigmoid()
    extra = _flatten_levels(extra_maps) if extra_maps else None
    lt, rb = distance.chunk(2, 1)
    if task == "obb":
        assert extra is not None  # OBB heads always have their angle maps (cv4, as every non-detect head)
        if a["angle"] == "sigmoid":
            extra = (extra.sigmoid() - 0.25) * math.pi
        cos, sin = torch.cos(extra), torch.sin(extra)
        xf, yf = ((rb - lt) / 2).split(1, 1)
        centre = torch.cat([xf * cos - yf * sin, xf * sin + yf * cos], 1) + anchors
        boxes = torch.cat([centre, lt + rb], 1) * strides
    else:
        x1y1, x2y2 = anchors - lt, anchors + rb
        if a["box_format"] == "xywh":
            boxes = torch.cat([(x1y1 + x2y2) / 2, x2y2 - x1y1], 1) * strides
        else:
            boxes = torch.cat([x1y1, x2y2], 1) * strides
    if task == "pose":
        assert extra is not None  # pose heads always have their keypoint maps
        extra = _decode_keypoints(extra, anchors, strides, a["kpt_shape"], a["kpt_offset"])
    parts = [boxes, scores] + ([extra] if extra is not None else [])
    return [torch.cat(parts, 1)]


def _decode_keypoints(
    kpts: torch.Tensor, anchors: torch.Tensor, strides: torch.Tensor, kpt_shape: list[int], offset: str
) -> torch.Tensor:
    """Keypoints to input pixels: v8 heads predict 2k + (anchor − 0.5), v26 heads k + anchor; visibility sigmoid."""
    ndim = kpt_shape[1]
    y = kpts.clone()
    if ndim == 3:
        y[:, 2::ndim] = y[:, 2::ndim].sigmoid()
    for axis in (0, 1):
        raw = y[:, axis::ndim]
        grid = raw * 2.0 + (anchors[axis] - 0.5) if offset == "v8" else raw + anchors[axis]
        y[:, axis::ndim] = grid * strides
    return y


def _topk(node: Node, xs: Tensors, w: Weights) -> Tensors:
    """One-to-one selection: the top `max_det` (anchor, class) pairs by score, as ultralytics' postprocess."""
    nc, max_det = node.attrs["nc"], node.attrs["max_det"]
    preds = xs[0].permute(0, 2, 1)
    boxes, scores, extra = preds.split([4, nc, preds.shape[-1] - 4 - nc], dim=-1)
    k = min(max_det, preds.shape[1])
    anchor_index = scores.max(dim=-1)[0].topk(k, dim=1)[1]
    scores = scores.gather(1, anchor_index[..., None].expand(-1, -1, nc))
    scores, flat_index = scores.flatten(1).topk(k, dim=1)
    index = anchor_index.gather(1, flat_index // nc)

    def pick(t: torch.Tensor) -> torch.Tensor:
        return t.gather(1, index[..., None].expand(-1, -1, t.shape[-1]))

    labels = (flat_index % nc)[..., None].to(preds.dtype)
    return [torch.cat([pick(boxes), scores[..., None], labels, pick(extra)], dim=-1)]


OpFn = Callable[[Node, Tensors, Weights], Tensors]

OPS: dict[str, OpFn] = {
    "conv": _conv,
    "conv_transpose": _conv_transpose,
    "maxpool": _maxpool,
    "upsample": _upsample,
    "concat": _concat,
    "split": _split,
    "add": _add,
    "mul": _mul,
    "attention": _attention,
    "global_avg_pool": _global_avg_pool,
    "linear": _linear,
    "softmax": _softmax,
    "decode": _decode,
    "topk": _topk,
}


@contextlib.contextmanager
def full_float32() -> Iterator[None]:
    """TF32 off for cuDNN convolutions and matmuls while inside: torch enables it for cuDNN by default, which on a
    GPU would round the reference's inputs to 10-bit mantissas and make it no truth for an fp32 engine."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


class ReferenceExecutor:
    """Callable on a float32 NCHW batch in [0, 1]; returns the raw head outputs in ultralytics' form."""

    def __init__(self, graph: Graph, device: str | torch.device = "cpu") -> None:
        missing = {n.op for n in graph.nodes} - OPS.keys()
        if missing:
            raise GraphError(f"the reference executor has no implementation of {sorted(missing)}")
        self.graph = graph
        self.device = torch.device(device)
        self.weights = {k: torch.from_numpy(v).to(self.device) for k, v in graph.weights.items()}
        self._last_use = self._last_uses()

    @property
    def meta(self) -> ModelMeta:
        return self.graph.meta

    def _last_uses(self) -> dict[str, int]:
        last = {}
        for i, node in enumerate(self.graph.nodes):
            for name in node.inputs:
                last[name] = i
        return last

    def _check_input(self, x: torch.Tensor) -> torch.Tensor:
        channels = self.graph.meta.channels
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor, got {type(x).__name__}")
        if x.ndim != 4 or x.shape[1] != channels:
            raise ValueError(f"expected a float NCHW batch with {channels} channels, got shape {tuple(x.shape)}")
        if not x.is_floating_point():
            raise TypeError(f"expected a floating-point tensor in [0, 1], got {x.dtype}")
        return x.to(self.device, torch.float32)

    @torch.inference_mode()
    def run(self, x: torch.Tensor, keep_all: bool = False) -> dict[str, torch.Tensor]:
        """Execute the graph; with `keep_all` every intermediate value is kept, else only the outputs."""
        with full_float32():
            return self._run(x, keep_all)

    def _run(self, x: torch.Tensor, keep_all: bool) -> dict[str, torch.Tensor]:
        env = {self.graph.inputs[0]: self._check_input(x)}
        keep = set(self.graph.outputs)
        for i, node in enumerate(self.graph.nodes):
            inputs = [env[name] for name in node.inputs]
            weights = {role: self.weights[key] for role, key in node.weights.items()}
            for name, value in zip(node.outputs, OPS[node.op](node, inputs, weights), strict=True):
                env[name] = value
            if not keep_all:
                for name in set(node.inputs):
                    if self._last_use.get(name) == i and name not in keep:
                        del env[name]
        return env

    def __call__(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        env = self.run(x)
        outputs = tuple(env[name] for name in self.graph.outputs)
        return outputs[0] if len(outputs) == 1 else outputs

    def dump(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every value of the graph (input, intermediates, outputs) by name."""
        return self.run(x, keep_all=True)


def load_reference(model_dir: str | Path, device: str | torch.device = "cpu") -> ReferenceExecutor:
    """Load a model directory for the reference executor."""
    return ReferenceExecutor(Graph.load(model_dir), device)
