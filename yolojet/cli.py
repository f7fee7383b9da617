"""The `yolojet` command."""

from __future__ import annotations

import argparse
import errno
import math
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from yolojet import __version__
from yolojet.errors import (
    EngineConfigError,
    ImageReadError,
    ModelDirError,
    OutputPathError,
    YolojetError,
    YolojetWarning,
)
from yolojet.options import EVENT_LOOPS, MPS_CHOICES, apply_switch_interval

if TYPE_CHECKING:
    import torch

    from yolojet.client.label import LabelJob
    from yolojet.ir import Graph
    from yolojet.options import EngineOptions
    from yolojet.tasks import Results
    from yolojet.timing import Timing

EXIT_USAGE = 2
# Images in flight to a server while labeling: one server batching 64 labeled 4,227 / 4,760 / 5,205 img/s with 64 /
# 128 / 256 in flight (H200, bench_serve.py --label-windows 128 256): with 64 it has one batch to run at a time.
SERVER_LABEL_WINDOW = 256
EXIT_STOPPED = 3
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports a command whose reader closed the pipe
EXIT_CODES = """exit status:
  0    everything asked for was done
  1    the command ran to its end, but some images failed (each is named on stderr, and by label in its error
       log; the others' results are written); compare: an op over the gate; label --bench: requests unanswered
  2    nothing was done: a bad argument, model, dataset or output path, or no images found
  3    label stopped part-way (the server went away, an output could not be written): the records finished before
       it are kept, and --resume continues
  130  interrupted (Ctrl-C); results finished before it are kept
  141  the reader of standard output went away (yolojet detect ... | head)
  143  terminated (SIGTERM: every command but serve ends as on Ctrl-C); results finished before it are kept"""
EXIT_TERMINATED = 143  # 128 + SIGTERM
# SIGTERM (a scheduler's, a container's stop) ends these as Ctrl-C does: what they finished is kept and what they were
# writing is taken back (a model exported into the cache by `info` or `bench` too, whose staging folder the default
# action left behind). Ray's driver would otherwise print a crash report for it; servers drain on it by themselves.
ENDS_ON_SIGTERM = (
    "export", "info", "detect", "val", "pipeline", "bench", "dump", "compare", "profile", "label", "plot", "report",
)  # fmt: skip
# A write that failed for want of room or of a writable file system (`yolojet info > /dev/full`): said in a line, not
# a traceback. Only errors no read can give: an input's read error is not to be called an output's.
OUTPUT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C's KeyboardInterrupt is, so that a run ends the same way."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated


def _stopped_by(interrupt: KeyboardInterrupt) -> tuple[str, int]:
    """What to call the stop, and the exit status."""
    return ("terminated", EXIT_TERMINATED) if isinstance(interrupt, Terminated) else ("interrupted", 130)


def _imgsz(text: str) -> int | tuple[int, int]:
    """`640` or `640x480` / `640,480` (height first)."""
    problem = f"{text!r}: expected an integer or HEIGHTxWIDTH, e.g. 640 or 384x640"
    try:
        sizes = [int(p) for p in text.replace(",", "x").lower().split("x")]
    except ValueError:
        raise argparse.ArgumentTypeError(problem) from None
    if len(sizes) not in (1, 2) or min(sizes) < 1:
        raise argparse.ArgumentTypeError(problem)
    return sizes[0] if len(sizes) == 1 else (sizes[0], sizes[1])


def _number_type(parse: Callable[[str], Any], fits: Callable[[Any], bool], expected: str) -> Callable[[str], Any]:
    """An argparse type: the text parsed, refused with what was expected where it does not parse or does not fit."""

    def number(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected {expected}") from None
        if not fits(value):
            raise argparse.ArgumentTypeError(f"{text!r}: expected {expected}")
        return value

    return number


_positive_int = _number_type(int, lambda v: v >= 1, "a positive integer")
_non_negative_int = _number_type(int, lambda v: v >= 0, "a whole number, 0 or more")
_positive_float = _number_type(float, lambda v: 0 < v < math.inf, "a positive number")  # NaN fits neither bound
_non_negative_float = _number_type(float, lambda v: 0 <= v < math.inf, "a number, 0 or more")
_fraction = _number_type(float, lambda v: 0 <= v <= 1, "a number in [0, 1]")


def _cmd_export(args: argparse.Namespace) -> int:
    from yolojet import export

    end2end = {"auto": None, "one2one": True, "one2many": False}[args.head]
    directory = export(args.model, out=args.out, imgsz=args.imgsz, end2end=end2end)
    print(f"exported {args.model} -> {directory}")
    return 0


def _format_table(rows: Sequence[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([line.format(*header), line.format(*("-" * w for w in widths))] + [line.format(*r) for r in rows])


def describe(model: str | Path) -> str:
    """A human-readable summary of a model: a model directory, or what any command takes (exported first)."""
    from yolojet.engine.models import resolve_graph
    from yolojet.geometry import rect_letterbox

    graph = resolve_graph(model)
    meta = graph.meta
    names = ", ".join(meta.names[i] for i in sorted(meta.names)[:8]) + (" ..." if meta.nc > 8 else "")
    where = Path(model).resolve() if Path(model).is_dir() else model
    lines = [
        f"model         {where}",
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
    if meta.task == "classify":
        lines.append("preprocess    resize and centre crop to the input")
    else:
        (h, w), _ = rect_letterbox((1080, 810), tuple(meta.imgsz), max(meta.strides))  # type: ignore[arg-type]
        lines.append(
            f"letterbox     each image to its own rectangle of stride multiples within the input (a photo of height "
            f"1080 and width 810 runs at {h}x{w}, height x width); --no-rect: every image to the input"
        )
    outputs = ", ".join(f"{tuple(graph.values[o].shape)}" for o in graph.outputs)
    lines += [
        f"outputs       {outputs}",
        f"nodes         {len(graph.nodes)}",
        f"parameters    {_ultralytics_params(graph):,}",
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


def _ultralytics_params(graph: Graph) -> int:
    """The parameters as ultralytics counts those of the fused model: the graph's weights, and a DFL head's fixed
    1x16 conv (reg_max weights), which the graph holds as decode arithmetic rather than a weight."""
    meta = graph.meta
    dfl = meta.reg_max if meta.task != "classify" and meta.reg_max > 1 else 0
    return graph.num_params() + dfl


def _cmd_info(args: argparse.Namespace) -> int:
    print(describe(args.model))
    return 0


def _letterboxed(image: Path, height: int, width: int) -> torch.Tensor:
    """The image as predict feeds it (read like every input, letterboxed as ultralytics does), a float
    (1, 3, H, W) batch in [0, 1]."""
    from yolojet.images import load_frame
    from yolojet.reference.pipeline import letterbox

    return letterbox(load_frame(image), (height, width))[0][None]


def _cmd_dump(args: argparse.Namespace) -> int:
    import torch
    from safetensors.torch import save_file

    from yolojet.engine.engine import Engine
    from yolojet.options import interpreting
    from yolojet.outputs import check_output_folder
    from yolojet.reference.executor import load_reference

    check_output_folder(args.out, "--out")
    on_cpu = str(args.device).startswith("cpu") if args.device is not None else not torch.cuda.is_available()
    if on_cpu and not interpreting():
        # dump compares the Triton kernels with the reference: on a CPU they run only under Triton's interpreter.
        raise EngineConfigError("dump runs the Triton kernels: on the CPU set TRITON_INTERPRET=1 (slow, for tests)")
    # Engine.load refuses the triton backend where it cannot run (no GPU, no TRITON_INTERPRET=1). The tiles and
    # launches are those a predict would run (tuned on a GPU, from the tuning cache once known), unless the engine
    # switches say otherwise: the gate speaks for what users run.
    engine = Engine.load(
        args.model_dir, device=args.device, half=not args.fp32, max_batch=1, backend="triton", **_engine_switches(args)
    )
    h, w = engine.meta.imgsz
    if args.image is not None:
        x = _letterboxed(args.image, h, w)
    else:
        x = torch.rand(1, engine.meta.channels, h, w, generator=torch.Generator().manual_seed(args.seed))
    x = x.to(engine.device)
    ours = engine.dump(x)
    expected = load_reference(args.model_dir, device=engine.device).dump(x)
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputPathError(f"--out {args.out}: cannot create it ({e.strerror})") from e
    order = {name: str(i) for i, name in enumerate(ours)}
    metadata = {"precision": "fp32" if args.fp32 else "fp16", **{f"order:{k}": v for k, v in order.items()}}
    save_file({k: v.contiguous().cpu() for k, v in ours.items()}, str(args.out / "engine.safetensors"), metadata)
    save_file({k: expected[k].contiguous().cpu() for k in ours}, str(args.out / "reference.safetensors"), metadata)
    print(f"wrote {len(ours)} values from the engine and the reference executor to {args.out}")
    return 0


def compare_dumps(directory: Path) -> tuple[list[tuple[str, float, float]], str]:
    """Per value, the relative L2 error of the engine against the reference and the reference's largest magnitude,
    worst first; and the precision."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    engine_file, reference_file = directory / "engine.safetensors", directory / "reference.safetensors"
    for f in (engine_file, reference_file):
        if not f.is_file():
            raise ModelDirError(f"{directory}: no {f.name}; run `yolojet dump` first")
    with safe_open(str(engine_file), "pt") as f:
        precision = f.metadata().get("precision", "fp16")
    ours, expected = load_file(str(engine_file)), load_file(str(reference_file))
    errors = []
    for name, value in ours.items():
        ref = expected[name].float()
        error = float((value.float() - ref).norm() / ref.norm().clamp_min(1e-12))
        errors.append((name, error, float(ref.abs().max()) if ref.numel() else 0.0))
    # Worst first, and a NaN (a value left unwritten) worse than any number: NaN compares false with everything.
    return sorted(errors, key=lambda e: (not math.isnan(e[1]), -e[1])), precision


GATES = {"fp16": 1e-2, "fp32": 1e-4}
FP16_SMALLEST_NORMAL = 6.1e-5
FP16_LARGEST = 65504.0


def _cmd_compare(args: argparse.Namespace) -> int:
    errors, precision = compare_dumps(args.dump_dir)
    gate = GATES[precision]
    rows = [
        (name, f"{err:.2e}", f"{peak:.2e}", "FAIL" if err > gate or err != err else "ok")
        for name, err, peak in errors[: args.top]
    ]
    print(_format_table(rows, ("value", "rel L2", "max |reference|", f"gate {gate:g}")))
    failing = [peak for _, err, peak in errors if err > gate or err != err]
    print(f"{len(errors)} values, {len(failing)} over the {precision} gate of {gate:g}")
    tiny = sum(peak < FP16_SMALLEST_NORMAL for peak in failing)
    huge = sum(peak > FP16_LARGEST for peak in failing)
    if precision == "fp16" and huge:
        print(
            f"{huge} of them go past fp16's largest value ({FP16_LARGEST:g}): they overflow in fp16 whatever the "
            "kernels do; --fp32 checks the kernels"
        )
    if precision == "fp16" and tiny:
        print(
            f"{tiny} of them never reach fp16's normal range (|x| < {FP16_SMALLEST_NORMAL:.1e}), where fp16 keeps "
            "few significant bits: activations that small usually mean untrained weights; real weights, or --fp32, "
            "check the kernels"
        )
    return 1 if failing else 0


def _cmd_profile(args: argparse.Namespace) -> int:
    from yolojet.engine.engine import Engine
    from yolojet.engine.models import check_model_exists

    check_model_exists(args.model)
    _require_cuda("profile")
    engine = Engine.load(
        args.model,
        imgsz=args.imgsz,
        device="cuda",
        half=not args.fp32,
        max_batch=args.batch,
        buckets=[args.batch],
        **_engine_switches(args),
    )
    rows = engine.profile(args.batch)
    total = sum(r.total_ms for r in rows)
    table = [
        (
            r.family,
            str(r.count),
            f"{r.total_ms:.4f}",
            f"{100 * r.total_ms / total:.1f}",
            f"{r.mean_ms:.4f}",
            f"{r.min_ms:.4f}",
            f"{r.max_ms:.4f}",
        )
        for r in rows
    ]
    print(f"batch {args.batch}, {'fp32' if args.fp32 else 'fp16'}, per-launch device time in ms")
    print(_format_table(table, ("family", "count", "total", "%", "mean", "min", "max")))
    print(f"whole graph replay: {engine.time_network(args.batch)}")
    return 0


def _confidence(value: float) -> str:
    """Two decimals, or two significant digits below 0.1 (a low score reads 0.0043, not 0.000)."""
    return f"{value:.2f}" if value >= 0.1 else f"{value:.2g}"


def _detections_header(result: Results) -> str:
    """The column names of `_format_detections`' lines for this task."""
    if result.probs is not None:
        return f"  {'class':<16} {'prob':>6}"
    box = ("cx", "cy", "w", "h", "angle") if result.obb is not None else ("x1", "y1", "x2", "y2")
    extra = "  mask" if result.masks is not None else "  keypoints" if result.keypoints is not None else ""
    return f"  {'class':<16} {'conf':>6}  " + " ".join(f"{name:>8}" for name in box) + extra


def _format_detections(result: Results) -> list[str]:
    """One line per instance: class, confidence, then the box (x1 y1 x2 y2, or cx cy w h angle for OBB)."""
    lines = []
    for i, row in enumerate(result.summary()):
        text = f"  {row['name']:<16} {_confidence(row['confidence']):>6}"
        box = row.get("box")
        if box is not None:
            text += "  " + " ".join(f"{v:8.1f}" if k != "r" else f"{v:8.4f}" for k, v in box.items())
        if result.masks is not None:
            text += f"  {int(result.masks.data[i].sum())} px"
        if result.keypoints is not None:
            text += f"  {result.keypoints.data.shape[1]}"
        lines.append(text)
    return lines


def _found(result: Results, seconds: float) -> str:
    """An image's line: its size, what it holds per class and its time, as ultralytics prints it ("2 persons, 1 bus,
    4.1ms"). Images run in overlapping batches, so an image's time is the wait since the result before it."""
    size = f"{result.orig_shape[0]}x{result.orig_shape[1]}"  # height x width, as predict(verbose=True) and `info`
    took = f"{seconds * 1000:.1f}ms"
    if result.probs is not None:
        top1 = result.names.get(result.probs.top1, result.probs.top1)
        return f"{size}, {top1} {_confidence(result.probs.top1conf)}, {took}"
    counts = result.class_counts()
    found = ", ".join(f"{n} {name}" for name, n in counts.items()) if counts else "no detections"
    return f"{size}, {found}, {took}"


def _cmd_detect(args: argparse.Namespace) -> int:
    from PIL import Image

    from yolojet.engine.engine import Engine
    from yolojet.images import expand_sources
    from yolojet.outputs import (
        JsonLines,
        check_output_file,
        check_output_folder,
        is_stdout,
        refuse_overwriting_inputs,
        shown_path,
        write_atomically,
    )
    from yolojet.progress import Progress

    sources = expand_sources(args.source)
    if not sources:
        raise ImageReadError(f"{' '.join(args.source)}: no images found")
    check_output_file(args.json, "--json")
    refuse_overwriting_inputs({"--json": args.json}, sources, args.model)
    targets: Sequence[Path | None] = [None] * len(sources)
    if args.save is not None:
        check_output_folder(args.save, "--save")
        taken: set[str] = set()
        saved = [_unique_target(args.save, Path(source).stem, taken) for source in sources]
        targets = saved
        inputs = {Path(source).resolve() for source in sources}
        clash = next((t for t in saved if t.resolve() in inputs), None)
        if clash is not None:
            raise OutputPathError(f"--save {args.save}: the annotated image would overwrite the input {clash}")
        _refuse_replacing_other_files(args.save, saved)
    engine = Engine.load(
        args.model,
        device=args.device,
        imgsz=args.imgsz,
        max_batch=args.batch,
        half=not args.fp32,
        decoder=args.decoder,
        max_pixels=args.max_pixels,
        **_letterbox(args),
        **_engine_switches(args),
    )
    options = {"conf": args.conf, "iou": args.iou, "max_det": args.max_det, "classes": args.classes}
    progress = Progress(len(sources), "detect", enabled=len(sources) > 1 and not args.quiet)
    # With --json - stdout carries nothing but the JSON lines: the readable ones go to stderr.
    human = sys.stderr if is_stdout(args.json) else sys.stdout
    records = JsonLines(args.json) if args.json is not None else None
    failed = instances = 0
    classes: Counter[str] = Counter()
    headed = False
    start = previous = time.perf_counter()
    try:
        for path, target, result in zip(sources, targets, engine.stream(sources, **options), strict=True):
            source = shown_path(path)  # a name that is not UTF-8, as JSON and the terminal can hold it
            now = time.perf_counter()
            waited, previous = now - previous, now
            progress.update(1)
            if result.error:
                failed += 1
                reason = shown_path(result.error).removeprefix(f"{source}: ")  # the error names the file already
                progress.write(f"{source}: error: {reason}", file=sys.stderr)
                continue
            if records is not None:
                records.write(
                    {
                        "path": source,
                        "height": result.orig_shape[0],
                        "width": result.orig_shape[1],
                        "detections": result.summary(),
                    }
                )
            if result.probs is None:
                instances += len(result)
                classes.update(result.class_counts())
            if not args.quiet:
                progress.write(f"{source}: {_found(result, waited)}", file=human)
                lines = _format_detections(result)
                if lines and not headed:
                    progress.write(_detections_header(result), file=human)
                    headed = True
                for line in lines:
                    progress.write(line, file=human)
            if target is not None:
                image = Image.fromarray(result.plot()[..., ::-1])

                def save_jpeg(p: Path, image: Image.Image = image) -> None:
                    image.save(p, format="JPEG", quality=90, comment=ANNOTATED)

                try:
                    write_atomically(target, save_jpeg)
                except (OSError, ValueError, OutputPathError) as e:  # JPEG's 65,500-pixel sides, a full disk
                    failed += 1
                    progress.write(f"{source}: error: its annotated image cannot be saved ({e})", file=sys.stderr)
    finally:
        progress.close()
        engine.close()
        if records is not None:
            records.close()
    if records is not None and records.written == 0 and args.json.is_file():  # not the last run's lines
        args.json.write_bytes(b"")
    seconds = time.perf_counter() - start
    if not args.quiet:
        print(_detect_summary(len(sources), failed, instances, classes, seconds, args), file=human)
    if failed:
        print(f"{failed} of {len(sources)} images could not be read", file=sys.stderr)
    return 1 if failed else 0


def _detect_summary(
    images: int, failed: int, instances: int, classes: Counter[str], seconds: float, args: argparse.Namespace
) -> str:
    """The closing lines of `yolojet detect`: images, detections by class, errors, time an image, outputs."""
    done = images - failed
    top = ", ".join(f"{n} {name}" for name, n in classes.most_common(5))
    others = len(classes) - 5
    more = f", and {_counted(others, 'other class', 'other classes')}" if others > 0 else ""
    found = f"{_counted(done, 'image')}, {_counted(instances, 'detection')}" + (f" ({top}{more})" if top else "")
    lines = [
        f"{found}, {_counted(failed, 'error')}",
        f"{seconds * 1000 / max(1, images):.1f} ms an image ({seconds:.2f} s for {images}, model load not included)",
    ]
    if args.json is not None:
        lines.append(f"JSON lines: {args.json}")
    if args.save is not None:
        lines.append(f"annotated images: {args.save}")
    return "\n".join(lines)


# The comment `detect --save` writes into each annotated JPEG: a file carrying it may be replaced by the next run's
# (a run again with other options), any other file at an annotated image's name is the user's and is not.
ANNOTATED = b"annotated by yolojet detect"


def _refuse_replacing_other_files(folder: Path, targets: Sequence[Path]) -> None:
    """Fail before any work where an annotated image would replace a file of the folder that is not one (`photo.png`
    annotated as `photo.jpg` beside the user's own `photo.jpg`). The folder is listed once; only the files whose names
    the run would write are opened."""
    import os

    from PIL import Image, UnidentifiedImageError

    try:
        present = set(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return  # made by the run: nothing to replace
    except OSError as e:
        raise OutputPathError(f"--save {folder}: cannot list it ({e.strerror})") from None
    for target in targets:
        if target.name not in present or not target.exists():  # a link to no file yet: writing through it is safe
            continue
        try:
            with Image.open(target) as image:
                ours = image.format == "JPEG" and image.info.get("comment") == ANNOTATED
        except (OSError, UnidentifiedImageError, SyntaxError):
            ours = False
        if not ours:
            raise OutputPathError(
                f"--save {folder}: {target.name} is there and is not an annotated image detect wrote, which the "
                "annotated image of the same name would replace; give a folder of its own"
            )


def _counted(n: int, one: str, many: str | None = None) -> str:
    """`1 image`, `2 images`."""
    return f"{n:,} {one if n == 1 else many or one + 's'}"


def _unique_target(folder: Path, stem: str, taken: set[str]) -> Path:
    """`stem.jpg`, or `stem_1.jpg`, `stem_2.jpg`, ... when inputs share a name, so no annotated image is lost."""
    name, i = f"{stem}.jpg", 0
    while name in taken:
        i += 1
        name = f"{stem}_{i}.jpg"
    taken.add(name)
    return folder / name


def _shares_a_gpu(devices: list[str]) -> bool:
    """Whether some GPU runs more than one of these worker processes."""
    gpus = [device for device in devices if device.startswith("cuda")]
    return len(gpus) > len(set(gpus))


def _add_mps_flag(parser: argparse.ArgumentParser, who: str) -> None:
    parser.add_argument(
        "--mps",
        choices=MPS_CHOICES,
        default="auto",
        help=f"{who} as clients of an MPS daemon of their own, so that their kernels share the GPU at once rather "
        "than taking turns (4 servers on an H100: Infer at 64 in flight +18-30 %%, p50 at 8 -22-30 %%); auto "
        "(default): where nvidia-cuda-mps-control can start one, on: an error where it cannot, off",
    )


def _add_decoder_flag(parser: argparse.ArgumentParser) -> None:
    from yolojet.options import DECODER_NAMES, DEFAULT_MAX_PIXELS

    parser.add_argument(
        "--decoder",
        choices=DECODER_NAMES,
        default="auto",
        help="how JPEGs are decoded: the GPU's hardware decoders where there are some, else CPU threads (auto, the "
        "default), nvimgcodec or hardware (the hardware decoders through nvImageCodec, or through nvJPEG's C API), "
        "cpu, or nvjpeg (on the GPU's SMs; pixels differ from OpenCV's)",
    )
    parser.add_argument(
        "--max-pixels",
        type=_positive_int,
        default=DEFAULT_MAX_PIXELS,
        help=f"largest image, pixels; a larger one is an error in its place, read no further "
        f"(default {DEFAULT_MAX_PIXELS:,}, as Pillow's bomb check)",
    )


def _shape_list(text: str) -> list[tuple[int, int]]:
    """`480x640,640x480`: input shapes, height first."""
    shapes = []
    for part in text.split(","):
        size = _imgsz(part.strip())
        shapes.append((size, size) if isinstance(size, int) else size)
    return shapes


def _add_letterbox_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("letterbox")
    group.add_argument(
        "--rect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="letterbox each image to the smallest rectangle of stride multiples that holds it, as yolo predict does "
        "(480x640, height x width, for a landscape 4:3 photo at imgsz 640; the default), running the network "
        "derived for that shape; --no-rect "
        "letterboxes every image to the square imgsz",
    )
    group.add_argument(
        "--shapes",
        type=_shape_list,
        default=[],
        metavar="HxW,...",
        help="input shapes to build at load (e.g. 480x640,640x480), so their first images wait for nothing",
    )
    group.add_argument(
        "--max-shapes",
        type=_positive_int,
        default=4,
        metavar="N",
        help="networks of rectangles kept, least recently used dropped first (default 4)",
    )


def _letterbox(args: argparse.Namespace) -> dict[str, Any]:
    return {"rect": args.rect, "shapes": args.shapes, "max_shapes": args.max_shapes}


def _add_engine_switches(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine switches, for debugging and experiments")
    group.add_argument("--no-tune", action="store_true", help="untimed default conv tiles (as YOLOJET_NOTUNE=1)")
    group.add_argument(
        "--no-fuse",
        action="store_true",
        help="one launch per node where nodes share one (SPPF's pools; the classifier's pool with its linear and "
        "softmax) "
        "and no folds (a neck upsample read by the conv after it; a concat's copy read by its conv in place)",
    )
    group.add_argument(
        "--no-pdl", action="store_true", help="ordinary launches, no programmatic dependent launch (as YOLOJET_PDL=0)"
    )
    group.add_argument(
        "--no-branches",
        action="store_true",
        help="every launch in order on one stream, no parallel branches in the graph (as YOLOJET_BRANCHES=0)",
    )


class _EngineSwitches(TypedDict):
    """Engine.load's keyword argument that `_engine_switches` gives: the switches as one value."""

    switches: EngineOptions


def _engine_switches(args: argparse.Namespace) -> _EngineSwitches:
    """The switches given, as `EngineOptions`; None leaves a choice to the environment and the GPU."""
    from yolojet.options import EngineOptions

    off = {"tune": args.no_tune, "pdl": args.no_pdl, "branches": args.no_branches}
    return {"switches": EngineOptions(fuse=not args.no_fuse, **{k: False if v else None for k, v in off.items()})}


def _require_cuda(command: str) -> None:
    import torch

    if not torch.cuda.is_available():
        raise EngineConfigError(f"{command} times the GPU path, and this machine has no CUDA device")


def _cmd_pipeline(args: argparse.Namespace) -> int:
    import torch

    from yolojet.engine.engine import Engine
    from yolojet.engine.models import check_model_exists
    from yolojet.images import Frame
    from yolojet.timing import time_calls

    image = args.image or _bundled_photo()
    frame = _photo_pixels(image)  # first: a bad --image is named before anything else, and costs no engine build
    check_model_exists(args.model)
    _require_cuda("pipeline")
    engine = Engine.load(
        args.model,
        imgsz=args.imgsz,
        max_batch=args.batch,
        buckets=[args.batch],
        **_letterbox(args),
        **_engine_switches(args),
    )
    engine.configure(conf=args.conf)
    shape = engine.input_shape(Frame(frame, bgr=False))[0]
    rows = []
    for where in ("pinned host", "GPU"):
        pixels = frame.pin_memory() if where == "pinned host" else frame.to("cuda")

        def staged_and_run(pixels: torch.Tensor = pixels) -> None:  # a caller's each time: its copies in the path
            for slot in range(args.batch):
                engine.preprocess(pixels, slot)
            engine.run(args.batch)

        timing = time_calls(staged_and_run, args.iters, args.warmup)
        rows.append((f"frame in {where} memory -> boxes in pinned memory", *_per_frame_ms(timing, args.batch)))
    network = engine.time_network(args.batch, repeats=args.iters, warmup=args.warmup, shape=shape)
    rows.append(("network only (graph replay)", *_per_frame_ms(network, args.batch)))
    print(
        f"{image}: {tuple(frame.shape)} frames, input {shape[0]}x{shape[1]}, batch {args.batch}, "
        f"{args.iters} runs, ms per frame"
    )
    print(_format_table(rows, ("path", "p20", "p50", "p80")))
    torch.cuda.synchronize()
    return 0


def _per_frame_ms(timing: Timing, batch: int) -> tuple[str, str, str]:
    p20, p50, p80 = (f"{q * 1000 / batch:.4f}" for q in (timing.p20, timing.p50, timing.p80))
    return p20, p50, p80


def _bundled_photo() -> Path:
    """A real photo to time with when none is given: bus.jpg, which ultralytics ships."""
    from importlib.util import find_spec

    spec = find_spec("ultralytics")
    if spec is None or spec.origin is None:
        raise ImageReadError("no --image given, and no bundled photo found (ultralytics is not installed)")
    return Path(spec.origin).parent / "assets" / "bus.jpg"


def _photo_pixels(image: Path) -> torch.Tensor:
    """The photo as uint8 RGB (H, W, 3) in host memory."""
    from yolojet.images import load_frame

    frame = load_frame(image)
    return frame.pixels if not frame.bgr else frame.pixels.flip(-1)


def _cmd_bench(args: argparse.Namespace) -> int:
    from yolojet.engine.engine import Engine
    from yolojet.engine.models import check_model_exists

    check_model_exists(args.model)
    _require_cuda("bench")
    engine = Engine.load(
        args.model, imgsz=args.imgsz, max_batch=args.batch, buckets=[args.batch], **_engine_switches(args)
    )
    rows = []
    for mode, timing in (
        ("stream launches", engine.time_launches(args.batch, repeats=args.iters, warmup=args.warmup)),
        ("CUDA graph replay", engine.time_network(args.batch, repeats=args.iters, warmup=args.warmup)),
    ):
        rows.append(
            (
                mode,
                *(f"{q * 1000:.4f}" for q in (timing.p20, timing.p50, timing.p80)),
                f"{args.batch / timing.p50:,.0f}",
            )
        )
    print(f"network only, batch {args.batch}, {engine.launch_count(args.batch)} kernel launches, {args.iters} runs")
    print(_format_table(rows, ("mode", "p20 ms", "p50 ms", "p80 ms", "img/s at p50")))
    return 0


def _cmd_val(args: argparse.Namespace) -> int:
    import json

    from yolojet.eval.val import check_val_options, validate_model
    from yolojet.outputs import check_output_folder, refuse_overwriting_inputs, write_atomically

    check_val_options(args.conf, args.iou, args.max_det)  # before the model loads
    if args.out is not None:
        check_output_folder(args.out, "--out")
        for name in ("predictions.json", "metrics.json"):
            refuse_overwriting_inputs({"--out": args.out / name}, (), args.model, datasets=[str(args.data)])
    result = validate_model(
        args.model,
        args.data,
        args.images,
        imgsz=args.imgsz,
        half=not args.fp32,
        batch=args.batch,
        conf=args.conf,
        iou=args.iou,
        max_det=args.max_det,
        progress=not args.quiet,
        protocol=args.protocol,
        rect=args.rect,
        device=args.device,
        **_engine_switches(args),
    )
    print(f"{result.images} images, {len(result.predictions)} detections (conf {args.conf}, iou {args.iou})")
    rows = []
    for kind, scores in (("box", result.scores), ("mask", result.mask_scores), ("keypoints", result.keypoint_scores)):
        if scores is not None:
            rows += [(f"{kind} {k}", f"{v:.4f}") for k, v in scores.to_json().items() if isinstance(v, float)]
    print(_format_table(rows, ("metric", "value")))
    for note in result.unscored + result.notes:
        print(note)
    if args.out is not None:
        metrics = {"model": str(args.model), "data": str(args.data), "images": result.images, **result.to_json()}
        write_atomically(args.out / "predictions.json", lambda p: p.write_text(json.dumps(result.predictions)))
        write_atomically(args.out / "metrics.json", lambda p: p.write_text(json.dumps(metrics, indent=1)))
        print(f"wrote {args.out / 'metrics.json'} and {args.out / 'predictions.json'}")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from yolojet.options import serve_token
    from yolojet.serve.models import parse_model_spec
    from yolojet.serve.server import (
        ServeOptions,
        build_models,
        check_ports_free,
        configure_logging,
        event_loop_name,
        run_server,
        serve_forever,
    )

    specs = [parse_model_spec(text, args.max_batch) for text in args.model]
    if (args.tls_cert is None) != (args.tls_key is None):
        raise OutputPathError("--tls-cert and --tls-key go together: give both or neither")
    for flag, path in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key), ("--token-file", args.token_file)):
        if path is not None and not path.is_file():
            raise ModelDirError(f"{flag} {path}: no such file")
    token = _token_from(args.token_file) if args.token_file is not None else serve_token()
    if args.tls_cert is not None and args.tls_key is not None:
        _check_tls_pair(args.tls_cert, args.tls_key)  # before the models load: gRPC would say only that it cannot bind
    options = ServeOptions(
        host=args.host if args.host is not None else "127.0.0.1",
        port=args.port,
        slo_ms=args.slo_ms,
        max_queue=args.max_queue,
        max_pending=args.max_pending,
        max_calls=args.max_calls,
        max_message_bytes=int(args.max_message_mb * (1 << 20)),
        max_pixels=args.max_pixels,
        device=args.device,
        half=not args.fp32,
        decoder=args.decoder,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        token=token,
        metrics_port=args.metrics_port,
        health_port=args.health_port,
        grace_s=args.grace_s,
        drain_delay_s=args.drain_delay_s,
        engine={**_letterbox(args), **_engine_switches(args)},
        event_loop=args.event_loop,
        mps=args.mps,
    )
    if args.mps == "on" and args.processes == 1:
        raise EngineConfigError("--mps on shares one GPU between whole servers: give it with --processes N (N > 1)")
    event_loop_name(options.event_loop)  # uvloop asked for but not installed: said before any model loads
    configure_logging()
    if args.ray is not None:
        from yolojet.scale.ray_serve import serve_on_ray

        if args.devices is not None:
            raise EngineConfigError(
                "--ray and --devices: give one (--ray runs a replica a GPU of a Ray cluster, "
                "--devices a worker process a device of this machine)"
            )
        if args.device is not None:
            raise EngineConfigError("--device and --ray: give one (the replicas take the devices Ray gives them)")
        if args.processes > 1:
            raise EngineConfigError("--ray and --processes: give one (Ray Serve runs its replicas as processes)")
        if args.host is not None:
            raise EngineConfigError(
                f"--host {args.host} is not available with --ray: Ray Serve's own gRPC proxy listens on every "
                "interface of each node with a replica (keep --port behind the cluster's firewall)"
            )
        serve_on_ray(specs, options, args.ray, args.ray_replicas)
        return 0
    if args.ray_replicas is not None:
        raise EngineConfigError("--ray-replicas goes with --ray (the most Ray Serve replicas)")
    # `--processes N`'s servers share --port; each has a metrics port of its own, from --metrics-port on.
    metrics = {} if args.metrics_port is None else {"--metrics-port": args.metrics_port}
    if args.metrics_port:
        metrics.update({f"--metrics-port (+{i})": args.metrics_port + i for i in range(1, args.processes)})
    # The health port is one for all of them (shared, as --port is).
    health = {"--health-port": args.health_port} if args.health_port is not None else {}
    check_ports_free(options.host, {"--port": args.port, **metrics, **health})
    if args.processes > 1:
        from yolojet.scale.server_processes import serve_processes

        if args.devices is not None:
            raise EngineConfigError(
                "--processes and --devices: give one (--processes runs whole servers sharing the "
                "port, --devices one front with a worker process a device)"
            )
        serve_processes(specs, options, args.processes)
        return 0
    if args.devices is None:
        run_server(serve_forever(build_models(specs, options), options), options.event_loop)
        return 0
    from functools import partial

    from yolojet.scale.devices import parse_devices
    from yolojet.scale.server_workers import PoolRunner, WorkerPool

    if args.device is not None:
        raise EngineConfigError("--device and --devices: give one (--devices runs a worker process a device)")
    engine_options = {"half": not args.fp32, "decoder": args.decoder, "max_pixels": args.max_pixels, **options.engine}
    pool = WorkerPool(specs, parse_devices(args.devices), engine_options)
    try:
        models = pool.start()
        run_server(serve_forever(models, options, runner=partial(PoolRunner, pool=pool)), options.event_loop)
    finally:
        pool.close()
    return 0


def _token_from(path: Path) -> str:
    """The bearer token in a --token-file: an empty one (a secret that was not mounted) is refused, never taken for no
    token, which would leave a server open to anyone."""
    try:
        token = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise OutputPathError(f"--token-file {path}: cannot read it ({e})") from e
    if not token:
        raise OutputPathError(f"--token-file {path}: empty; it must hold the bearer token")
    return token


def _check_tls_pair(cert: Path, key: Path) -> None:
    """The certificate chain and private key read and matched as the server will use them."""
    import ssl

    try:
        # An empty password: an encrypted key fails here instead of OpenSSL asking for its pass phrase on the terminal
        # (gRPC takes no encrypted key either).
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key, password=b"")
    except (ssl.SSLError, OSError) as e:
        raise OutputPathError(
            f"--tls-cert {cert} --tls-key {key}: not a PEM certificate chain and its unencrypted private key ({e})"
        ) from e


def _cmd_label(args: argparse.Namespace) -> int:
    from yolojet.client.label import (
        LabelJob,
        check_kept_settings,
        check_label_options,
        check_outputs,
        job_paths,
        sole_writer,
    )
    from yolojet.client.remote import Connection, bench, model_facts
    from yolojet.options import serve_token

    if args.ray and Path(args.ray).exists():  # nargs='?' takes the word after --ray, even an image folder
        raise EngineConfigError(
            f"--ray {args.ray}: an image source, not a cluster address; give --ray after the "
            "sources, or --ray= for a cluster started here"
        )
    if not args.source:
        raise EngineConfigError("give the images to label: files, globs, folders or .txt lists of image paths")
    if [args.server is not None, args.local, args.ray is not None].count(True) != 1:
        raise EngineConfigError(
            "give --server HOST:PORT (label through yolojet serve), --local (an engine here) or "
            "--ray [ADDRESS] (a Ray cluster)"
        )
    if args.ray_actors is not None and args.ray is None:
        raise EngineConfigError("--ray-actors sizes the engine actors of a Ray run: give it with --ray")
    if args.concurrency is None:
        args.concurrency = SERVER_LABEL_WINDOW if args.server is not None and args.bench is None else 64
    if args.streams is not None and args.server is None:
        raise EngineConfigError("--streams spreads the requests to a server over connections: give it with --server")
    if args.streams is not None and args.streams > args.concurrency:
        raise EngineConfigError(
            f"--streams {args.streams}: between 1 and the requests in flight (-c {args.concurrency})"
        )
    devices = None
    if args.devices is not None:  # checked before any work: a worker process a device is started only to label
        from yolojet.scale.devices import parse_devices

        if not args.local:
            raise EngineConfigError("--devices runs worker processes on this machine's devices: give it with --local")
        if args.device is not None:
            raise EngineConfigError("--device and --devices: give one (--devices runs a worker process a device)")
        devices = parse_devices(args.devices)
    if args.workers > 1:
        if not args.local:
            raise EngineConfigError("--workers runs labeling processes on this machine: give it with --local")
        from yolojet.scale.devices import default_device

        named = devices if devices is not None else [args.device or default_device()]
        devices = [device for device in named for _ in range(args.workers)]
    if args.mps == "on" and (devices is None or not _shares_a_gpu(devices)):
        raise EngineConfigError(
            "--mps on shares a GPU between labeling processes: give it with --local --workers N (N > 1) on a GPU"
        )
    options = {k: v for k, v in (("conf", args.conf), ("iou", args.iou), ("max_det", args.max_det)) if v is not None}
    if args.classes:
        options["classes"] = args.classes
    token = _token_from(args.token_file) if args.token_file is not None else serve_token()
    if args.bench is not None:
        if args.local or args.ray is not None:
            raise EngineConfigError("--bench measures a server: give --server HOST:PORT")
        connection = Connection(args.server, args.model or "", args.tls_ca, token, args.retries)
        facts = model_facts(connection)  # a clear error now rather than in every worker
        source = Path(args.source[0])
        if not source.is_file():
            raise ImageReadError(f"{source}: not a file; --bench sends one image file again and again")
        found = bench(
            connection,
            source,
            args.bench,
            args.concurrency,
            args.processes,
            options,
            args.bench_rpc,
            server_processes=facts.servers,
        )
        _print_bench(found)
        return 0 if found["answered"] == found["requests"] else 1
    if args.out is None:
        raise OutputPathError("--out: give the JSON-lines file the records go to")
    job = LabelJob(
        args.source,
        args.out,
        args.errors,
        args.coco,
        args.rle,
        args.yolo_txt,
        args.resume,
        args.overwrite,
        args.quiet,
        options,
    )
    check_outputs(job)
    check_label_options(options, None)  # said by their flags before any model loads, whichever labels
    # Before the model loads: no images is said at once, and the first ones shape the load.
    paths = job_paths(job, args.model if args.server is None else None)
    if job.resume and job.out.is_file():
        check_kept_settings(job)  # other options than the records': said before a model or a cluster starts
    with sole_writer(job.out):  # before the model loads: a second run on this --out is refused at once
        return _label_job(args, job, paths, devices, options, token)


def _label_job(
    args: argparse.Namespace,
    job: LabelJob,
    paths: list[str],
    devices: list[str] | None,
    options: dict[str, Any],
    token: str | None,
) -> int:
    """`yolojet label`'s run once its outputs are checked and held: the labeler (local, workers, Ray or a server),
    the run, and what it says at the end."""
    from yolojet.client import records
    from yolojet.client.label import Summary, check_label_options, run
    from yolojet.client.remote import REACH_TRIES_A_PROCESS, Connection, RemoteLabeler, model_facts

    summary = Summary()
    label: Callable[[list[str], Callable[[dict], None], Callable[[str, str], None]], None]
    if args.local:
        if not args.model:
            raise EngineConfigError("--local needs --model: a model directory, .pt checkpoint, name or .yaml")
        engine_options = {
            "half": not args.fp32,
            "decoder": args.decoder,
            "max_pixels": args.max_pixels,
            **_letterbox(args),
            **_engine_switches(args),
        }
        if devices is None:
            from yolojet.client.local import LocalLabeler  # not for worker processes: torch is theirs to import

            labeler = LocalLabeler(
                args.model, args.concurrency, options, first_images=paths, device=args.device, **engine_options
            )
            facts, label, close = labeler.facts, labeler, labeler.close
        else:
            from yolojet.scale.local_workers import MultiDeviceLabeler
            from yolojet.scale.mps import MpsDaemon

            # Several processes on one GPU share it through MPS; the daemon quits with this process at the latest.
            mps = MpsDaemon(args.mps if _shares_a_gpu(devices) else "off").__enter__()
            try:
                workers = MultiDeviceLabeler(
                    args.model, args.concurrency, options, devices, first_images=paths, **engine_options
                )
            except BaseException:
                mps.stop()
                raise
            facts, label = workers.facts, workers

            def close() -> None:
                workers.close()
                if mps.running:
                    summary.notes.append("the workers shared each GPU through an MPS daemon of their own (--mps)")
                mps.stop()
                summary.notes.extend(workers.notes())
    elif args.ray is not None:
        from yolojet.scale.ray_label import RayLabeler

        if not args.model:
            raise EngineConfigError("--ray needs --model: a model directory, .pt checkpoint, name or .yaml")
        cluster = RayLabeler(
            args.model,
            args.concurrency,
            options,
            address=args.ray or None,
            actors=args.ray_actors,
            device=args.device,
            half=not args.fp32,
            decoder=args.decoder,
            max_pixels=args.max_pixels,
            **_letterbox(args),
            **_engine_switches(args),
        )
        facts, label = cluster.facts, cluster

        def close() -> None:
            cluster.close()
            summary.notes.extend(cluster.notes())
    else:
        given = _engine_flags_given(args)
        if given:
            raise EngineConfigError(f"{', '.join(given)}: the server's engine has its own (yolojet serve's flags)")
        connection = Connection(args.server, args.model or "", args.tls_ca, token, args.retries)
        facts = model_facts(connection)  # an unreachable server or unknown model: said here, before any worker
        check_label_options(options, facts.names)  # bad options said once, not as an error an image
        streams = args.streams
        if streams is None:  # a stream a server process: each connection reaches one of them
            streams = min(facts.servers, args.concurrency)
            if streams > 1:
                summary.notes.append(f"{streams} streams, one a process of the server's (--streams sets them)")

        def server_notes(refusals: int, reconnects: int, missed_process: int = 0) -> None:
            if refusals or reconnects:
                summary.notes.append(
                    f"the server refused {refusals} requests for a while (sent again) and "
                    f"the connection was reopened {reconnects} times"
                )
            if missed_process:
                summary.notes.append(
                    f"{missed_process} streams ran on another of the server's processes than their own "
                    f"(none of {REACH_TRIES_A_PROCESS} connections a process reached it)"
                )

        if streams > 1:  # a client process a stream: one interpreter sent 5,205 images a second (H200)
            from dataclasses import asdict

            from yolojet.scale.stream_workers import StreamWorkersLabeler

            workers = StreamWorkersLabeler(asdict(connection), args.concurrency, options, streams)
            label = workers

            def close() -> None:
                workers.close()
                summary.notes.extend(workers.notes())
                server_notes(workers.counts["refusals"], workers.counts["reconnects"], workers.counts["missed_process"])

        else:
            remote = RemoteLabeler(connection, args.concurrency, options)

            def label(
                paths: list[str], on_record: Callable[[dict], None], on_error: Callable[[str, str], None]
            ) -> None:
                remote.run(paths, lambda path, reply: on_record(records.from_reply(path, reply)), on_error)

            def close() -> None:
                server_notes(remote.refusals, remote.reconnects)

    try:
        run(job, label, facts, summary, paths)
    except KeyboardInterrupt as interrupt:
        what, status = _stopped_by(interrupt)
        if summary.writing_formats:
            said = f"every image is labeled in {job.out}; --resume writes the COCO file or YOLO dataset again"
            print(f"{what} while writing the formats: {said}", file=sys.stderr)
        else:
            print(f"{what} after {summary.labeled} images; run again with --resume to label the rest", file=sys.stderr)
        return status
    except YolojetError as e:
        if not (summary.labeled or summary.failed):  # stopped before any image: nothing was done
            raise
        print(f"yolojet label: error: {e}", file=sys.stderr)
        print(f"stopped after {summary.labeled} images labeled (in {job.out}); --resume continues", file=sys.stderr)
        return EXIT_STOPPED
    finally:
        close()
    for line in summary.lines(job):
        print(line, file=sys.stderr)
    return 1 if summary.failed else 0


def _port(text: str) -> int:
    """A TCP port for argparse: 0 (any free one) to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a port is a number from 0 to 65535") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port}: a port is a number from 0 to 65535")
    return port


def _server_address(text: str) -> str:
    """HOST:PORT for argparse (an IPv6 host in brackets), the port 1 to 65535 and never left out."""
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT, the port a number from 1 to 65535")
    return text


# label's flags that shape a local engine: a server's engine has its own.
_ENGINE_FLAGS = ("fp32", "device", "decoder", "max_pixels", "rect", "shapes", "max_shapes", "no_tune", "no_fuse",
                 "no_pdl", "no_branches")  # fmt: skip


def _engine_flags_given(args: argparse.Namespace) -> list[str]:
    """label's engine flags given other than their defaults (`engine_defaults`, kept by its parser), as written on
    the command line."""
    given = [flag for flag in _ENGINE_FLAGS if getattr(args, flag) != args.engine_defaults[flag]]
    return ["--no-rect" if flag == "rect" else f"--{flag.replace('_', '-')}" for flag in given]


def _cmd_plot(args: argparse.Namespace) -> int:
    from yolojet.client.plot import plot

    for path in plot(args.labels, args.out, samples=args.samples, seed=args.seed):
        print(f"wrote {path}")
    return 0


def _print_bench(found: dict) -> None:
    s = found["server_ms"]
    rows = [
        ("requests answered", f"{found['answered']} of {found['requests']} ({found['codes']})"),
        ("in flight", f"{found['concurrency']} over {found['processes']} processes, {found['rpc']}"),
        ("img/s", f"{found['img_per_s']:,.0f}"),
        (
            "latency p50 / p90 / p99 / max",
            f"{found['p50_ms']:.2f} / {found['p90_ms']:.2f} / {found['p99_ms']:.2f} / {found['max_ms']:.2f} ms",
        ),
        ("server: queue / decode / run", f"{s['queue']:.2f} / {s['decode']:.2f} / {s['run']:.2f} ms (mean)"),
    ]
    print(_format_table(rows, ("measure", "value")))


def _cmd_report(args: argparse.Namespace) -> int:
    from yolojet.eval.report import REPORT_FILES, report_files, run_report
    from yolojet.outputs import check_output_folder, refuse_overwriting_inputs, write_atomically

    if args.out is not None:
        check_output_folder(args.out, "--out")
        for model in args.model:
            for name in REPORT_FILES:
                refuse_overwriting_inputs({"--out": args.out / name}, (), model, datasets=[str(args.data)])
    report = run_report(
        args.model,
        args.data,
        args.images,
        imgsz=args.imgsz,
        big_batch=args.big_batch,
        iters=args.iters,
        device=args.device,
        progress=sys.stderr.isatty(),
    )
    if args.out is not None:
        files = report_files(report)  # every file rendered before any is written
        for name, write in files.items():
            write_atomically(args.out / name, write)
        print(f"wrote {', '.join(str(args.out / name) for name in files)}", file=sys.stderr)
    print(report.tables(), end="")
    return 0


IMAGES_HELP = "the folder a COCO JSON's file_names are relative to (default: the JSON's own folder)"
DEVICE_HELP = "cuda, cuda:N or cpu (default: a GPU where there is one)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="yolojet",
        description="Run ultralytics YOLO models on NVIDIA GPUs through hand-written Triton kernels.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"yolojet {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("export", help="export a checkpoint to a yolojet model directory")
    p.add_argument("model", help="a .pt checkpoint, an ultralytics name (yolo11n.pt) or an architecture (yolo11n.yaml)")
    p.add_argument(
        "--imgsz",
        type=_imgsz,
        default=None,
        help="input size, 640 or HEIGHTxWIDTH (default: the size the checkpoint was trained at, else 640)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default: <name>_yolojet at 640x640, else <name>_HxW_yolojet)",
    )
    p.add_argument(
        "--head",
        choices=("auto", "one2one", "one2many"),
        default="auto",
        help="YOLO26 head mode: the checkpoint's own (auto), NMS-free one-to-one, or one-to-many with NMS",
    )
    p.set_defaults(run=_cmd_export)

    p = sub.add_parser("info", help="print a model's summary: task, input, letterbox, ops, parameters, GFLOPs")
    p.add_argument("model", help="a model directory, .pt checkpoint, ultralytics name or architecture .yaml")
    p.set_defaults(run=_cmd_info)

    p = sub.add_parser("detect", help="detect objects in images and print them in original image coordinates")
    p.add_argument("model", help="a model directory, .pt checkpoint, ultralytics name or architecture .yaml")
    p.add_argument("source", nargs="+", help="image files, globs or directories")
    p.add_argument("--conf", type=_fraction, default=0.25, help="confidence threshold (default 0.25)")
    p.add_argument("--iou", type=_fraction, default=0.7, help="NMS IoU threshold (default 0.7)")
    p.add_argument("--max-det", type=int, default=300, help="most detections per image, at most 300 (default 300)")
    p.add_argument("--classes", type=int, nargs="+", default=None, help="keep only these class ids")
    p.add_argument("--imgsz", type=_imgsz, default=None, help="model input size (default: the model's, or 640)")
    p.add_argument("--batch", type=_positive_int, default=1, help="images per batch (default 1)")
    p.add_argument("--device", default=None, help=DEVICE_HELP)
    p.add_argument("--fp32", action="store_true", help="run the GPU engine in fp32 instead of fp16")
    p.add_argument(
        "--save",
        type=Path,
        default=None,
        help="write annotated images into this directory, as NAME.jpg for each input NAME.* (an earlier run's are "
        "replaced; any other file of that name is not: the run is refused)",
    )
    p.add_argument(
        "--json",
        type=Path,
        default=None,
        help="write detections as JSON lines to this file as they are found (- for stdout, which then carries only "
        "them; a link is written through to its target)",
    )
    p.add_argument("--quiet", action="store_true", help="print only errors: no line an image, no summary")
    _add_decoder_flag(p)
    _add_letterbox_flags(p)
    _add_engine_switches(p)
    p.set_defaults(run=_cmd_detect)

    p = sub.add_parser("val", help="COCO evaluation (pycocotools) of a model on a dataset")
    p.add_argument("model", help="a model directory, .pt checkpoint, ultralytics name or architecture .yaml")
    p.add_argument("--data", required=True, type=Path, help="a COCO instances .json or an ultralytics dataset .yaml")
    p.add_argument("--images", type=Path, default=None, help=IMAGES_HELP)
    p.add_argument("--device", default=None, help=DEVICE_HELP)
    p.add_argument("--imgsz", type=_imgsz, default=None, help="model input size (default: the model's, or 640)")
    p.add_argument(
        "--batch",
        type=_positive_int,
        default=16,
        help="images per batch (default 16, as yolo val; with --protocol val the batches' shapes depend on it)",
    )
    p.add_argument(
        "--conf", type=_fraction, default=0.001, help="confidence threshold (default 0.001, as ultralytics val)"
    )
    p.add_argument("--iou", type=_fraction, default=0.7, help="NMS IoU threshold (default 0.7)")
    p.add_argument("--max-det", type=int, default=300, help="most detections per image, at most 300 (default 300)")
    p.add_argument("--fp32", action="store_true", help="run the GPU engine in fp32 instead of fp16")
    p.add_argument("--out", type=Path, default=None, help="write metrics.json and predictions.json here")
    p.add_argument(
        "--protocol",
        choices=("val", "predict"),
        default="val",
        help="val (the default): run the network as yolo val runs the model (batches of similar aspect ratio, one "
        "letterbox shape a batch, NMS keeping every class over conf per box), so the same weights give the same "
        "mAP; predict: score what the engine's predict path gives (each image its own rectangle, or with --no-rect "
        "the square imgsz; one class a box)",
    )
    p.add_argument(
        "--rect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="--protocol predict: letterbox each image to its own rectangle (the default) or, with "
        "--no-rect, to the square imgsz",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_engine_switches(p)
    p.set_defaults(run=_cmd_val)

    p = sub.add_parser("pipeline", help="time the end-to-end path: frame in memory to boxes in pinned memory (GPU)")
    p.add_argument("model", help="a model directory, .pt checkpoint, ultralytics name or architecture .yaml")
    p.add_argument("--image", type=Path, default=None, help="the frame to time (default: ultralytics' bus.jpg)")
    p.add_argument("--imgsz", type=_imgsz, default=None, help="model input size (default: the model's, or 640)")
    p.add_argument("--batch", type=_positive_int, default=1, help="frames per run (default 1)")
    p.add_argument("--conf", type=_fraction, default=0.25, help="confidence threshold (default 0.25)")
    p.add_argument("--iters", type=_positive_int, default=200, help="timed runs (default 200)")
    p.add_argument("--warmup", type=_non_negative_int, default=20, help="untimed runs first (default 20)")
    _add_letterbox_flags(p)
    _add_engine_switches(p)
    p.set_defaults(run=_cmd_pipeline)

    p = sub.add_parser("bench", help="time the network alone: stream launches vs one CUDA graph (GPU)")
    p.add_argument("model", help="a model directory, .pt checkpoint, ultralytics name or architecture .yaml")
    p.add_argument("--imgsz", type=_imgsz, default=None, help="model input size (default: the model's, or 640)")
    p.add_argument("--batch", type=_positive_int, default=1, help="images per run (default 1)")
    p.add_argument("--iters", type=_positive_int, default=200, help="timed runs (default 200)")
    p.add_argument("--warmup", type=_non_negative_int, default=20, help="untimed runs first (default 20)")
    _add_engine_switches(p)
    p.set_defaults(run=_cmd_bench)

    p = sub.add_parser("dump", help="write every op's output from the engine and from the reference executor")
    p.add_argument("model_dir", type=Path, help="a directory written by `yolojet export`")
    p.add_argument("--image", type=Path, default=None, help="an image to run (default: seeded random input)")
    p.add_argument("--out", type=Path, default=Path("yolojet_dump"), help="output directory (default yolojet_dump)")
    p.add_argument("--fp32", action="store_true", help="run the engine in fp32 instead of fp16")
    p.add_argument("--device", default=None, help="cuda (default when present) or cpu with TRITON_INTERPRET=1")
    p.add_argument("--seed", type=int, default=0, help="seed of the random input")
    _add_engine_switches(p)
    p.set_defaults(run=_cmd_dump)

    p = sub.add_parser("compare", help="per-op relative error of a dump, worst first; exit 1 over the gate")
    p.add_argument(
        "dump_dir",
        type=Path,
        nargs="?",
        default=Path("yolojet_dump"),
        help="a folder written by `yolojet dump` (default yolojet_dump)",
    )
    p.add_argument("--top", type=_positive_int, default=25, help="rows to print (default 25)")
    p.set_defaults(run=_cmd_compare)

    p = sub.add_parser("profile", help="device time per kernel family (needs a GPU)")
    p.add_argument("model", help="a model directory, .pt checkpoint, ultralytics name or architecture .yaml")
    p.add_argument("--imgsz", type=_imgsz, default=None, help="model input size (default: the model's, or 640)")
    p.add_argument("--batch", type=_positive_int, default=1, help="images per run (default 1)")
    p.add_argument("--fp32", action="store_true", help="profile the fp32 engine")
    _add_engine_switches(p)
    p.set_defaults(run=_cmd_profile)

    p = sub.add_parser(
        "serve", help="a gRPC inference server (yolojet.v1.Inference, health, reflection) over one or more models"
    )
    p.add_argument(
        "--model",
        action="append",
        required=True,
        metavar="NAME_OR_DIR[:MAX_BATCH]",
        help="a model directory, .pt checkpoint, ultralytics name or .yaml, and its largest batch; repeat for more "
        "models (requests name them by file or folder name without its suffix)",
    )
    p.add_argument(
        "--host", default=None, help="address to listen on (default 127.0.0.1; 0.0.0.0 for all; not with --ray)"
    )
    p.add_argument("--port", type=_port, default=50051, help="gRPC port (default 50051; 0 picks a free one)")
    p.add_argument(
        "--max-batch", type=_positive_int, default=64, help="largest batch of a model given without one (default 64)"
    )
    p.add_argument(
        "--slo-ms",
        type=_positive_float,
        default=None,
        help="deadline of a request whose client sets none, ms after it arrives (default 50; where two runs of a "
        "model's largest batch take longer, as on a CPU, eight such runs)",
    )
    p.add_argument(
        "--max-queue",
        type=_positive_int,
        default=1024,
        help="requests a model queues before refusing more with RESOURCE_EXHAUSTED (default 1024)",
    )
    p.add_argument(
        "--max-pending",
        type=_positive_int,
        default=None,
        help="calls gRPC holds for the server before its event loop takes them; past this new calls are turned away at "
        "once (CANCELLED), so a server offered more than it can even receive does not fall behind every deadline "
        "(default: gRPC's own, 3,000)",
    )
    p.add_argument(
        "--max-calls",
        type=_positive_int,
        default=None,
        help="calls under way at once in each server process (a stream, a health check and ListModels count as one "
        "each); past this gRPC turns new ones away at once (RESOURCE_EXHAUSTED), before the service reads them. "
        "With --max-pending, for a server that may be offered more than it sustains (default: no limit)",
    )
    p.add_argument("--max-message-mb", type=_positive_float, default=64.0, help="largest request, MB (default 64)")
    p.add_argument("--device", default=None, help=DEVICE_HELP)
    p.add_argument(
        "--devices",
        default=None,
        metavar="all|0,1|cpu,...",
        help="one engine worker process a device "
        "behind this one front end: every GPU (all), GPU indices, or device names; a worker that dies is "
        "restarted and its batches sent to another",
    )
    p.add_argument(
        "--processes",
        type=_positive_int,
        default=1,
        metavar="N",
        help="N whole servers (front, batcher, "
        "engines) in processes of their own sharing --port, each new connection to one of them, so that "
        "more than one interpreter's worth of calls is served (default 1); metrics on --metrics-port + "
        "the process's index",
    )
    p.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="deploy on a Ray cluster with "
        "Ray Serve (pip install 'yolojet[ray]'): a replica a GPU (CPU replicas on a cluster without GPUs), "
        "scaled on queue depth, behind Ray Serve's gRPC proxy on --port of each node (every interface); "
        "ADDRESS is the head's HOST:6379 (`ray start --head`), none starts a local cluster; Infer, "
        "InferStream, InferBatchStream and ListModels; no TLS, token or --metrics-port",
    )
    p.add_argument(
        "--ray-replicas",
        type=_positive_int,
        default=None,
        metavar="N",
        help="--ray: at most N replicas (default: a GPU each, one without GPUs)",
    )
    p.add_argument("--fp32", action="store_true", help="run the GPU engines in fp32 instead of fp16")
    p.add_argument("--tls-cert", type=Path, default=None, help="PEM certificate chain: serve over TLS")
    p.add_argument("--tls-key", type=Path, default=None, help="PEM private key of --tls-cert")
    p.add_argument(
        "--token-file",
        type=Path,
        default=None,
        help="require 'authorization: Bearer <token>' with the "
        "token in this file (or set YOLOJET_TOKEN); health checks and reflection stay open",
    )
    p.add_argument(
        "--metrics-port",
        type=_port,
        default=None,
        help="serve Prometheus metrics on this port (0: any free one; default: none)",
    )
    p.add_argument(
        "--health-port",
        type=_port,
        default=None,
        help="also answer gRPC health checks on this port, plain gRPC, outside --max-calls and the token: for a "
        "liveness probe that must be answered while every call --max-calls allows is under way (0: any free one; "
        "default: health on --port only)",
    )
    p.add_argument(
        "--grace-s",
        type=_non_negative_float,
        default=30.0,
        help="on SIGTERM, seconds to finish accepted requests (default 30)",
    )
    p.add_argument(
        "--drain-delay-s",
        type=_non_negative_float,
        default=0.0,
        help="on SIGTERM, seconds to go on serving with health NOT_SERVING before new calls are refused, so that a "
        "load balancer takes the server out first (default 0; SIGINT or a second SIGTERM ends it; with --grace-s, "
        "within the time a container manager gives, 30 s in Kubernetes)",
    )
    _add_mps_flag(p, "--processes: the servers")
    p.add_argument(
        "--event-loop",
        choices=EVENT_LOOPS,
        default="auto",
        help="the server's event loop: uvloop (a fifth less CPU a request), asyncio's own, or auto: uvloop where "
        "installed (default)",
    )
    _add_decoder_flag(p)
    _add_letterbox_flags(p)
    _add_engine_switches(p)
    p.set_defaults(run=_cmd_serve)

    p = sub.add_parser(
        "label", help="label images into JSON lines, COCO and YOLO label files, through a server or locally; resumable"
    )
    p.add_argument(
        "source",
        nargs="*",  # one at least, checked by the command: `--ray photos/` takes the folder as the cluster's address
        help="image files, globs, directories (searched recursively) or .txt files of image paths, a path a "
        "line (relative ones from the .txt file's folder; # starts a comment); one at least",
    )
    p.add_argument("--out", type=Path, default=None, help="JSON-lines file of one record an image (required to label)")
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--server", type=_server_address, default=None, metavar="HOST:PORT", help="label through yolojet serve there"
    )
    where.add_argument("--local", action="store_true", help="label on an engine in this process")
    where.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="label on a Ray cluster, "
        "an engine actor a GPU (the CPU reference where it has none): ADDRESS is HOST:PORT of `ray "
        "start --head`, ray://HOST:PORT or auto; alone, a cluster started here. The workers read the "
        "image files themselves, by their absolute paths: a file system all machines share",
    )
    p.add_argument(
        "--model",
        default=None,
        help="with --server: the served model's name (needed when it serves "
        "several); with --local or --ray: a model directory, .pt checkpoint, name or .yaml",
    )
    p.add_argument(
        "-c",
        "--concurrency",
        type=_positive_int,
        default=None,
        help=f"images in flight (--server; default {SERVER_LABEL_WINDOW}, 64 with --bench), or the batch (--local, "
        "--ray; default 64)",
    )
    p.add_argument(
        "--streams",
        type=_positive_int,
        default=None,
        metavar="N",
        help="--server: N streams, each in a client process and on a connection of its own, sharing the images in "
        "flight (default: one a process of the server's, `serve --processes`; one process sent about 5,200 images "
        "a second)",
    )
    p.add_argument(
        "--ray-actors",
        type=_positive_int,
        default=None,
        metavar="N",
        help="--ray: most engine actors at once (default: one a GPU of the cluster, or one a CPU where it has no GPU)",
    )
    p.add_argument("--coco", type=Path, default=None, help="also write COCO annotations here (at the end, atomically)")
    p.add_argument("--rle", action="store_true", help="COCO segmentations as RLE, not polygons")
    p.add_argument(
        "--yolo-txt",
        type=Path,
        default=None,
        help="also make an ultralytics dataset here: label files, image links, data.yaml",
    )
    p.add_argument(
        "--errors",
        type=Path,
        default=None,
        help="JSON lines of the images that failed and why (default: OUT.errors.jsonl)",
    )
    p.add_argument("--resume", action="store_true", help="keep OUT's records and label only the images not in it")
    p.add_argument("--overwrite", action="store_true", help="replace OUT's records, if it has any")
    p.add_argument("--conf", type=float, default=None, help="confidence threshold (default 0.25)")
    p.add_argument("--iou", type=float, default=None, help="NMS IoU threshold (default 0.7)")
    p.add_argument("--max-det", type=int, default=None, help="most detections an image, 1..300 (default 300)")
    p.add_argument("--classes", type=int, nargs="+", default=None, help="keep only these class ids")
    p.add_argument(
        "--bench",
        type=_positive_int,
        default=None,
        metavar="N",
        help="send N requests of SOURCE's first "
        "image as fast as -c allows and print img/s and latencies (with --server)",
    )
    p.add_argument("--processes", type=_positive_int, default=4, help="--bench: client processes (default 4)")
    p.add_argument(
        "--bench-rpc",
        choices=("Infer", "InferStream", "InferBatchStream"),
        default="Infer",
        help="--bench: unary calls (Infer, the default), or streams, one a connection: InferStream (an image a "
        "message) or InferBatchStream (up to 16 a message, as labeling sends them)",
    )
    p.add_argument(
        "--retries",
        type=_non_negative_int,
        default=8,
        help="--server: times an unreachable or lost server is tried "
        "again, 0.5 s, 1 s, 2 s, ... apart (default 8, about 2 minutes)",
    )
    p.add_argument("--tls-ca", type=Path, default=None, help="--server over TLS, trusting this PEM certificate")
    p.add_argument("--token-file", type=Path, default=None, help="bearer token for the server (or YOLOJET_TOKEN)")
    p.add_argument("--quiet", action="store_true", help="no progress, no per-image errors on stderr")
    p.add_argument("--fp32", action="store_true", help="--local, --ray: the GPU engine in fp32")
    p.add_argument(
        "--device",
        default=None,
        help="--local: cuda, cuda:N or cpu; --ray: cuda or cpu (default: the cluster's GPUs where it has some)",
    )
    p.add_argument(
        "--devices",
        default=None,
        metavar="all|0,1|cpu,...",
        help="--local: one worker process a device, "
        "each taking the next chunk of images as it is free: every GPU (all), GPU indices, or device names; "
        "a dead worker's images are labeled by another",
    )
    p.add_argument(
        "--workers",
        type=_positive_int,
        default=1,
        metavar="N",
        help="--local: N labeling processes on each device (--device's, or each of --devices), each with its "
        "own engine: one labeled 6,500-7,900 images a second on an H200 in two runs, four together 8,300 (README), "
        "for a few seconds more of start-up (default 1: this process)",
    )
    _add_mps_flag(p, "--workers N: the processes sharing a GPU")
    _add_decoder_flag(p)
    _add_letterbox_flags(p)
    _add_engine_switches(p)
    p.set_defaults(run=_cmd_label, engine_defaults={flag: p.get_default(flag) for flag in _ENGINE_FLAGS})

    p = sub.add_parser("plot", help="pictures of a labeling run: annotated samples, classes and scores")
    p.add_argument("labels", type=Path, help="JSON lines written by yolojet label")
    p.add_argument("--out", type=Path, required=True, help="folder for grid.png, classes.png and scores.png")
    p.add_argument("--samples", type=_positive_int, default=16, help="images in the grid (default 16)")
    p.add_argument("--seed", type=int, default=0, help="which images are sampled (default 0)")
    p.set_defaults(run=_cmd_plot)

    p = sub.add_parser(
        "report", help="yolojet fp16/fp32 next to PyTorch eager (and ONNX Runtime): speed and mAP on one dataset"
    )
    p.add_argument("model", nargs="+", help="model directories, .pt checkpoints, ultralytics names or .yaml files")
    p.add_argument("--data", required=True, type=Path, help="a COCO instances .json or an ultralytics dataset .yaml")
    p.add_argument("--images", type=Path, default=None, help=IMAGES_HELP)
    p.add_argument("--device", default=None, help=DEVICE_HELP)
    p.add_argument("--imgsz", type=_imgsz, default=None, help="model input size (default: the model's, or 640)")
    p.add_argument(
        "--big-batch", type=_positive_int, default=None, help="batch for the img/s column (default 64; 4 on a CPU)"
    )
    p.add_argument(
        "--iters", type=_positive_int, default=None, help="timed runs per batch size (default 50; 5 on a CPU)"
    )
    p.add_argument("--out", type=Path, default=None, help="write report.json, report.md and latency.png here")
    p.set_defaults(run=_cmd_report)
    for command in sub.choices.values():
        command.epilog, command.formatter_class = EXIT_CODES, argparse.RawDescriptionHelpFormatter
        command.set_defaults(command_parser=command)  # an unknown option is said with this command's usage
    return parser


def _quiet_stdout() -> None:
    """Standard output sent to /dev/null, so that the interpreter's own flush at exit cannot fail again."""
    import os

    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def main(argv: Sequence[str] | None = None) -> int:
    import signal
    import threading

    args, unknown = build_parser().parse_known_args(argv)
    if unknown:  # said with the command's own usage, not the top level's (which lists only the commands)
        args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    ending = args.command in ENDS_ON_SIGTERM and threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGTERM, _terminated) if ending else None
    try:
        apply_switch_interval()
        with warnings.catch_warnings():
            shown = warnings.showwarning

            def show(message: Warning | str, category: type[Warning], *rest: Any, **named: Any) -> None:
                if issubclass(category, YolojetWarning):
                    print(f"yolojet {args.command}: warning: {message}", file=sys.stderr)
                else:
                    shown(message, category, *rest, **named)

            warnings.showwarning = show
            return args.run(args)
    except YolojetError as e:
        print(f"yolojet {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as interrupt:
        what, status = _stopped_by(interrupt)
        print(what, file=sys.stderr)
        return status
    except BrokenPipeError:
        # The reader went away (`yolojet detect ... | head`): stop quietly.
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except OSError as e:
        if e.errno not in OUTPUT_ERRNOS:
            raise
        print(f"yolojet {args.command}: error: an output could not be written: {e}", file=sys.stderr)
        _quiet_stdout()
        return EXIT_USAGE
    finally:
        if ending:  # main() called in a process that goes on (a test, a script): its own handler back
            signal.signal(signal.SIGTERM, before)


if __name__ == "__main__":
    sys.exit(main())
