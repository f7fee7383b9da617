"""The `yolojet` command."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from yolojet.errors import YolojetError

EXIT_USAGE = 2


def _imgsz(text: str) -> int | tuple[int, int]:
    """`640` or `640x480` / `640,480` (height first)."""
    problem = f"{text!r}: expected an integer or HEIGHTxWIDTH, e.g. 640 or 384x640"
    try:
        sizes = [int(p) for p in text.replace(",", "x").lower().split("x")]
    except ValueError:
        raise argparse.ArgumentTypeError(problem) from None
    if len(sizes) not in (1, 2):
        raise argparse.ArgumentTypeError(problem)
    return sizes[0] if len(sizes) == 1 else (sizes[0], sizes[1])


def _cmd_export(args: argparse.Namespace) -> int:
    from yolojet import export

    end2end = {"auto": None, "one2one": True, "one2many": False}[args.head]
    directory = export(args.model, out=args.out, imgsz=args.imgsz, end2end=end2end)
    print(f"exported {args.model} -> {directory}")
    return 0


def _format_table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([line.format(*header), line.format(*("-" * w for w in widths))] + [line.format(*r) for r in rows])


def describe(directory: str | Path) -> str:
    """A human-readable summary of a model directory."""
    from yolojet.ir import Graph

    graph = Graph.load(directory)
    meta = graph.meta
    names = ", ".join(meta.names[i] for i in sorted(meta.names)[:8]) + (" ..." if meta.nc > 8 else "")
    lines = [
        f"model dir     {Path(directory).resolve()}",
        f"source        {meta.source or '?'}" + ("  (RANDOM weights)" if meta.random_weights else ""),
        f"task          {meta.task}",
        f"input         {meta.channels}x{meta.imgsz[0]}x{meta.imgsz[1]} (channels x height x width)",
        f"classes       {meta.nc}: {names}",
    ]
    if meta.task != "classify":
        mode = "one-to-one (end2end, no NMS)" if meta.end2end else "one-to-many (NMS)"
        lines += [f"strides       {meta.strides}", f"reg_max       {meta.reg_max}", f"head          {mode}"]
    if meta.kpt_shape:
        lines.append(f"keypoints     {meta.kpt_shape[0]} x {meta.kpt_shape[1]}")
    outputs = ", ".join(f"{tuple(graph.values[o].shape)}" for o in graph.outputs)
    lines += [
        f"outputs       {outputs}",
        f"nodes         {len(graph.nodes)}",
        f"parameters    {graph.num_params():,}",
        f"GFLOPs/image  {graph.flops() / 1e9:.2f}",
        "",
    ]
    counts = Counter(n.op for n in graph.nodes)
    flops: Counter[str] = Counter()
    for node in graph.nodes:
        flops[node.op] += graph.node_flops(node)
    rows = [(op, str(c), f"{flops[op] / 1e9:.3f}") for op, c in counts.most_common()]
    lines.append(_format_table(rows, ("op", "count", "GFLOPs")))
    return "\n".join(lines)


def _cmd_info(args: argparse.Namespace) -> int:
    print(describe(args.model_dir))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="yolojet", description="Run ultralytics YOLO models on NVIDIA GPUs through hand-written Triton kernels."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("export", help="export a checkpoint to a yolojet model directory")
    p.add_argument("model", help="a .pt checkpoint, an ultralytics name (yolo11n.pt) or an architecture (yolo11n.yaml)")
    p.add_argument("--imgsz", type=_imgsz, default=640, help="input size, 640 or HEIGHTxWIDTH (default 640)")
    p.add_argument("--out", type=Path, default=None, help="output directory (default: <name>_yolojet)")
    p.add_argument(
        "--head",
        choices=("auto", "one2one", "one2many"),
        default="auto",
        help="YOLO26 head mode: the checkpoint's own (auto), NMS-free one-to-one, or one-to-many with NMS",
    )
    p.set_defaults(run=_cmd_export)

    p = sub.add_parser("info", help="print a model directory's summary: task, ops, parameters, GFLOPs")
    p.add_argument("model_dir", type=Path, help="a directory written by `yolojet export`")
    p.set_defaults(run=_cmd_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except YolojetError as e:
        print(f"yolojet {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
