"""`yolojet report`: yolojet next to PyTorch eager (and ONNX Runtime where installed), in one process on one device.

Every runtime gets the same decoded images (decoded once more per runtime on the CPU, so the same pixels), the
same letterbox (`torch_pipeline.letterbox`, or yolojet's own kernel that is held to it), the same post-processing
(`torch_pipeline.non_max_suppression` / `select_end2end` + `scale_boxes`; yolojet's GPU path has its own kernels,
held to these) and the same evaluator (`validate` + pycocotools at conf 0.001, iou 0.7, max_det 300). So between
rows only the network and its runtime differ.

Timing covers one batch from decoded frames in host memory to boxes in original pixels in host memory: letterbox,
network and post-processing (at predict's conf 0.25), median wall clock over `iters` runs after a warm-up, with the
device synchronised around each run. Decoding the image files is not timed.
"""

from __future__ import annotations

import copy
import io
import json
import math
import sys
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import torch

from yolojet.engine.models import resolve_graph
from yolojet.errors import EngineConfigError, ImageReadError, YolojetError
from yolojet.eval.coco import CocoScores
from yolojet.eval.datasets import Dataset, load_dataset
from yolojet.eval.val import validate
from yolojet.images import Frame, load_frame
from yolojet.ir import GRAPH_FILE, Graph, ModelMeta
from yolojet.reference import pipeline as torch_pipeline
from yolojet.timing import time_calls


class PostprocessOptions(TypedDict):
    conf: float
    iou: float
    max_det: int


VAL_OPTIONS: PostprocessOptions = {"conf": 0.001, "iou": 0.7, "max_det": 300}  # as `yolojet val` and ultralytics' val
# Every runtime is given identical inputs, so that its mAP is its own: every image at the model's input size. `yolojet
# val` letterboxes each batch to its own rectangle, as `yolo val` does, so its mAP of the same weights differs a little.
SAME_INPUTS = (
    "every image letterboxed to the model's input size for every runtime (rect=False; yolojet val scores "
    "ultralytics' rectangles, so its mAP differs slightly)"
)
VAL_BATCH = 8  # `yolojet val`'s default (at most the big batch)
TIMING_OPTIONS: PostprocessOptions = {"conf": 0.25, "iou": 0.7, "max_det": 300}  # as predict
DEFAULT_BIG_BATCH = {"cuda": 64, "cpu": 4}
DEFAULT_ITERS = {"cuda": 50, "cpu": 5}
SOURCE_TOLERANCE = 1e-2  # max |ultralytics − reference| / max |reference| on one image: the same weights, or not

Detections = tuple[np.ndarray, np.ndarray, np.ndarray]  # xyxy (n, 4), conf (n,), cls (n,): original pixels


def _log(message: str) -> None:
    print(f"report: {message}", file=sys.stderr, flush=True)


def _first(output: Any) -> torch.Tensor:
    """The decoded predictions from a head's output (ultralytics returns (y, raw) in eval mode)."""
    return output[0] if isinstance(output, (tuple, list)) else output


def postprocess(
    raw: torch.Tensor, boxes: list[torch_pipeline.Letterbox], meta: ModelMeta, conf: float, iou: float, max_det: int
) -> list[torch.Tensor]:
    """Rows [x1, y1, x2, y2, conf, cls] in original pixels, on the CPU: the engine's torch path, for any runtime."""
    raw = raw.float()
    if meta.end2end:
        found = torch_pipeline.select_end2end(raw, conf, max_det)
    else:
        found = torch_pipeline.non_max_suppression(raw, meta.nc, conf, iou, max_det)
    return [torch_pipeline.scale_boxes(rows[:, :6].clone(), box).cpu() for rows, box in zip(found, boxes, strict=True)]


def letterboxed(frames: list[Frame], imgsz: tuple[int, int], device: torch.device) -> tuple[torch.Tensor, list]:
    """The frames moved to `device` and letterboxed exactly as yolojet's torch path does: (N, 3, H, W) float32."""
    inputs, boxes = [], []
    for frame in frames:
        pixels = frame.pixels.to(device, non_blocking=True)
        x, box = torch_pipeline.letterbox(Frame(pixels, frame.bgr, frame.path), imgsz)
        inputs.append(x)
        boxes.append(box)
    return torch.stack(inputs), boxes


class Runtime(ABC):
    """One way of running the model: `predict` for accuracy, `time_batch` for speed on the fixed `sample` frames."""

    name = ""  # yolojet-fp16, yolojet-fp32, pytorch-fp16, pytorch-fp32, onnxruntime
    precision = "fp32"

    def __init__(self, meta: ModelMeta, device: torch.device, label: str) -> None:
        self.meta = meta
        self.device = device
        self.label = label
        self.sample: list[Frame] = []

    @abstractmethod
    def predict(self, frames: list[Frame], conf: float, iou: float, max_det: int) -> list[Detections]:
        """(xyxy, conf, cls) per frame, original pixels, numpy."""

    @abstractmethod
    def _timed(self, frames: list[Frame]) -> None:
        """One timed run: frames in host memory to boxes in host memory, at TIMING_OPTIONS."""

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time_batch(self, batch: int, iters: int, warmup: int) -> float:
        """Median ms for one batch of the first `batch` sample frames, after `warmup` untimed runs."""
        frames = self.sample[:batch]
        if len(frames) != batch:
            raise EngineConfigError(f"batch {batch}: only {len(self.sample)} sample frames staged")
        return time_calls(partial(self._timed, frames), iters, warmup, synchronize=self._sync).p50 * 1000

    def close(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


class YolojetRuntime(Runtime):
    """yolojet's engine: the whole path in one call (one CUDA graph on the GPU, the reference executor on the CPU)."""

    def __init__(self, engine: Any, precision: str, label: str) -> None:
        super().__init__(engine.meta, engine.device, label)
        self.engine = engine
        self.precision = precision
        self.name = f"yolojet-{precision}"

    def predict(self, frames: list[Frame], conf: float, iou: float, max_det: int) -> list[Detections]:
        found = []
        for frame, result in zip(frames, self.engine(frames, conf=conf, iou=iou, max_det=max_det), strict=True):
            if result.error:
                raise ImageReadError(f"{frame.path}: {result.error}")
            found.append((result.boxes.xyxy, result.boxes.conf, result.boxes.cls))
        return found

    def time_batch(self, batch: int, iters: int, warmup: int) -> float:
        self.engine.configure(**TIMING_OPTIONS)  # once, outside the timed runs
        return super().time_batch(batch, iters, warmup)

    def _timed(self, frames: list[Frame]) -> None:
        for slot, frame in enumerate(frames):
            self.engine.preprocess(frame, slot)
        self.engine.run(len(frames))

    def close(self) -> None:
        del self.engine
        super().close()


class LetterboxedRuntime(Runtime):
    """A network fed yolojet's letterboxed tensors and post-processed by yolojet's torch ops: only `raw` differs."""

    letterbox_device = torch.device("cpu")

    @abstractmethod
    def raw(self, x: torch.Tensor) -> torch.Tensor:
        """The network's first output for a float NCHW batch in [0, 1], float32."""

    def _boxes(self, frames: list[Frame], conf: float, iou: float, max_det: int) -> list[torch.Tensor]:
        """Rows [x1, y1, x2, y2, conf, cls] per frame, original pixels, in host memory."""
        x, boxes = letterboxed(frames, self.meta.imgsz, self.letterbox_device)
        return postprocess(self.raw(x), boxes, self.meta, conf, iou, max_det)

    def predict(self, frames: list[Frame], conf: float, iou: float, max_det: int) -> list[Detections]:
        return [
            (rows[:, :4].numpy(), rows[:, 4].numpy(), rows[:, 5].numpy())
            for rows in self._boxes(frames, conf, iou, max_det)
        ]

    def _timed(self, frames: list[Frame]) -> None:
        self._boxes(frames, **TIMING_OPTIONS)


class TorchRuntime(LetterboxedRuntime):
    """The ultralytics model itself, eager, fed yolojet's letterboxed tensors, post-processed by yolojet's torch ops."""

    def __init__(self, module: torch.nn.Module, meta: ModelMeta, device: torch.device, half: bool, label: str) -> None:
        super().__init__(meta, device, label)
        self.dtype = torch.float16 if half else torch.float32
        self.precision = "fp16" if half else "fp32"
        self.name = f"pytorch-{self.precision}"
        self.model = copy.deepcopy(module).to(device=device, dtype=self.dtype).eval()
        self.letterbox_device = device

    def raw(self, x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return _first(self.model(x.to(self.device, self.dtype))).float()

    def close(self) -> None:
        del self.model
        super().close()


class OnnxRuntime(LetterboxedRuntime):
    """ONNX Runtime on ultralytics' own ONNX export (fp32, dynamic batch), fed the same letterboxed tensors."""

    name = "onnxruntime"

    def __init__(self, session: Any, meta: ModelMeta, device: torch.device, label: str) -> None:
        super().__init__(meta, device, label)
        self.session = session
        self.input_name = session.get_inputs()[0].name

    def raw(self, x: torch.Tensor) -> torch.Tensor:
        output = self.session.run(None, {self.input_name: x.detach().cpu().numpy().astype(np.float32)})[0]
        return torch.from_numpy(output)

    def _sync(self) -> None:
        """Nothing to wait for: session.run returns host arrays, so it has already waited."""

    def close(self) -> None:
        del self.session
        super().close()


class _ValidateView:
    """What `validate` calls an engine with: `names`, and images in -> `Results` out. Every image is decoded on the
    CPU by `load_frame`, whichever runtime runs it, so every row sees the same pixels."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.names = runtime.meta.names
        self.detections = 0

    def __call__(self, sources: list[str], conf: float, iou: float, max_det: int) -> list[Any]:
        from yolojet.tasks import Boxes, Results

        results: list[Any] = [None] * len(sources)
        frames, where = [], []
        for i, source in enumerate(sources):
            try:
                frames.append(load_frame(source))
                where.append(i)
            except YolojetError as e:
                results[i] = Results(names=self.names, path=str(source), error=str(e))
        found = self.runtime.predict(frames, conf, iou, max_det) if frames else []
        for i, frame, (xyxy, scores, cls) in zip(where, frames, found, strict=True):
            data = np.concatenate(
                [
                    np.asarray(xyxy, np.float32).reshape(-1, 4),
                    np.asarray(scores, np.float32)[:, None],
                    np.asarray(cls, np.float32)[:, None],
                ],
                1,
            )
            self.detections += len(data)
            results[i] = Results(
                names=self.names, orig_shape=frame.shape, boxes=Boxes(data, frame.shape), path=frame.path
            )
        return results


# -- the report -------------------------------------------------------------------------------------------------


@dataclass
class Row:
    runtime: str
    label: str
    precision: str
    device: str
    latency_ms: dict[int, float]  # batch size -> median ms for the whole batch
    big_batch: int
    scores: CocoScores
    detections: int

    @property
    def ms_per_img_batch1(self) -> float:
        return self.latency_ms[1]

    @property
    def img_per_s(self) -> float:
        return self.big_batch * 1000 / self.latency_ms[self.big_batch]

    def to_json(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime,
            "label": self.label,
            "precision": self.precision,
            "device": self.device,
            "ms_per_img_batch1": self.ms_per_img_batch1,
            "big_batch": self.big_batch,
            "img_per_s_big_batch": self.img_per_s,
            "mAP50-95": self.scores.map50_95,
            "mAP50": self.scores.map50,
            "mAP75": self.scores.map75,
            "AR100": self.scores.ar100,
            "detections": self.detections,
            "latency_ms": {str(b): ms for b, ms in sorted(self.latency_ms.items())},
        }


@dataclass
class ModelReport:
    model: str
    imgsz: tuple[int, int]
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class Report:
    data: str
    images: int
    device: str
    big_batch: int
    iters: int
    warmup: int
    batches: list[int]
    models: list[ModelReport] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "data": self.data,
            "images": self.images,
            "device": self.device,
            "big_batch": self.big_batch,
            "iters": self.iters,
            "warmup": self.warmup,
            "batches": self.batches,
            "accuracy": {"evaluator": "pycocotools bbox", "inputs": SAME_INPUTS, **VAL_OPTIONS},
            "timing": {
                "covers": "decoded frames in host memory -> boxes in original pixels in host memory "
                "(letterbox, network, post-processing)",
                "statistic": "median wall clock",
                **TIMING_OPTIONS,
            },
            "notes": self.notes,
            "models": [
                {"model": m.model, "imgsz": list(m.imgsz), "rows": [r.to_json() for r in m.rows], "notes": m.notes}
                for m in self.models
            ],
        }

    def tables(self) -> str:
        """One markdown table per model, with its notes."""
        parts = []
        for m in self.models:
            header = ("runtime", "ms/img batch 1", f"img/s at batch {self.big_batch}", "mAP50-95", "mAP50")
            rows = [
                (
                    r.label,
                    f"{r.ms_per_img_batch1:.2f}",
                    f"{r.img_per_s:,.1f}",
                    f"{r.scores.map50_95:.4f}",
                    f"{r.scores.map50:.4f}",
                )
                for r in m.rows
            ]
            size = f"{m.imgsz[0]}x{m.imgsz[1]}, every image letterboxed to it"
            text = f"### {m.model} ({size})\n\n" + markdown_table(rows, header)
            if m.notes:
                text += "\n\n" + "\n".join(f"- {n}" for n in m.notes)
            parts.append(text)
        if self.notes:
            parts.append("\n".join(f"- {n}" for n in self.notes))
        return "\n\n".join(parts) + "\n"

    def to_markdown(self) -> str:
        lines = [
            "# yolojet report",
            "",
            f"- data: {self.data} ({self.images} images)",
            f"- device: {self.device}",
            f"- accuracy: pycocotools bbox at conf {VAL_OPTIONS['conf']}, iou {VAL_OPTIONS['iou']}, "
            f"max_det {VAL_OPTIONS['max_det']}, the same evaluator for every runtime, {SAME_INPUTS}",
            f"- timing: decoded frames in host memory to boxes in host memory (letterbox, network, post-processing "
            f"at conf {TIMING_OPTIONS['conf']}), median of {self.iters} runs after {self.warmup} warm-up",
            "",
        ]
        return "\n".join(lines) + "\n" + self.tables()

    def plot_png(self) -> bytes:
        """Latency per batch against batch size, one line per runtime, one panel per model (matplotlib, Agg)."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        panels = max(1, len(self.models))
        columns = min(panels, 3)
        lines = math.ceil(panels / columns)
        figure = Figure(figsize=(5.5 * columns, 4.2 * lines), dpi=110)
        FigureCanvasAgg(figure)
        for i, m in enumerate(self.models):
            axes = figure.add_subplot(lines, columns, i + 1)
            for row in m.rows:
                batches = sorted(row.latency_ms)
                axes.plot(batches, [row.latency_ms[b] for b in batches], marker="o", label=row.label)
            axes.set_xscale("log", base=2)
            axes.set_yscale("log")
            axes.set_xticks(self.batches, [str(b) for b in self.batches])
            axes.set_xlabel("batch size")
            axes.set_ylabel("ms per batch (median)")
            axes.set_title(f"{Path(m.model).name} {m.imgsz[0]}x{m.imgsz[1]} ({self.device})", fontsize=9)
            axes.grid(True, which="both", alpha=0.3)
            if m.rows:
                axes.legend(fontsize=8)
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png")
        return buffer.getvalue()


def markdown_table(rows: Sequence[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    rule = ["-" * w if i == 0 else "-" * (w - 1) + ":" for i, w in enumerate(widths)]

    def line(cells: tuple[str, ...] | list[str]) -> str:
        return (
            "| "
            + " | ".join(
                f"{c:<{w}}" if i == 0 else f"{c:>{w}}" for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )
            + " |"
        )

    return "\n".join([line(header), line(rule), *(line(r) for r in rows)])


def batch_sizes(big_batch: int) -> list[int]:
    """1, 2, 4, ... below `big_batch`, then `big_batch`."""
    sizes, b = [], 1
    while b < big_batch:
        sizes.append(b)
        b *= 2
    return [*sizes, big_batch]


# -- building the runtimes --------------------------------------------------------------------------------------


def _device_label(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (no CUDA GPU)"


def _ultralytics_checkpoint(model_dir: Path, meta: ModelMeta) -> tuple[str | None, str | None]:
    """The checkpoint a model directory was exported from, or None and why it cannot be used."""
    if meta.random_weights:
        return None, (
            f"no PyTorch or ONNX Runtime rows: {model_dir} was exported from the architecture "
            f"{meta.source} with random weights, which cannot be rebuilt; pass that .yaml (or a .pt) "
            "to `report` instead, so that every runtime runs the same weights"
        )
    if meta.source:
        source = Path(meta.source)
        for candidate in (source, model_dir.parent / source.name):
            if candidate.suffix.lower() == ".pt" and candidate.is_file():
                return str(candidate), None
    return None, (
        f"no PyTorch or ONNX Runtime rows: {model_dir} was exported from "
        f"{meta.source or 'an unknown source'}, not a checkpoint file found here; pass the .pt to compare "
        "with PyTorch"
    )


def _mismatch(ours: torch.Tensor, ref: torch.Tensor, end2end: bool) -> float:
    """max |ours − ref| / max |ref|; for the one-to-one head's ranked rows, on the ranked scores (ties may swap)."""
    ours, ref = ours.detach().float().cpu(), ref.detach().float().cpu()
    if ours.shape != ref.shape:
        return math.inf
    if end2end:
        ours, ref = ours[..., 4].sort(-1, descending=True)[0], ref[..., 4].sort(-1, descending=True)[0]
    error = float((ours - ref).abs().max() / ref.abs().max().clamp_min(1e-12))
    return math.inf if math.isnan(error) else error


def _prepare_module(module: torch.nn.Module, meta: ModelMeta) -> torch.nn.Module:
    """The ultralytics model as its predict runs it: eval, float32, the model directory's head mode, BatchNorm fused."""
    # Any: `end2end` and `fuse` are the ultralytics model's own, which nn.Module's typing (Tensor | Module) lacks
    prepared: Any = copy.deepcopy(module).float().eval().cpu()
    if bool(getattr(prepared, "end2end", False)) != meta.end2end and hasattr(prepared, "end2end"):
        prepared.end2end = meta.end2end
    if hasattr(prepared, "fuse"):
        prepared = prepared.fuse(verbose=False)
    return prepared


def _onnx_session(module: torch.nn.Module, meta: ModelMeta, device: torch.device, workdir: Path) -> tuple[Any, str]:
    """ultralytics' ONNX export of the model (fp32, dynamic batch) in an ONNX Runtime session, and its provider."""
    import onnxruntime as ort

    from yolojet.export.onnx import export_onnx

    path = export_onnx(module, meta, workdir)
    providers = ["CPUExecutionProvider"]
    if device.type == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
        providers.insert(0, "CUDAExecutionProvider")
    session = ort.InferenceSession(str(path), providers=providers)
    return session, session.get_providers()[0]


def _score(runtime: Runtime, dataset: Dataset, batch: int, progress: bool) -> tuple[CocoScores, int]:
    view = _ValidateView(runtime)
    result = validate(view, dataset, batch=batch, progress=progress, boxes_only=True, protocol="predict", **VAL_OPTIONS)
    assert isinstance(result.scores, CocoScores)  # boxes_only: scored as boxes, never with the OBB metric
    return result.scores, view.detections


def _measure(
    runtime: Runtime, dataset: Dataset, sample: list[Frame], batches: list[int], iters: int, warmup: int, progress: bool
) -> Row:
    big = batches[-1]
    _log(f"{runtime.label}: accuracy on {len(dataset.images)} images")
    scores, detections = _score(runtime, dataset, min(big, VAL_BATCH), progress)
    runtime.sample = sample
    latency = {}
    for b in batches:
        latency[b] = runtime.time_batch(b, iters, warmup)
        _log(f"{runtime.label}: batch {b}: {latency[b]:.2f} ms")
    return Row(runtime.name, runtime.label, runtime.precision, str(runtime.device), latency, big, scores, detections)


def _sample_frames(dataset: Dataset, count: int, device: torch.device) -> list[Frame]:
    """The fixed timing input: the first `count` dataset images (cycled), decoded once; pinned for a GPU."""
    decoded: list[Frame] = []
    for image in dataset.images[: min(count, len(dataset.images))]:
        frame = load_frame(image.path)
        if device.type == "cuda":
            frame = Frame(frame.pixels.pin_memory(), frame.bgr, frame.path)
        decoded.append(frame)
    return [decoded[i % len(decoded)] for i in range(count)]


RUNTIME_ORDER = ("yolojet-fp16", "yolojet-fp32", "pytorch-fp16", "pytorch-fp32", "onnxruntime")


def _resolve(model: str | Path, imgsz: int | tuple[int, int] | None, workdir: Path) -> tuple[Any, Any, Any, Any]:
    """(what Engine.load takes, the ultralytics model if already built, its checkpoint, why there is none)."""
    path = Path(model)
    if (path / GRAPH_FILE).is_file():
        checkpoint, why_not = _ultralytics_checkpoint(path, Graph.load(path).meta)
        return path, None, checkpoint, why_not
    if path.suffix.lower() in (".yaml", ".yml"):
        # Random weights: build them once and export that very model, so that every runtime runs the same weights.
        from yolojet.export import export
        from yolojet.export.loader import load_model

        module = load_model(str(model)).model
        directory = export(copy.deepcopy(module), out=workdir / "model", imgsz=imgsz if imgsz is not None else 640)
        return directory, module, None, None
    return model, None, str(model), None


def report_model(
    model: str | Path,
    dataset: Dataset,
    device: torch.device,
    imgsz: int | tuple[int, int] | None,
    batches: list[int],
    iters: int,
    warmup: int,
    progress: bool = False,
    with_onnx: bool = True,
) -> ModelReport:
    """Every runtime that can run here on one model: built, scored, timed and released one after the other."""
    from yolojet.engine.engine import Engine

    cuda = device.type == "cuda"
    big = batches[-1]
    rows: list[Row] = []
    notes: list[str] = []

    def measure(runtime: Runtime) -> None:
        try:
            rows.append(_measure(runtime, dataset, sample, batches, iters, warmup, progress))
        finally:
            runtime.close()

    with tempfile.TemporaryDirectory(prefix="yolojet-report-") as tmp:
        workdir = Path(tmp)
        source, module, checkpoint, why_not = _resolve(model, imgsz, workdir)
        backend = None if cuda else "reference"  # Triton's CPU interpreter would take minutes an image

        # fp16 first where there is a GPU; the reference executor (no GPU) is float32 only. Square inputs (rect=False)
        # for every runtime, so that all of them see the same tensors.
        first = Engine.load(source, device=device, half=cuda, max_batch=big, imgsz=imgsz, backend=backend, rect=False)
        graph = first.graph
        meta = graph.meta
        if meta.task != "detect":
            raise EngineConfigError(f"{model}: a {meta.task} model; `report` compares detection models' boxes")
        sample = _sample_frames(dataset, big, device)
        if cuda:
            measure(YolojetRuntime(first, "fp16", "yolojet-fp16"))
            del first
            measure(
                YolojetRuntime(
                    Engine.load(source, device=device, half=False, max_batch=big, imgsz=imgsz, rect=False),
                    "fp32",
                    "yolojet-fp32",
                )
            )
        else:
            measure(YolojetRuntime(first, "fp32", "yolojet-fp32 (reference, cpu)"))
            del first

        # PyTorch eager and ONNX Runtime: the ultralytics model from the same checkpoint or architecture.
        if why_not is not None:
            notes.append(why_not)
        else:
            if module is None:
                from yolojet.export.loader import load_model

                module = load_model(checkpoint).model
            module = _prepare_module(module, meta)
            check = letterboxed(sample[:1], meta.imgsz, device)[0]
            reference = _first(_reference(graph, device)(check))
            fp32 = TorchRuntime(module, meta, device, half=False, label="pytorch-fp32" + ("" if cuda else " (cpu)"))
            error = _mismatch(fp32.raw(check), reference, meta.end2end)
            if error > SOURCE_TOLERANCE:
                fp32.close()
                notes.append(
                    f"no PyTorch or ONNX Runtime rows: the ultralytics model from {checkpoint} differs "
                    f"from the exported model by {error:.2e} (relative): not the weights it was exported "
                    "from"
                )
            else:
                measure(fp32)
                if cuda:
                    measure(TorchRuntime(module, meta, device, half=True, label="pytorch-fp16"))
                if with_onnx:
                    onnx, note = _onnx_runtime(module, meta, device, workdir, check, reference)
                    if onnx is not None:
                        measure(onnx)
                    if note:
                        notes.append(note)
    rows.sort(key=lambda r: RUNTIME_ORDER.index(r.runtime))
    return ModelReport(str(model), (int(meta.imgsz[0]), int(meta.imgsz[1])), rows, notes)


def _reference(graph: Graph, device: torch.device) -> Callable[[torch.Tensor], Any]:
    from yolojet.reference.executor import ReferenceExecutor

    return ReferenceExecutor(graph, device)


def _onnx_runtime(
    module: torch.nn.Module,
    meta: ModelMeta,
    device: torch.device,
    workdir: Path,
    check: torch.Tensor,
    reference: torch.Tensor,
) -> tuple[OnnxRuntime | None, str | None]:
    """ONNX Runtime on the model where its export runs and agrees with the exported model; else None and why not."""
    try:
        session, provider = _onnx_session(module, meta, device, workdir)
        short = provider.replace("ExecutionProvider", "").lower()
        runtime = OnnxRuntime(session, meta, device, f"onnxruntime ({short}, fp32)")
        error = _mismatch(runtime.raw(check), reference, meta.end2end)
    except Exception as e:  # an optional row: whatever the export or the session raises, the report goes on
        return None, f"no ONNX Runtime row: the ONNX export or session failed ({type(e).__name__}: {e})"
    if error > SOURCE_TOLERANCE:
        runtime.close()
        return None, f"no ONNX Runtime row: its output differs from the exported model's by {error:.2e} (relative)"
    return runtime, None


def onnx_unavailable() -> str | None:
    """Why there can be no ONNX Runtime row here (onnxruntime, or onnx for ultralytics' export, missing), or None."""
    from importlib.util import find_spec

    if find_spec("onnxruntime") is None:
        return "onnxruntime is not installed: no ONNX Runtime rows"
    if find_spec("onnx") is None:
        return "no ONNX Runtime rows: onnxruntime is installed but onnx, which ultralytics' ONNX export needs, is not"
    return None


def run_report(
    models: list[str | Path],
    data: str | Path,
    images: str | Path | None = None,
    imgsz: int | tuple[int, int] | None = None,
    big_batch: int | None = None,
    iters: int | None = None,
    device: str | torch.device | None = None,
    progress: bool = False,
) -> Report:
    """Score and time every runtime on every model; nothing is written."""
    dataset = load_dataset(data, images)
    if not dataset.images:
        raise EngineConfigError(f"{data}: the dataset has no images")
    for model in models:  # before any work: a late refusal would throw away the models already measured
        task = resolve_graph(model, imgsz).meta.task
        if task != "detect":
            raise EngineConfigError(f"{model}: a {task} model; `report` compares detection models' boxes")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    big = big_batch if big_batch is not None else DEFAULT_BIG_BATCH[device.type]
    iters = iters if iters is not None else DEFAULT_ITERS[device.type]
    if big < 1:
        raise EngineConfigError(f"big batch {big}: must be at least 1")
    if iters < 1:
        raise EngineConfigError(f"iters {iters}: must be at least 1")
    warmup = max(2, min(10, iters // 5))  # the first runs pay one-time setup
    batches = batch_sizes(big)
    why_no_onnx = onnx_unavailable()
    report = Report(str(data), len(dataset.images), _device_label(device), big, iters, warmup, batches)
    if device.type == "cuda":
        report.notes.append(
            f"PyTorch runs with torch's defaults (cuDNN TF32 convolutions allowed: {torch.backends.cudnn.allow_tf32})"
        )
    else:
        report.notes.append(
            "no CUDA GPU: yolojet runs its float32 reference executor on the CPU, and the fp16 rows "
            "(yolojet and PyTorch) are left out"
        )
    if why_no_onnx is not None:
        report.notes.append(why_no_onnx)
    for model in models:
        _log(f"{model}")
        report.models.append(
            report_model(model, dataset, device, imgsz, batches, iters, warmup, progress, with_onnx=why_no_onnx is None)
        )
    return report


REPORT_FILES = ("report.json", "report.md", "latency.png")  # what `yolojet report --out DIR` writes into DIR


def report_files(report: Report) -> dict[str, Callable[[Path], object]]:
    """report.json, report.md and latency.png, each as a writer of its finished content (all rendered first)."""
    text = json.dumps(report.to_json(), indent=1)
    markdown = report.to_markdown()
    png = report.plot_png()
    writers: tuple[Callable[[Path], object], ...] = (
        lambda p: p.write_text(text),
        lambda p: p.write_text(markdown),
        lambda p: p.write_bytes(png),
    )
    return dict(zip(REPORT_FILES, writers, strict=True))
