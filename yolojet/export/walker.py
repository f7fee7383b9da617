"""Walk an ultralytics model layer by layer into the graph IR, and write the model directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from yolojet.errors import EngineConfigError, ImageSizeError
from yolojet.export.builder import GraphBuilder, batch_shape
from yolojet.export.converters import ConvertContext, head_task, is_end2end_capable
from yolojet.export.loader import load_model
from yolojet.ir import Graph, ModelMeta

CLASSIFY_STRIDE = 32  # the classification backbones downsample 5 times


def normalize_imgsz(imgsz: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    """`640` or `(h, w)` → `(h, w)`, positive integers."""
    if isinstance(imgsz, int):
        size = (imgsz, imgsz)
    elif isinstance(imgsz, (tuple, list)) and len(imgsz) in (1, 2):
        size = (int(imgsz[0]), int(imgsz[-1]))
    else:
        raise ImageSizeError(f"imgsz {imgsz!r}: expected an int or (height, width)")
    if min(size) <= 0:
        raise ImageSizeError(f"imgsz {imgsz!r}: sizes must be positive")
    return size


def max_stride(model: nn.Module) -> int:
    # nn.Module's __getattr__ is typed Tensor | Module: a YOLO model's `model` is its nn.Sequential of layers
    last = cast(nn.Sequential, model.model)[-1]
    if head_task(last) == "classify":
        return CLASSIFY_STRIDE
    return int(max(int(cast(torch.Tensor, model.stride).max()), 32))


def _wire_inputs(m: nn.Module, previous: list[str], outputs: list[list[str]]) -> list[str]:
    """Follow ultralytics' `f` wiring: -1 is the previous layer, other ints index earlier layers."""
    f = cast("int | list[int]", m.f)  # set on every layer by ultralytics' model parser
    if f == -1:
        return previous
    if isinstance(f, int):
        return outputs[f]
    return [previous[0] if j == -1 else outputs[j][0] for j in f]


def export_graph(model: nn.Module, imgsz: int | tuple[int, int] = 640, end2end: bool | None = None) -> Graph:
    """Walk `model.model` layer by layer and build the IR for input size `imgsz`."""
    height, width = normalize_imgsz(imgsz)
    stride = max_stride(model)
    if height % stride or width % stride:
        raise ImageSizeError(f"imgsz {height}x{width}: both sides must be multiples of the model's stride {stride}")
    layers = cast(nn.Sequential, model.model)  # as in max_stride
    head: Any = layers[-1]  # an ultralytics head: its attributes (nc, stride, kpt_shape...) depend on its class
    if end2end is None:
        end2end = bool(getattr(model, "end2end", False)) and is_end2end_capable(head)
    if end2end and not is_end2end_capable(head):
        raise EngineConfigError(
            f"--head one2one (end2end=True): this model's {type(head).__name__} head has no one-to-one branch "
            "(YOLO26's heads have one); leave --head out or give --head one2many"
        )

    channels = int(getattr(model, "yaml", {}).get("channels", 3))
    builder = GraphBuilder("images", batch_shape(channels, height, width))
    ctx = ConvertContext(builder, end2end=end2end)
    previous = [builder.input]
    outputs: list[list[str]] = []
    for i, m in enumerate(layers):
        ctx.layer = i
        previous = ctx.convert(m, _wire_inputs(m, previous, outputs), f"model.{i}")
        outputs.append(previous)

    task = head_task(head)
    names = getattr(model, "names", None) or {}
    nc = int(head.nc) if hasattr(head, "nc") else int(head.linear.out_features)
    names = (
        {int(k): str(v) for k, v in dict(names).items()} if len(names) == nc else {i: f"class{i}" for i in range(nc)}
    )
    meta = ModelMeta(
        task=task,
        names=names,
        imgsz=(height, width),
        strides=[int(s) for s in head.stride.tolist()] if task != "classify" else [],
        reg_max=int(getattr(head, "reg_max", 0)),
        end2end=end2end,
        max_det=int(getattr(head, "max_det", 300)),
        kpt_shape=tuple(head.kpt_shape) if task == "pose" else None,
        channels=channels,
    )
    return builder.build(previous, meta)


def default_output_dir(source: str, imgsz: tuple[int, int]) -> Path:
    path = Path(source)
    suffix = "" if imgsz == (640, 640) else f"_{imgsz[0]}x{imgsz[1]}"
    name = f"{path.stem}{suffix}_yolojet"
    return path.with_name(name) if path.is_file() else Path(name)


def trained_imgsz(model: nn.Module) -> int | tuple[int, int]:
    """The image size ultralytics' predict uses for this model by default: the one it was trained at (a
    checkpoint's `train_args`, e.g. 224 for classifiers, 1024 for DOTA OBB models), else 640."""
    args = getattr(model, "args", None)
    size = args.get("imgsz") if isinstance(args, dict) else getattr(args, "imgsz", None)
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    if isinstance(size, (list, tuple)) and len(size) in (1, 2) and all(isinstance(v, int) and v > 0 for v in size):
        return (size[0], size[-1])
    return 640


def export_model(
    source: str | Path | nn.Module,
    out: str | Path | None = None,
    imgsz: int | tuple[int, int] | None = None,
    end2end: bool | None = None,
) -> Path:
    import ultralytics

    loaded = load_model(source)
    graph = export_graph(loaded.model, trained_imgsz(loaded.model) if imgsz is None else imgsz, end2end)
    graph.meta.source = loaded.source
    graph.meta.random_weights = loaded.random_weights
    graph.meta.ultralytics_version = ultralytics.__version__
    directory = Path(out) if out is not None else default_output_dir(loaded.source, graph.meta.imgsz)
    return graph.save(directory)
