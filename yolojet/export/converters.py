"""One converter per ultralytics module class, kept in a registry keyed by the exact class.

A converter receives the context, the module, the names of its input values and its scope (the
module path, for node names and error messages) and returns the names of its outputs. Composite
blocks call `ctx.convert` on their children, so a new block only needs its own wiring here.
Exact-class dispatch is deliberate: a subclass with a different forward (Segment26, OBB26, Pose26)
must not silently reuse its parent's converter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np
from torch import nn
from ultralytics.nn.modules import block, conv, head

from yolojet.errors import UnsupportedModuleError
from yolojet.export.builder import GraphBuilder
from yolojet.export.folding import fold_batchnorm

ModuleT = TypeVar("ModuleT", bound=nn.Module)
ConverterOf = Callable[["ConvertContext", ModuleT, list[str], str], list[str]]
Converter = ConverterOf[nn.Module]
CONVERTERS: dict[type, Converter] = {}


def converter(*classes: type[ModuleT]) -> Callable[[ConverterOf[ModuleT]], ConverterOf[ModuleT]]:
    def register(fn: ConverterOf[ModuleT]) -> ConverterOf[ModuleT]:
        for cls in classes:
            # dispatch is by exact class (ConvertContext.convert), so fn only ever receives a `cls`, a ModuleT
            CONVERTERS[cls] = cast(Converter, fn)
        return fn

    return register


@dataclass
class ConvertContext:
    builder: GraphBuilder
    end2end: bool
    layer: int = -1

    def convert(self, module: nn.Module, inputs: list[str], scope: str) -> list[str]:
        fn = CONVERTERS.get(type(module))
        if fn is None:
            raise UnsupportedModuleError(type(module).__name__, self.layer, f"at {scope}")
        return fn(self, module, inputs, scope)

    def convert1(self, module: nn.Module, x: str, scope: str) -> str:
        (out,) = self.convert(module, [x], scope)
        return out

    def unsupported(self, module: nn.Module, scope: str, detail: str) -> UnsupportedModuleError:
        return UnsupportedModuleError(type(module).__name__, self.layer, f"at {scope}: {detail}")


# ---------------------------------------------------------------------------------------------
# Convolutions


def _activation_name(ctx: ConvertContext, act: nn.Module, scope: str) -> str:
    names = {nn.Identity: "identity", nn.SiLU: "silu", nn.ReLU: "relu", nn.Sigmoid: "sigmoid"}
    name = names.get(type(act))
    if name is None:
        raise ctx.unsupported(act, scope, "activation without a yolojet kernel")
    return name


def emit_conv(
    ctx: ConvertContext,
    conv2d: nn.Conv2d,
    bn: nn.BatchNorm2d | None,
    act: str,
    x: str,
    scope: str,
    residual: str | None = None,
) -> str:
    """act(conv(x) + bias) [+ residual], with BatchNorm folded into weight and bias."""
    if conv2d.padding_mode != "zeros" or isinstance(conv2d.padding, str):
        raise ctx.unsupported(conv2d, scope, f"padding {conv2d.padding!r} mode {conv2d.padding_mode}")
    weight, bias = fold_batchnorm(conv2d, bn)
    attrs = {
        "stride": list(conv2d.stride),
        "padding": list(conv2d.padding),
        "dilation": list(conv2d.dilation),
        "groups": conv2d.groups,
        "activation": act,
    }
    inputs = [x] if residual is None else [x, residual]
    return ctx.builder.add1("conv", inputs, source=scope, attrs=attrs, weights={"weight": weight, "bias": bias})


def convert_conv_block(ctx: ConvertContext, m: nn.Module, x: str, scope: str, residual: str | None = None) -> str:
    """ultralytics Conv/DWConv (conv + BN + act), fused or not."""
    # nn.Module's __getattr__ is typed Tensor | Module: on a Conv these are its nn.Conv2d and its activation module
    conv2d, act = cast(nn.Conv2d, m.conv), cast(nn.Module, m.act)
    return emit_conv(ctx, conv2d, getattr(m, "bn", None), _activation_name(ctx, act, scope), x, scope, residual)


@converter(conv.Conv, conv.DWConv)
def _conv(ctx: ConvertContext, m: nn.Module, xs: list[str], scope: str) -> list[str]:
    return [convert_conv_block(ctx, m, xs[0], scope)]


@converter(nn.Conv2d)
def _conv2d(ctx: ConvertContext, m: nn.Conv2d, xs: list[str], scope: str) -> list[str]:
    return [emit_conv(ctx, m, None, "identity", xs[0], scope)]


@converter(nn.ConvTranspose2d)
def _conv_transpose(ctx: ConvertContext, m: nn.ConvTranspose2d, xs: list[str], scope: str) -> list[str]:
    if m.groups != 1 or tuple(m.dilation) != (1, 1) or tuple(m.output_padding) != (0, 0):
        raise ctx.unsupported(m, scope, "only groups=1, dilation=1, output_padding=0")
    weight = m.weight.detach().double().numpy()
    bias = m.bias.detach().double().numpy() if m.bias is not None else np.zeros(m.out_channels)
    attrs = {"stride": list(m.stride), "padding": list(m.padding)}
    return ctx.builder.add("conv_transpose", xs, source=scope, attrs=attrs, weights={"weight": weight, "bias": bias})


# ---------------------------------------------------------------------------------------------
# Plumbing


@converter(nn.Sequential)
def _sequential(ctx: ConvertContext, m: nn.Sequential, xs: list[str], scope: str) -> list[str]:
    for name, child in m.named_children():
        xs = ctx.convert(child, xs, f"{scope}.{name}")
    return xs


@converter(nn.Identity)
def _identity(ctx: ConvertContext, m: nn.Module, xs: list[str], scope: str) -> list[str]:
    return xs


@converter(conv.Concat)
def _concat(ctx: ConvertContext, m: conv.Concat, xs: list[str], scope: str) -> list[str]:
    if m.d != 1:
        raise ctx.unsupported(m, scope, f"concatenation along dimension {m.d}")
    return ctx.builder.add("concat", xs, source=scope, attrs={"axis": 1})


@converter(nn.Upsample)
def _upsample(ctx: ConvertContext, m: nn.Upsample, xs: list[str], scope: str) -> list[str]:
    # ultralytics builds nn.Upsample(None, 2, "nearest"); one factor for both axes (a tuple of equal ones)
    scale = m.scale_factor
    if isinstance(scale, tuple):
        scale = scale[0] if len(set(scale)) == 1 else None
    if m.mode != "nearest" or m.size is not None or scale is None or float(scale) != int(scale):
        raise ctx.unsupported(m, scope, f"mode={m.mode} size={m.size} scale_factor={scale}")
    return ctx.builder.add("upsample", xs, source=scope, attrs={"scale": int(scale)})


@converter(nn.MaxPool2d)
def _maxpool(ctx: ConvertContext, m: nn.MaxPool2d, xs: list[str], scope: str) -> list[str]:
    if m.dilation not in (1, (1, 1)) or m.ceil_mode:
        raise ctx.unsupported(m, scope, "dilation or ceil_mode")
    attrs = {"kernel": m.kernel_size, "stride": m.stride, "padding": m.padding}
    return ctx.builder.add("maxpool", xs, source=scope, attrs=attrs)


def split_channels(ctx: ConvertContext, x: str, sizes: list[int], scope: str) -> list[str]:
    return ctx.builder.add("split", [x], source=scope, attrs={"sizes": sizes}, num_outputs=len(sizes))


# ---------------------------------------------------------------------------------------------
# Backbone and neck blocks


@converter(block.Bottleneck)
def _bottleneck(ctx: ConvertContext, m: block.Bottleneck, xs: list[str], scope: str) -> list[str]:
    hidden = convert_conv_block(ctx, m.cv1, xs[0], f"{scope}.cv1")
    return [convert_conv_block(ctx, m.cv2, hidden, f"{scope}.cv2", residual=xs[0] if m.add else None)]


@converter(block.C2f, block.C3k2)
def _c2f(ctx: ConvertContext, m: block.C2f, xs: list[str], scope: str) -> list[str]:
    y = split_channels(ctx, convert_conv_block(ctx, m.cv1, xs[0], f"{scope}.cv1"), [m.c, m.c], f"{scope}.split")
    for i, child in enumerate(m.m):
        y.append(ctx.convert1(child, y[-1], f"{scope}.m.{i}"))
    cat = ctx.builder.add1("concat", y, source=f"{scope}.cat", attrs={"axis": 1})
    return [convert_conv_block(ctx, m.cv2, cat, f"{scope}.cv2")]


@converter(block.C3, block.C3k)
def _c3(ctx: ConvertContext, m: block.C3, xs: list[str], scope: str) -> list[str]:
    a = ctx.convert1(m.m, convert_conv_block(ctx, m.cv1, xs[0], f"{scope}.cv1"), f"{scope}.m")
    b = convert_conv_block(ctx, m.cv2, xs[0], f"{scope}.cv2")
    cat = ctx.builder.add1("concat", [a, b], source=f"{scope}.cat", attrs={"axis": 1})
    return [convert_conv_block(ctx, m.cv3, cat, f"{scope}.cv3")]


@converter(block.C2)
def _c2(ctx: ConvertContext, m: block.C2, xs: list[str], scope: str) -> list[str]:
    a, b = split_channels(ctx, convert_conv_block(ctx, m.cv1, xs[0], f"{scope}.cv1"), [m.c, m.c], f"{scope}.split")
    a = ctx.convert1(m.m, a, f"{scope}.m")
    cat = ctx.builder.add1("concat", [a, b], source=f"{scope}.cat", attrs={"axis": 1})
    return [convert_conv_block(ctx, m.cv2, cat, f"{scope}.cv2")]


@converter(block.SPPF)
def _sppf(ctx: ConvertContext, m: block.SPPF, xs: list[str], scope: str) -> list[str]:
    pool = m.m
    y = [convert_conv_block(ctx, m.cv1, xs[0], f"{scope}.cv1")]
    for i in range(getattr(m, "n", 3)):
        y.append(_maxpool(ctx, pool, [y[-1]], f"{scope}.m.{i}")[0])
    cat = ctx.builder.add1("concat", y, source=f"{scope}.cat", attrs={"axis": 1})
    residual = xs[0] if getattr(m, "add", False) else None
    return [convert_conv_block(ctx, m.cv2, cat, f"{scope}.cv2", residual=residual)]


def _attention_qkv_permutation(heads: int, key_dim: int, head_dim: int) -> list[int]:
    """Reorder ultralytics' per-head [q k v] channel groups into [all q | all k | all v].

    Each of q, k, v then is a plain channel slice of the qkv conv's output (a free split), and v
    in heads-major order is exactly the `v.reshape(B, C, H, W)` that feeds the positional conv.
    """
    group = 2 * key_dim + head_dim
    q = [h * group + c for h in range(heads) for c in range(key_dim)]
    k = [h * group + key_dim + c for h in range(heads) for c in range(key_dim)]
    v = [h * group + 2 * key_dim + c for h in range(heads) for c in range(head_dim)]
    return q + k + v


def convert_attention(ctx: ConvertContext, m: block.Attention, x: str, scope: str, residual: str | None = None) -> str:
    heads, key_dim, head_dim = m.num_heads, m.key_dim, m.head_dim
    qkv_conv = m.qkv
    weight, bias = fold_batchnorm(qkv_conv.conv, getattr(qkv_conv, "bn", None))
    order = _attention_qkv_permutation(heads, key_dim, head_dim)
    attrs = {"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "groups": 1}
    attrs["activation"] = _activation_name(ctx, qkv_conv.act, f"{scope}.qkv")
    qkv = ctx.builder.add1(
        "conv", [x], source=f"{scope}.qkv", attrs=attrs, weights={"weight": weight[order], "bias": bias[order]}
    )
    q, k, v = split_channels(ctx, qkv, [heads * key_dim, heads * key_dim, heads * head_dim], f"{scope}.split")
    attended = ctx.builder.add1(
        "attention", [q, k, v], source=f"{scope}.attn", attrs={"num_heads": heads, "scale": float(m.scale)}
    )
    mixed = convert_conv_block(ctx, m.pe, v, f"{scope}.pe", residual=attended)
    return convert_conv_block(ctx, m.proj, mixed, f"{scope}.proj", residual=residual)


@converter(block.Attention)
def _attention(ctx: ConvertContext, m: block.Attention, xs: list[str], scope: str) -> list[str]:
    return [convert_attention(ctx, m, xs[0], scope)]


@converter(block.PSABlock)
def _psa_block(ctx: ConvertContext, m: block.PSABlock, xs: list[str], scope: str) -> list[str]:
    x = xs[0]
    x = convert_attention(ctx, m.attn, x, f"{scope}.attn", residual=x if m.add else None)
    expand, project = m.ffn
    hidden = convert_conv_block(ctx, expand, x, f"{scope}.ffn.0")
    return [convert_conv_block(ctx, project, hidden, f"{scope}.ffn.1", residual=x if m.add else None)]


@converter(block.C2PSA)
def _c2psa(ctx: ConvertContext, m: block.C2PSA, xs: list[str], scope: str) -> list[str]:
    a, b = split_channels(ctx, convert_conv_block(ctx, m.cv1, xs[0], f"{scope}.cv1"), [m.c, m.c], f"{scope}.split")
    b = ctx.convert1(m.m, b, f"{scope}.m")
    cat = ctx.builder.add1("concat", [a, b], source=f"{scope}.cat", attrs={"axis": 1})
    return [convert_conv_block(ctx, m.cv2, cat, f"{scope}.cv2")]


# ---------------------------------------------------------------------------------------------
# Heads


@converter(head.Classify)
def _classify(ctx: ConvertContext, m: head.Classify, xs: list[str], scope: str) -> list[str]:
    x = xs[0] if len(xs) == 1 else ctx.builder.add1("concat", xs, source=f"{scope}.cat", attrs={"axis": 1})
    features = convert_conv_block(ctx, m.conv, x, f"{scope}.conv")
    pooled = ctx.builder.add1("global_avg_pool", [features], source=f"{scope}.pool")
    weights = {"weight": m.linear.weight.detach().double().numpy(), "bias": m.linear.bias.detach().double().numpy()}
    logits = ctx.builder.add1("linear", [pooled], source=f"{scope}.linear", weights=weights)
    return ctx.builder.add("softmax", [logits], source=f"{scope}.softmax")


def _proto(ctx: ConvertContext, m: block.Proto, x: str, scope: str) -> str:
    x = convert_conv_block(ctx, m.cv1, x, f"{scope}.cv1")
    x = ctx.convert1(m.upsample, x, f"{scope}.upsample")
    x = convert_conv_block(ctx, m.cv2, x, f"{scope}.cv2")
    return convert_conv_block(ctx, m.cv3, x, f"{scope}.cv3")


def _proto26(ctx: ConvertContext, m: block.Proto26, xs: list[str], scope: str) -> str:
    feat = xs[0]
    for i, refine in enumerate(m.feat_refine):
        up = convert_conv_block(ctx, refine, xs[i + 1], f"{scope}.feat_refine.{i}")
        up = ctx.builder.add1("upsample", [up], source=f"{scope}.up.{i}", attrs={"scale": 2 ** (i + 1)})
        feat = ctx.builder.add1("add", [feat, up], source=f"{scope}.fuse.{i}")
    return _proto(ctx, m, convert_conv_block(ctx, m.feat_fuse, feat, f"{scope}.feat_fuse"), scope)


def _branch(ctx: ConvertContext, modules: nn.ModuleList, xs: list[str], scope: str) -> list[str]:
    return [ctx.convert1(mod, x, f"{scope}.{i}") for i, (mod, x) in enumerate(zip(modules, xs, strict=True))]


def head_task(m: nn.Module) -> str:
    if isinstance(m, head.Segment):
        return "segment"
    if isinstance(m, head.OBB):
        return "obb"
    if isinstance(m, head.Pose):
        return "pose"
    if isinstance(m, head.Classify):
        return "classify"
    return "detect"


@converter(head.Detect, head.Segment, head.Segment26, head.OBB, head.OBB26, head.Pose, head.Pose26)
def _detect(ctx: ConvertContext, m: head.Detect, xs: list[str], scope: str) -> list[str]:
    if m.nl != len(xs):
        raise ctx.unsupported(m, scope, f"{m.nl} detection levels but {len(xs)} inputs")
    prefix = "one2one_" if ctx.end2end else ""
    task = head_task(m)

    def part(name: str) -> Any:
        modules = getattr(m, prefix + name, None)
        if modules is None:
            raise ctx.unsupported(m, scope, f"branch {prefix + name} is missing (fused for the other head mode?)")
        return modules

    boxes = _branch(ctx, part("cv2"), xs, f"{scope}.{prefix}cv2")
    scores = _branch(ctx, part("cv3"), xs, f"{scope}.{prefix}cv3")
    extras: list[str] = []
    attrs: dict[str, Any] = {
        "task": task,
        "levels": m.nl,
        "nc": m.nc,
        "reg_max": m.reg_max,
        "strides": [int(s) for s in m.stride.tolist()],
        "box_format": "xyxy" if ctx.end2end or m.xyxy else "xywh",
        "extra_channels": 0,
    }
    if task != "detect":
        extras = _branch(ctx, part("cv4"), xs, f"{scope}.{prefix}cv4")
        if isinstance(m, head.Pose26):
            extras = _branch(ctx, part("cv4_kpts"), extras, f"{scope}.{prefix}cv4_kpts")
        attrs["extra_channels"] = ctx.builder.channels(extras[0])
    if task == "obb":
        # OBB squashes the angle logit into [-pi/4, 3pi/4]; OBB26 predicts the angle directly.
        attrs["angle"] = "raw" if isinstance(m, head.OBB26) else "sigmoid"
    if task == "pose":
        assert isinstance(m, head.Pose)  # head_task says "pose" only for a Pose head
        attrs["kpt_shape"] = list(m.kpt_shape)
        # Pose offsets keypoints by 2*k + (anchor - 0.5); Pose26 by k + anchor.
        attrs["kpt_offset"] = "v26" if isinstance(m, head.Pose26) else "v8"
    out = ctx.builder.add1("decode", boxes + scores + extras, source=f"{scope}.decode", attrs=attrs)
    if ctx.end2end:
        out = ctx.builder.add1("topk", [out], source=f"{scope}.topk", attrs={"max_det": int(m.max_det), "nc": m.nc})
    if task != "segment":
        return [out]
    assert isinstance(m, head.Segment)  # head_task says "segment" only for a Segment head
    if isinstance(m, head.Segment26):
        # Segment26 builds a Proto26, but its `proto` attribute is typed as Segment's Proto
        proto = _proto26(ctx, cast(block.Proto26, m.proto), xs, f"{scope}.proto")
    else:
        proto = _proto(ctx, m.proto, xs[0], f"{scope}.proto")
    return [out, proto]


def is_end2end_capable(m: nn.Module) -> bool:
    return isinstance(m, head.Detect) and getattr(m, "one2one_cv2", None) is not None
