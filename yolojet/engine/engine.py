"""The public engine: images in, results out, on our kernels where there is a GPU.

`Engine.load` resolves the model, then builds the network on our Triton kernels (a CUDA device, or the CPU under
TRITON_INTERPRET=1) or, on a machine without a GPU, on the float32 reference executor with a one-line notice, and
picks the decoder (yolojet/images/decoders.py). `engine(images)` and `engine.stream(images)` run the whole predict
path — decode, letterbox, network, decode of the head, NMS (or the YOLO26 one-to-one selection), boxes back to
original pixels — and give one `Results` per image in input order; an image that cannot be read gets a `Results`
carrying its error, and the others are still detected. Over many images, files are read and decoded on threads of
their own (engine/feed.py) while the GPU runs the batch before, and a batch is launched before the results of the one
before it are read. `engine.raw(x)` returns the raw head outputs.

One engine may be shared by threads: every call that runs a batch holds the engine's lock while it stages, launches
or collects one, so each caller gets its own results. The low-latency trio (`preprocess`, `run`, `get`) keeps its
staged frames in the engine itself: use it from one thread at a time.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import cache, partial
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from yolojet.engine.cuda_calls import CurrentStream
from yolojet.engine.feed import FedBatch, FrameFeed, to_device
from yolojet.engine.models import resolve_graph
from yolojet.engine.network import FamilyProfile, TritonNetwork
from yolojet.engine.predict_path import PARITIES, PredictOptions, PredictPath, predict_path
from yolojet.errors import EngineConfigError, ImageReadError
from yolojet.geometry import Letterbox, rect_letterbox
from yolojet.images import DEFAULT_MAX_PIXELS, Frame, is_encoded
from yolojet.images.codecs import decoded_size
from yolojet.images.decoders import DecodedBatch, Decoder, Encoded, make_decoder
from yolojet.images.frames import frame_from_pixels
from yolojet.images.sources import is_url
from yolojet.ir import Graph, ModelMeta
from yolojet.options import EngineOptions, interpreting
from yolojet.reference import pipeline as torch_pipeline
from yolojet.reference.executor import ReferenceExecutor
from yolojet.tasks import Boxes, Results
from yolojet.timing import Timing, time_calls

TASKS_WITH_BOXES = ("detect", "segment", "pose", "obb")


def _timed(fn: Any, *args: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    return fn(*args), time.perf_counter() - start


def _close_when_started(starting: Future) -> None:
    """Close a decoder that was being started for a load that failed (its start's own error is the lesser one)."""
    try:
        starting.result()[0].close()
    except Exception:
        pass


def _device(device: str | torch.device | None) -> torch.device:
    """The device asked for (a CUDA GPU where there is one by default), checked to exist, a GPU always with its
    index: frames compare their device with it, and `cuda:0 == cuda` is False in torch."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise EngineConfigError(f"device {device!r}: expected 'cuda', 'cuda:N' or 'cpu'") from e
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise EngineConfigError(f"device {device}: no CUDA GPU is visible here; use device='cpu'")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise EngineConfigError(f"device {device}: this machine has {torch.cuda.device_count()} CUDA GPU(s)")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    elif device.type != "cpu":
        raise EngineConfigError(f"device {device}: yolojet runs on 'cuda' or 'cpu'")
    return device


def _image_size(imgsz: object) -> int | tuple[int, int]:
    """An int, or an (h, w) pair of ints, each at least 1."""
    values: list[Any] = list(imgsz) if isinstance(imgsz, (tuple, list)) else [imgsz]
    if len(values) not in (1, 2) or any(
        isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1 for v in values
    ):
        raise EngineConfigError(f"imgsz {imgsz!r}: expected a positive int or an (h, w) pair of them")
    if not isinstance(imgsz, (tuple, list)):
        return int(values[0])
    return int(values[0]), int(values[-1])  # a one-element list is a square


# The largest batch an engine is built for: each slot holds a frame and a plan's share of memory, and yolo11n's 64 run
# at 17,000 img/s on an H200 already (README); past this a typo (10**9) would exhaust memory before any check said so.
MAX_BATCH = 4096


def _count(name: str, value: object) -> int:
    """An int of at least 1, or an error naming the option."""
    if not _integral(value) or value < 1:  # type: ignore[operator]
        raise EngineConfigError(f"{name} {value!r}: expected an int of at least 1")
    return int(value)  # type: ignore[call-overload]


def _integral(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def _real(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating))


def check_options(options: PredictOptions, nc: int, capacity: int) -> PredictOptions:
    """The options checked (each error names the option and what it takes), with a lone class id as a tuple."""
    for name in ("conf", "iou"):
        value = getattr(options, name)
        if not _real(value) or not 0 <= value <= 1:
            raise EngineConfigError(f"{name} {value!r}: expected a number in [0, 1]")
    if not _integral(options.max_det) or not 1 <= options.max_det <= capacity:
        raise EngineConfigError(f"max_det {options.max_det!r}: expected an int in 1..{capacity}")
    classes = None
    if options.classes is not None:
        asked: Any = options.classes
        asked = [asked] if _integral(asked) else asked  # one class id, as ultralytics takes it
        if isinstance(asked, (str, bytes)) or not isinstance(asked, Sequence | np.ndarray):
            raise EngineConfigError(f"classes {asked!r}: expected a class id or a list of them")
        wrong = [c for c in asked if not _integral(c) or not 0 <= c < nc]
        if wrong:  # the wrong ones only, and a few: a reply's error travels in gRPC metadata (16 KiB at most)
            shown = ", ".join(repr(c) for c in wrong[:8]) + (f" and {len(wrong) - 8} more" if len(wrong) > 8 else "")
            raise EngineConfigError(f"classes {shown}: class ids are ints from 0 to {nc - 1}")
        classes = tuple(int(c) for c in asked)
    return replace(
        options,
        conf=float(options.conf),
        iou=float(options.iou),
        max_det=int(options.max_det),
        classes=classes,
        agnostic=bool(options.agnostic),
        retina_masks=bool(options.retina_masks),
    )


@dataclass
class _Part:
    """One input shape's share of a batch on the GPU path: the path of that shape, the batch's slots it holds, the
    parity of the pinned buffers it uses, and its task outputs once collected."""

    path: PredictPath
    slots: list[int]
    parity: int
    found: list[dict[str, Any]] | None = None


@dataclass
class _Run:
    """A batch handed to the engine: its frames (kept alive until collected), its parts (one a letterbox shape), and,
    once collected, each frame's task outputs on the host."""

    frames: list[Frame]
    parts: list[_Part] = field(default_factory=list)
    found: list[dict[str, Any]] | None = None


@dataclass
class _Staged:
    """A frame staged in a slot of the low-latency trio, what the caller gave for it, and the stream on which it is
    ready (the caller's when it was staged; None off CUDA)."""

    frame: Frame
    source: Any
    stream: torch.cuda.Stream | None = None


def _selected(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """`device` as the current device for the block where it is a GPU."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


class _DeviceLock:
    """The engine's lock (re-entrant), which also makes the engine's GPU the current device while it is held. Triton
    launches on the current device, CUDA events record on its stream, and an engine on `cuda:1` in a process whose
    current device is `cuda:0` (a worker of `--devices 0,1`, an API user's second GPU) would otherwise launch its
    eager runs and tuning on the wrong GPU and wait on the wrong stream for its results."""

    def __init__(self, device: torch.device) -> None:
        self._lock = threading.RLock()
        self._gpu = (
            None if device.type != "cuda" else device.index if device.index is not None else torch.cuda.current_device()
        )
        self._previous: list[int] = []  # the devices current before the holder's nested entries (one thread holds it)

    # The calls `torch.cuda.device` makes, without building one at each entry (1.6 us; the trio enters four times a
    # frame).
    def __enter__(self) -> None:
        self._lock.acquire()
        if self._gpu is not None:
            try:
                self._previous.append(torch.cuda._exchange_device(self._gpu))
            except BaseException:
                self._lock.release()
                raise

    def __exit__(self, *exc: object) -> None:
        try:
            if self._gpu is not None:
                torch.cuda._maybe_exchange_device(self._previous.pop())
        finally:
            self._lock.release()


class Engine:
    """A model ready to run. Build with `Engine.load`."""

    def __init__(
        self,
        network: TritonNetwork | ReferenceExecutor,
        max_batch: int,
        decoder: Decoder | None = None,
        rect: bool = True,
        max_shapes: int = 4,
        verbose: bool = False,
    ) -> None:
        self.network = network
        self.max_batch = max_batch
        self.device = network.device
        self.decoder = decoder if decoder is not None else make_decoder("cpu", self.device)
        self._path: PredictPath | None = predict_path(network) if isinstance(network, TritonNetwork) else None
        # rect: each image letterboxed to its own rectangle, as ultralytics' predict does (classification crops).
        self.rect = bool(rect) and self.meta.task != "classify"
        self.max_shapes = _count("max_shapes", max_shapes)
        self.verbose = verbose
        # The paths of rectangles other than the model's own input, least recently used first.
        self._shapes: OrderedDict[tuple[int, int], PredictPath] = OrderedDict()
        self._lock = _DeviceLock(self.device)
        self._current_stream = CurrentStream(self.device) if self.device.type == "cuda" else None
        self._closed = False
        self._in_flight: list[_Part] = []
        self._last_launch: tuple[torch.cuda.Event, torch.cuda.Stream] | None = None  # its end, and where it ran
        # The low-latency trio's state: each slot's staged frame, and the run that has found its results.
        self._staged: list[_Staged | None] = [None] * max_batch
        self._ran: list[_Run | None] = [None] * max_batch
        # Each slot's own buffer for frames staged from the device, and the stream of the last run that read it.
        self._slot_copies: list[torch.Tensor | None] = [None] * max_batch
        self._slot_read_on: list[torch.cuda.Stream | None] = [None] * max_batch
        self._options = PredictOptions()

    @classmethod
    def load(
        cls,
        model: str | Path,
        device: str | torch.device | None = None,
        half: bool = True,
        max_batch: int = 1,
        imgsz: int | tuple[int, int] | None = None,
        backend: str | None = None,
        tune: bool | None = None,
        fuse: bool = True,
        verbose: bool = False,
        buckets: list[int] | None = None,
        pdl: bool | None = None,
        branches: bool | None = None,
        switches: EngineOptions | None = None,
        decoder: str = "auto",
        max_pixels: int = DEFAULT_MAX_PIXELS,
        rect: bool = True,
        shapes: Sequence[tuple[int, int]] = (),
        max_shapes: int = 4,
        shapes_for: Sequence[str | Path | bytes] = (),
    ) -> Engine:
        """Load a model directory, `.pt`, ultralytics name or `.yaml` (exported on first use and cached).

        backend "triton" runs our kernels (a CUDA device, or the CPU when TRITON_INTERPRET=1); "reference"
        the float32 torch executor. The default is "triton" where it can run, else "reference" with a notice.
        `tune=None` tunes conv tiles unless YOLOJET_NOTUNE=1. `buckets` overrides the batch sizes a CUDA
        graph is captured for (default 1, 2, 4, ..., max_batch). `pdl=None` launches the network's kernels with
        programmatic dependent launch where the GPU supports it (Hopper and later) unless YOLOJET_PDL=0.
        `branches=None` runs independent launches, such as the head's per-level chains, on parallel streams inside
        the captured graph on a CUDA device unless YOLOJET_BRANCHES=0; `branches=False` runs them in order.
        `switches` gives these four as one `EngineOptions` (the fronts' way); a keyword beside it that differs
        from its default wins.
        `decoder` decodes files and bytes: "auto" (the GPU's hardware JPEG decoders through nvJPEG where there are
        some, else CPU threads), "hardware", "nvimgcodec", "cpu" or "nvjpeg" (yolojet/images/decoders.py); an image
        of more than `max_pixels` pixels is an error rather than a decode.
        `rect=True` (ultralytics' predict's default) letterboxes each image to
        the smallest rectangle of stride multiples that holds it scaled to imgsz (640x480 for a 4:3 photo), running
        the network built for that rectangle from the same model; `rect=False` letterboxes every image to the square
        imgsz. Networks of up to `max_shapes` rectangles are kept (least recently used dropped); `shapes` lists
        rectangles (h, w) to build at load, so that their first images wait for nothing; `shapes_for` names images
        like those to come (a labeler's first files, a sample of a folder): the rectangles their headers call for
        are built at load too, the most common first (nothing is decoded; one that cannot be read is passed over).
        """
        if not isinstance(model, (str, os.PathLike)):
            raise EngineConfigError(
                f"model {model!r}: expected the path or name of a model directory, .pt checkpoint or .yaml architecture"
            )
        if switches is not None and not isinstance(switches, EngineOptions):
            raise EngineConfigError(f"switches {switches!r}: expected an EngineOptions (yolojet.options)")
        if isinstance(shapes, (str, bytes)) or not isinstance(shapes, Iterable):
            raise EngineConfigError(f"shapes {shapes!r}: expected a list of (height, width) pairs")
        device = _device(device)
        switches = (switches or EngineOptions()).overridden(tune=tune, fuse=fuse, pdl=pdl, branches=branches)
        max_batch, max_shapes = _count("max_batch", max_batch), _count("max_shapes", max_shapes)
        if max_batch > MAX_BATCH:
            raise EngineConfigError(f"max_batch {max_batch}: at most {MAX_BATCH:,} images a batch")
        if imgsz is not None:
            imgsz = _image_size(imgsz)
        triton_possible = device.type == "cuda" or (device.type == "cpu" and interpreting())
        chose_reference = backend is None and not triton_possible  # said once the model loads, not before its errors
        if backend is None:
            backend = "triton" if triton_possible else "reference"
        if backend not in ("triton", "reference"):
            raise EngineConfigError(f"backend {backend!r}: expected 'triton' or 'reference'")
        if backend == "triton" and not triton_possible:
            raise EngineConfigError(
                f"the triton backend runs on a CUDA device, not {device}; on the CPU set TRITON_INTERPRET=1 "
                "(slow, for tests) or use backend='reference'"
            )
        # The decoder starts on a thread of its own while the network is built: a GPU decoder's start (its library,
        # the hardware's resources, a probe decode) takes seconds, mostly outside Python.
        with ThreadPoolExecutor(1, thread_name_prefix="yolojet-decoder-start") as starter:
            starting = starter.submit(_timed, make_decoder, decoder, device, max_pixels)
            try:
                graph = resolve_graph(model, imgsz)
                if backend == "reference":
                    network: TritonNetwork | ReferenceExecutor = ReferenceExecutor(graph, device)
                else:
                    with _selected(device):  # its tuning and captures launch on the current device
                        network = TritonNetwork(
                            graph,
                            device,
                            half=half,
                            max_batch=max_batch,
                            options=switches,
                            verbose=verbose,
                            buckets=buckets,
                        )
            except BaseException:
                _close_when_started(starting)
                raise
            chosen, decoder_seconds = starting.result()
        if chose_reference:
            why = "" if torch.cuda.is_available() else "; no CUDA GPU here"
            print(f"yolojet: running the float32 reference executor on the CPU (slow{why})", file=sys.stderr)
        if isinstance(network, TritonNetwork):
            network.startup_seconds["decoder"] = decoder_seconds  # on its own thread, beside the network's phases
        if verbose:
            print(f"yolojet: decoding with {chosen.describe()}", file=sys.stderr)
        built = [_image_size(shape) for shape in shapes]
        with _selected(device):
            engine = cls(network, max_batch, chosen, rect=rect, max_shapes=max(max_shapes, len(built)), verbose=verbose)
        try:
            if engine._path is not None:  # the reference runs any shape as it comes
                for shape in built:
                    engine.shape_path(shape)
                for shape in engine.rectangles_for(shapes_for):  # what room the listed shapes leave
                    if len(engine._shapes) >= engine.max_shapes:
                        break
                    engine.shape_path(shape)
        except BaseException:
            engine.close()
            raise
        if verbose:
            kept = f"rectangular, networks of up to {engine.max_shapes} shapes kept" if engine.rect else "square"
            print(f"yolojet: letterbox {kept}", file=sys.stderr)
        return engine

    def close(self) -> None:
        """Stop the decoder's threads (an engine left to the garbage collector stops them at exit); the engine
        takes no more images."""
        self._closed = True
        self.decoder.close()

    def _check_open(self) -> None:
        if self._closed:
            raise EngineConfigError("this engine is closed (close() or the end of its with block): load another")

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what the model is --------------------------------------------------------------------

    @property
    def graph(self) -> Graph:
        return self.network.graph

    @property
    def meta(self) -> ModelMeta:
        return self.network.graph.meta

    @property
    def names(self) -> dict[int, str]:
        return self.meta.names

    @property
    def backend(self) -> str:
        return "triton" if isinstance(self.network, TritonNetwork) else "reference"

    @property
    def capacity(self) -> int:
        """The most detections an image can keep (the largest max_det)."""
        return self._path.capacity if self._path is not None else 300

    @property
    def stride(self) -> int:
        return max(self.meta.strides or [32])

    def input_shape(self, frame: Frame) -> tuple[tuple[int, int], Letterbox | None]:
        """The network input an image runs at, and where it goes in it (None: fitted, centred)."""
        return self.input_shape_of(frame.shape)

    def input_shape_of(self, size: tuple[int, int]) -> tuple[tuple[int, int], Letterbox | None]:
        """`input_shape` of an image of `size` (height, width)."""
        if not self.rect:
            return tuple(self.meta.imgsz), None  # type: ignore[return-value]
        return rect_letterbox(size, tuple(self.meta.imgsz), self.stride)  # type: ignore[arg-type]

    def rectangles_for(self, images: Iterable[str | Path | bytes]) -> list[tuple[int, int]]:
        """The rectangles other than the model's own input that these encoded images run at, by their headers (none
        decoded, URLs not fetched; one that cannot be read is passed over, its error comes when it runs), the most
        common first."""
        if not self.rect:
            return []
        counts: Counter[tuple[int, int]] = Counter()
        for image in images:
            if isinstance(image, str) and is_url(image):
                continue  # not fetched twice for a hint
            try:
                data = _header(image) if isinstance(image, (str, Path)) else bytes(image)
                shape, _ = self.input_shape_of(decoded_size(data, "image"))
            except (ImageReadError, OSError, ValueError):
                continue
            counts[shape] += 1
        own = tuple(self.meta.imgsz)
        return [shape for shape, _ in counts.most_common() if shape != own]

    def _group_by_shape(
        self, frames: Sequence[Frame]
    ) -> tuple[OrderedDict[tuple[int, int], list[int]], list[Letterbox | None]]:
        """The batch's slots grouped by input shape (first seen first), and each frame's placement."""
        groups: OrderedDict[tuple[int, int], list[int]] = OrderedDict()
        placements: list[Letterbox | None] = []
        for slot, frame in enumerate(frames):
            shape, placement = self.input_shape(frame)
            groups.setdefault(shape, []).append(slot)
            placements.append(placement)
        return groups, placements

    def shapes(self) -> list[tuple[int, int]]:
        """The input shapes the engine has networks for: the model's own, then the rectangles, most recent last."""
        return [tuple(self.meta.imgsz), *self._shapes]  # type: ignore[list-item]

    def shape_path(self, shape: tuple[int, int] | int) -> PredictPath:
        """The predict path (and network) for an input shape, built on first use from the same model (shared
        weights and memory; tiles tuned, or from the cache); under the lock."""
        shape = (shape, shape) if isinstance(shape, int) else (int(shape[0]), int(shape[1]))
        if self._path is None:
            raise EngineConfigError("input shapes are networks of the triton backend; the reference runs any shape")
        if tuple(shape) == tuple(self.meta.imgsz):
            return self._path
        with self._lock:
            path = self._shapes.get(shape)
            if path is not None:
                self._shapes.move_to_end(shape)
                return path
            started = time.perf_counter()
            with self._network_work():  # its warm-up and captures run the activations
                network = self.network.sibling(*shape)  # type: ignore[union-attr]
            path = self._shapes[shape] = predict_path(network)
            if self.verbose:
                h, w = shape
                print(
                    f"yolojet: built the network for input {h}x{w} in {time.perf_counter() - started:.1f} s "
                    f"({len(self._shapes)} of {self.max_shapes} rectangles kept)",
                    file=sys.stderr,
                )
            while len(self._shapes) > self.max_shapes:
                oldest = next(iter(self._shapes))
                if any(part.path is self._shapes[oldest] for part in self._in_flight):
                    self._collect_parts(list(self._in_flight))
                del self._shapes[oldest]
            return path

    # -- raw network --------------------------------------------------------------------------

    def raw(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Raw head outputs for a float NCHW batch in [0, 1], in the reference executor's form. A detection model takes
        any input whose sides are multiples of its stride (on our kernels, the network of that shape: `shape_path`);
        a classifier its own input size."""
        if isinstance(self.network, TritonNetwork):
            with self._lock:
                network = self.network
                if x.ndim == 4 and tuple(x.shape[2:]) != tuple(self.meta.imgsz) and self.meta.task != "classify":
                    network = self.shape_path((int(x.shape[2]), int(x.shape[3]))).network
                with self._network_work():
                    return network.raw(x)
        return self.network(x.to(self.device))

    def dump(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        with self._lock, self._network_work():
            return self.network.dump(x)

    @contextlib.contextmanager
    def _network_work(self) -> Iterator[None]:
        """Work on the network outside a launched run (raw outputs, dumps, timings, the torch path, a new shape's
        build), under the lock: it writes the activations every run writes, so the runs in flight are collected first,
        and a run launched afterwards from another stream waits for this work (see `_launch`)."""
        self._collect_parts(list(self._in_flight))
        yield
        if self.device.type == "cuda":
            stream = torch.cuda.current_stream(self.device)
            done = torch.cuda.Event()
            done.record(stream)
            self._last_launch = (done, stream)

    # -- measuring (the CLI's profile, bench and pipeline commands, and bench/) ------------------

    def _kernel_network(self, shape: tuple[int, int] | None = None) -> TritonNetwork:
        if not isinstance(self.network, TritonNetwork):
            raise EngineConfigError(
                "timing the network needs the triton backend, on a CUDA device; this engine runs the reference executor"
            )
        return self.network if shape is None else self.shape_path(shape).network

    def time_network(
        self, batch: int = 1, repeats: int = 200, warmup: int = 20, shape: tuple[int, int] | None = None
    ) -> Timing:
        """The network alone at `batch` images, as replays of its captured graph (CUDA events), for the model's
        input shape or `shape`."""
        with self._lock:
            network = self._kernel_network(shape)
            with self._network_work():
                return network.time_replay(batch, repeats, warmup)

    def time_launches(self, batch: int = 1, repeats: int = 200, warmup: int = 20) -> Timing:
        """The network's launches one after another on the stream, outside a graph: what the graph saves."""
        with self._lock, self._network_work():
            launches = self._kernel_network().launch_list(batch)

            def launch_all() -> None:
                for launch in launches:
                    launch.run()

            return time_calls(launch_all, repeats, warmup, synchronize=partial(torch.cuda.synchronize, self.device))

    def launch_count(self, batch: int = 1) -> int:
        """Kernel launches of the network at `batch` images."""
        return len(self._kernel_network().launch_list(batch))

    def profile(self, batch: int = 1) -> list[FamilyProfile]:
        """Device time of each launch at `batch` images, timed alone and grouped by kernel family, costliest first."""
        with self._lock, self._network_work():
            return self._kernel_network().profile(batch)

    # -- options ------------------------------------------------------------------------------

    def configure(
        self,
        conf: float = 0.25,
        iou: float = 0.7,
        max_det: int = 300,
        classes: Sequence[int] | int | None = None,
        agnostic: bool = False,
        retina_masks: bool = False,
    ) -> None:
        """Set the options of later runs that set none of their own (nothing is captured again: the GPU path reads
        them on the device).

        conf, iou, max_det, classes and agnostic act as in ultralytics' predict; retina_masks builds segment
        masks at the original resolution. Classification ignores them all.
        """
        given = PredictOptions(conf, iou, max_det, classes, agnostic, retina_masks)  # type: ignore[arg-type]
        self._options = check_options(given, self.meta.nc, self.capacity)

    def _call_options(self, options: dict[str, Any]) -> PredictOptions:
        self._check_open()
        if "agnostic_nms" in options:  # ultralytics' name for it
            options["agnostic"] = options.pop("agnostic_nms")
        known = set(PredictOptions.__dataclass_fields__)
        unknown = sorted(set(options) - known)
        if unknown:
            raise EngineConfigError(f"unknown option(s) {', '.join(unknown)}: expected {', '.join(sorted(known))}")
        return check_options(replace(self._options, **options), self.meta.nc, self.capacity)

    def options(self, **options: Any) -> PredictOptions:
        """`configure`'s options with these over them, checked (ultralytics' names: `agnostic_nms` too)."""
        return self._call_options(dict(options))

    # -- a batch at a time, each image with its own options (a server's requests) -------------

    def submit(
        self,
        frames: Sequence[Frame],
        options: Sequence[PredictOptions] | PredictOptions | None = None,
        ready: Sequence[torch.cuda.Event] = (),
        sources: Sequence[Any] | None = None,
    ) -> Submitted:
        """Hand a batch of decoded frames (from this engine's decoder, at most `max_batch`) to the engine; returns at
        once on a GPU. `options`: one for all, or one per frame. Frames with different conf, max_det or classes run
        together with the loosest of them and each image's results are then narrowed to its own, which gives exactly
        what running it alone would (NMS keeps a box by the higher-scored boxes only, and classes are separate
        unless class-agnostic); iou, agnostic and retina_masks must be the same for every frame. `ready`: events
        the frames' decode recorded; `sources`: what each frame came from (for its `orig_img`)."""
        if not 1 <= len(frames) <= self.max_batch:
            raise EngineConfigError(f"submit({len(frames)} frames): this engine runs 1..{self.max_batch} a batch")
        each = [options or self._options] * len(frames) if not isinstance(options, Sequence) else list(options)
        if len(each) != len(frames):
            raise EngineConfigError(f"submit: {len(each)} options for {len(frames)} frames")
        merged = merge_options(each)
        with self._lock:
            run = self._submit(list(frames), merged, ready)
        return Submitted(self, run, each, merged, list(sources) if sources is not None else [None] * len(frames))

    # -- many images in, results out ----------------------------------------------------------

    def __call__(self, images: Any, **options: Any) -> list[Results]:
        """Results for one image or a list of them (paths, bytes, numpy BGR, PIL, torch tensors), in order.

        Options as `configure` (conf, iou, max_det, classes, agnostic, retina_masks) hold for this call; the
        others are the last `configure`'s (ultralytics' defaults unless configured). An image that cannot be read
        gets a `Results` whose `error` says why; the others are still detected.
        """
        sources = list(images) if isinstance(images, (list, tuple)) else [images]
        return list(self.stream(sources, **options))

    def stream(self, images: Iterable[Any], **options: Any) -> Iterator[Results]:
        """Results for every image of any iterable, in order, as they are ready: batches of up to `max_batch`, files
        read and decoded on other threads while the GPU runs the batch before. Options as `__call__`."""
        chosen = self._call_options(options)
        feed = FrameFeed(images, self.decoder, self.max_batch)
        pending: list[tuple[FedBatch, _Run | None, list[int]]] = []
        try:
            while (fed := feed.next_batch()) is not None:
                pending.append(self._submit_fed(fed, chosen))
                while len(pending) > 1 or (pending and not self._overlaps(chosen)):
                    yield from self._results_of(*pending[0])
                    feed.release(pending.pop(0)[0])  # run and made into results: its frames are read no more
            while pending:
                yield from self._results_of(*pending[0])
                feed.release(pending.pop(0)[0])
        finally:
            feed.close()
            for _, run, _ in pending:  # a stream given up early: its batches still release their buffers
                if run is not None:
                    with self._lock:
                        self._collect(run)

    def predict(self, source: Any, stream: bool = False, verbose: bool = False, **options: Any) -> Any:
        """ultralytics' `model.predict(source, conf=..., ...)`: a list of Results, or with `stream=True` a generator.

        `source` may also be a folder or a glob (their images, sorted), as ultralytics takes them. Options as
        `__call__` (conf, iou, max_det, classes, agnostic_nms, retina_masks); `imgsz` and `rect` may be given if they
        are the engine's (they are fixed when it is loaded); `verbose` prints each image's detections as
        ultralytics does. Options that save or show files (for `yolojet detect`), or that would change what was fixed
        at load (device, half), are refused by name where they ask for something; at values that ask for nothing
        (save=False, the engine's own device, a batch size) they are taken."""
        if "imgsz" in options:
            wanted = _image_size(options.pop("imgsz"))
            wanted = (wanted, wanted) if isinstance(wanted, int) else wanted
            if tuple(wanted) != tuple(self.meta.imgsz):
                raise EngineConfigError(
                    f"predict(imgsz={wanted}): this engine was loaded for {self.meta.imgsz}; give imgsz to Engine.load"
                )
        if "rect" in options and bool(options.pop("rect")) != self.rect:
            raise EngineConfigError(
                f"predict(rect=...): this engine was loaded with rect={self.rect}; give rect to Engine.load"
            )
        # ultralytics-style code often passes an option at the value that asks for nothing (save=False, the
        # engine's own device or precision, a batch size): taken as said and dropped.
        for name in [n for n in options if n in PREDICT_AT_LOAD or n in PREDICT_OUTPUTS or n in PREDICT_UNSUPPORTED]:
            if not self._asks_otherwise(name, options[name]):
                options.pop(name)
        at_load = sorted(set(options) & set(PREDICT_AT_LOAD))
        if at_load:
            given = ", ".join(f"{PREDICT_AT_LOAD[name]}=" for name in at_load)
            raise EngineConfigError(
                f"predict({', '.join(at_load)}=...): fixed when the engine is loaded; give {given} to Engine.load"
            )
        outputs = sorted(set(options) & PREDICT_OUTPUTS)
        if outputs:
            raise EngineConfigError(
                f"predict({', '.join(outputs)}=...): files are written by `yolojet detect` (--save, --json), or from "
                "the results (`result.plot()`, `result.summary()`); not an option of predict here"
            )
        unsupported = sorted(set(options) & PREDICT_UNSUPPORTED)
        if unsupported:
            raise EngineConfigError(f"predict({', '.join(unsupported)}=...): not supported by yolojet")
        if isinstance(source, (str, Path)) and not is_url(str(source)):
            from yolojet.images import expand_sources

            sources: list[Any] = expand_sources([str(source)])
        else:
            sources = list(source) if isinstance(source, (list, tuple)) else [source]
        results = self.stream(sources, **options)
        if verbose:
            results = _printed(results)
        return results if stream else list(results)

    def _overlaps(self, options: PredictOptions) -> bool:
        """Whether a batch may be launched before the one before it is collected."""
        return self._on_path(options) and self._path.depth > 1  # type: ignore[union-attr]

    def _submit_fed(self, fed: FedBatch, options: PredictOptions) -> tuple[FedBatch, _Run | None, list[int]]:
        frames = [item for item in fed.decoded.items if isinstance(item, Frame)]
        slots = [i for i, item in enumerate(fed.decoded.items) if isinstance(item, Frame)]
        if not frames:
            return fed, None, slots
        with self._lock:
            run = self._submit(frames, options, fed.decoded.ready)
        return fed, run, slots

    def _results_of(self, fed: FedBatch, run: _Run | None, slots: list[int]) -> Iterator[Results]:
        if run is not None:
            with self._lock:
                self._collect(run)
        found = dict(zip(slots, (run.found or []) if run is not None else [], strict=True))  # collected: found
        for i, (source, item) in enumerate(zip(fed.sources, fed.decoded.items, strict=True)):
            if isinstance(item, Frame):
                yield make_results(self.meta, found[i], item, source)
            else:
                path = str(source) if isinstance(source, (str, Path)) else ""
                yield Results(names=self.names, path=path, error=str(item))

    # -- the runs: one batch at a time through the predict path ------------------------------

    def _on_path(self, options: PredictOptions) -> bool:
        """Whether runs go through the captured GPU path (retina masks are built by the torch path)."""
        return self._path is not None and not options.retina_masks

    def _submit(self, frames: list[Frame], options: PredictOptions, ready: Sequence[torch.cuda.Event] = ()) -> _Run:
        """Stage and launch a batch (under the lock), one part a letterbox shape. On the GPU path it returns at once;
        the parts in flight that hold buffers a new part needs are collected first."""
        if not self._on_path(options):
            with self._network_work():
                return _Run(frames, found=self._run_torch_path(frames, options))
        groups, placements = self._group_by_shape(frames)
        run = _Run(frames)
        for shape, slots in groups.items():
            path = self.shape_path(shape)
            placed = [placements[i] for i in slots]  # every frame placed, or none (fitted to the input)
            run.parts.append(
                self._launch(
                    path,
                    slots,
                    [frames[i] for i in slots],
                    options,
                    None if placed[0] is None else cast(list[Letterbox], placed),
                    ready,
                )
            )
        return run

    def _launch(
        self,
        path: PredictPath,
        slots: list[int],
        frames: list[Frame],
        options: PredictOptions,
        placements: list[Letterbox] | None,
        ready: Sequence[torch.cuda.Event],
    ) -> _Part:
        # A part whose collection still needs the path's device buffers (segment masks, shared by every shape) is
        # collected before anything else runs; at most two parts are in flight, each path's on its own parity.
        if path.depth == 1 or any(part.path.depth == 1 for part in self._in_flight):
            self._collect_parts(list(self._in_flight))
        if len(self._in_flight) >= PARITIES:
            self._collect_parts(self._in_flight[:1])
        used = {part.parity for part in self._in_flight if part.path is path}
        if len(used) == PARITIES:
            self._collect_parts([next(part for part in self._in_flight if part.path is path)])
            used = {part.parity for part in self._in_flight if part.path is path}
        parity = next(p for p in range(PARITIES) if p not in used)
        # Every run writes the same activations (the arena) and a path's device buffers: one launched from another
        # stream than the last (another thread's) waits for it, as runs on one stream follow each other.
        stream = self._current_stream() if self._current_stream is not None and path.cuda else None
        if stream is not None and self._last_launch is not None and self._last_launch[1] != stream:
            stream.wait_event(self._last_launch[0])
        path.wait_for(ready, stream)
        if placements is not None:
            path.stage(parity, frames, options, placements)  # type: ignore[call-arg]
        else:
            path.stage(parity, frames, options)
        path.launch(len(frames), parity, stream)
        if stream is not None:
            self._last_launch = (path.done[parity], stream)
        part = _Part(path, slots, parity)
        self._in_flight.append(part)
        return part

    def _collect_parts(self, parts: list[_Part]) -> None:
        for part in parts:
            if part.found is None:
                part.found = part.path.collect(part.parity)
            if part in self._in_flight:
                self._in_flight.remove(part)

    def _collect(self, run: _Run) -> None:
        """Wait for a run and read its results (under the lock); a collected run is left as it is."""
        if run.found is not None:
            return
        self._collect_parts(run.parts)
        found: list[dict[str, Any] | None] = [None] * len(run.frames)
        for part in run.parts:
            for slot, outputs in zip(part.slots, part.found, strict=True):  # type: ignore[arg-type]
                found[slot] = outputs
        run.found = found  # type: ignore[assignment]

    def _asks_otherwise(self, name: str, value: Any) -> bool:
        """Whether ultralytics' predict option `name` at `value` asks for something this engine does not do as
        loaded: a device or precision other than the engine's, a file written or shown, an unsupported mode on."""
        if name == "batch":
            return False  # how many images run together: the engine batches on its own, with the same results
        if name == "device":
            asked = f"cuda:{value}" if isinstance(value, int) or (isinstance(value, str) and value.isdigit()) else value
            try:
                return _device(asked) != self.device
            except EngineConfigError:
                return True
        if name == "half":
            return bool(value) != (getattr(self.network, "dtype", torch.float32) == torch.float16)
        if name == "vid_stride":
            return value != 1
        return value not in (None, False, 0, "")

    # -- the low-latency trio -------------------------------------------------------------------

    def preprocess(self, frame: Any, slot: int = 0) -> None:
        """Stage one image (any accepted kind; a CUDA tensor stays on the GPU, copied) in batch slot `slot`."""
        self._check_open()
        if not _integral(slot) or not 0 <= slot < self.max_batch:
            raise EngineConfigError(f"slot {slot!r}: this engine has slots 0..{self.max_batch - 1}")
        stream = self._current_stream() if self._current_stream is not None else None
        on_device = False  # a frame on the engine's device, copied into the slot's own buffer
        if is_encoded(frame):
            batch = self.decoder.decode([Encoded.of(frame)])
            decoded = batch.items[0]
            if isinstance(decoded, ImageReadError):
                raise decoded
        else:
            decoded = frame_from_pixels(frame)
            on_device = decoded.pixels.device == self.device
            if not on_device:
                decoded = to_device(decoded, self.decoder)
                batch = DecodedBatch([decoded], self.decoder.cpu.ready_events())
        if stream is not None and not on_device and batch.ready:
            batch.wait_on(stream)  # ready on the caller's stream, which the run follows or waits for
        with self._lock:  # the slot's buffer and what reads it change together
            if on_device:
                # The caller may reuse its tensor: copied on the caller's stream (no copy stream, so no event).
                decoded = Frame(self._slot_copy(slot, decoded.pixels, stream), decoded.bgr, decoded.path)
            self._staged[slot] = _Staged(decoded, None if is_encoded(frame) else frame, stream)
            self._ran[slot] = None
            if decoded.pixels is not self._slot_copies[slot]:
                self._slot_copies[slot] = None  # a frame from elsewhere: the slot's buffer goes once nothing reads it

    def _slot_copy(self, slot: int, pixels: torch.Tensor, stream: torch.cuda.Stream | None) -> torch.Tensor:
        """A copy of a frame already on the device, on `stream`, in the slot's own buffer where the last frame staged
        there from the device had the same shape: a camera's frames then keep one address, and staging them again
        rewrites no frame table. The copy waits for the last run that read the buffer where that run was launched on
        another stream (on the same one it follows it anyway). Results never read the buffer: their original image
        is the caller's tensor."""
        held = self._slot_copies[slot]
        if held is None or held.shape != pixels.shape:
            held = self._slot_copies[slot] = pixels.clone(memory_format=torch.contiguous_format)
            return held
        read_on = self._slot_read_on[slot]
        if stream is not None and read_on is not None and read_on != stream:
            stream.wait_stream(read_on)
        return held.copy_(pixels)  # on the current stream, which `stream` is

    def run_async(self, batch: int = 1) -> None:
        """Start the whole path on slots [0, batch); on a GPU this is one graph launch and returns at once."""
        if not _integral(batch) or not 1 <= batch <= self.max_batch:
            raise EngineConfigError(f"run({batch!r}): this engine runs 1..{self.max_batch} frames (max_batch)")
        with self._lock:
            staged = self._staged[:batch]
            if any(s is None for s in staged):
                raise EngineConfigError(f"run({batch}): stage a frame into each of slots 0..{batch - 1} first")
            frames = [s.frame for s in staged if s is not None]
            launch = self._current_stream() if self._current_stream is not None else None
            if launch is not None:
                # Frames staged on other streams than the one the run is launched on: it waits for them.
                for ready_on in {s.stream for s in staged if s is not None and s.stream not in (None, launch)}:
                    launch.wait_stream(ready_on)
            run = self._submit(frames, self._options)
            self._ran[:batch] = [run] * batch
            self._slot_read_on[:batch] = [launch] * batch

    def sync(self) -> None:
        """Wait for the last `run_async`."""
        with self._lock:
            for run in self._ran:
                if run is not None:
                    self._collect(run)

    def run(self, batch: int = 1) -> None:
        self.run_async(batch)
        self.sync()

    def get(self, slot: int = 0) -> Results:
        """What the last run found in slot `slot`, in its original image's pixels."""
        if not _integral(slot) or not 0 <= slot < self.max_batch:
            raise EngineConfigError(f"slot {slot!r}: this engine has slots 0..{self.max_batch - 1}")
        with self._lock:
            run = self._ran[slot]
            if run is None:
                ran = "no results for the frame staged there"
                what = ran if self._staged[slot] is not None else "no frame staged there"
                raise EngineConfigError(f"slot {slot}: {what}; run() after preprocess()")
            self._collect(run)
            staged = self._staged[slot]
        assert run.found is not None and staged is not None
        return make_results(self.meta, run.found[slot], run.frames[slot], staged.source)

    # -- the torch path ---------------------------------------------------------------------------

    def _run_torch_path(self, frames: list[Frame], o: PredictOptions) -> list[dict[str, Any]]:
        """Pre-processing, network and post-processing with torch ops around `raw`: the reference backend's
        path, and the Triton backend's for segment with retina masks."""
        if self.meta.task == "classify":
            from yolojet.reference.classify import classify_preprocess

            h, w = self.meta.imgsz
            batch = torch.stack([classify_preprocess(f, h if h == w else (h, w)) for f in frames]).to(self.device)
            return [{"probs": p.float().cpu()} for p in self.raw(batch)]
        groups, placements = self._group_by_shape(frames)
        found: list[dict[str, Any] | None] = [None] * len(frames)
        for shape, slots in groups.items():
            outputs = self._torch_group(shape, [frames[i] for i in slots], [placements[i] for i in slots], o)
            for slot, one in zip(slots, outputs, strict=True):
                found[slot] = one
        return found  # type: ignore[return-value]

    def _torch_group(
        self, shape: tuple[int, int], frames: list[Frame], placements: list[Letterbox | None], o: PredictOptions
    ) -> list[dict[str, Any]]:
        """Frames of one input shape through the network (the reference executor, or the Triton network of that shape)
        and the torch post-processing."""
        boxes, inputs = [], []
        for frame, placement in zip(frames, placements, strict=True):
            x, box = torch_pipeline.letterbox(frame, shape, placement)
            inputs.append(x.to(self.device))
            boxes.append(box)
        raw = self.raw(torch.stack(inputs))
        classes = list(o.classes) if o.classes is not None else None
        common: dict[str, Any] = {
            "conf": o.conf,
            "iou": o.iou,
            "max_det": o.max_det,
            "classes": classes,
            "agnostic": o.agnostic,
            "end2end": self.meta.end2end,
        }
        task = self.meta.task
        if task == "segment":
            from yolojet.reference.segment import segment_postprocess

            with_masks = segment_postprocess(
                raw[0], raw[1], boxes, shape, nc=self.meta.nc, retina_masks=o.retina_masks, **common
            )
            return [{"boxes": rows.cpu(), "masks": masks.cpu()} for rows, masks in with_masks]
        if task == "pose":
            from yolojet.reference.pose import pose_postprocess

            with_points = pose_postprocess(raw, boxes, nc=self.meta.nc, kpt_shape=self.meta.kpt_shape or (), **common)
            return [{"boxes": rows.cpu(), "keypoints": kpts.cpu()} for rows, kpts in with_points]
        if task == "obb":
            from yolojet.reference.obb import obb_postprocess

            return [{"obb": rows.cpu()} for rows in obb_postprocess(raw, boxes, nc=self.meta.nc, **common)]
        predictions = cast(torch.Tensor, raw)  # a detection head has one output
        if self.meta.end2end:
            found = torch_pipeline.select_end2end(predictions, o.conf, o.max_det, classes)
        else:
            found = torch_pipeline.non_max_suppression(
                predictions, self.meta.nc, o.conf, o.iou, o.max_det, agnostic=o.agnostic, classes=classes
            )
        return [
            {"boxes": torch_pipeline.scale_boxes(rows.clone(), box).cpu()}
            for rows, box in zip(found, boxes, strict=True)
        ]


class Submitted:
    """A batch handed to `Engine.submit`: `results()` waits for it and gives one `Results` per frame, in order."""

    def __init__(
        self, engine: Engine, run: _Run, each: list[PredictOptions], merged: PredictOptions, sources: list[Any]
    ) -> None:
        self._engine, self._run, self._each, self._merged, self._sources = engine, run, each, merged, sources

    def results(self) -> list[Results]:
        engine = self._engine
        with engine._lock:
            engine._collect(self._run)
        found = self._run.found
        assert found is not None
        out = []
        for frame, own, source, outputs in zip(self._run.frames, self._each, self._sources, found, strict=True):
            result = make_results(engine.meta, outputs, frame, source)
            out.append(narrowed(result, own) if own != self._merged else result)
        return out


# ultralytics predict options that are the engine's load-time choices (and Engine.load's name for each), `yolojet
# detect`'s outputs, or not offered.
PREDICT_AT_LOAD = {"device": "device", "half": "half", "batch": "max_batch"}
PREDICT_OUTPUTS = {"save", "save_txt", "save_conf", "save_crop", "show", "project", "name", "line_width"}
PREDICT_UNSUPPORTED = {"augment", "visualize", "embed", "vid_stride", "stream_buffer"}


def _printed(results: Iterator[Results]) -> Iterator[Results]:
    """Each result passed on after a line as ultralytics' verbose predict prints it."""
    for result in results:
        where = result.path or "image"
        said = result.error if result.error else f"{result.orig_shape[0]}x{result.orig_shape[1]} {result.verbose()}"
        print(f"{where}: {said.rstrip(', ')}", flush=True)
        yield result


def merge_options(each: Sequence[PredictOptions]) -> PredictOptions:
    """The loosest options a batch of images may run with together: the lowest conf, the largest max_det, every
    class any image keeps (all, if any keeps all)."""
    first = each[0]
    for o in each[1:]:
        if (o.iou, o.agnostic, o.retina_masks) != (first.iou, first.agnostic, first.retina_masks):
            raise EngineConfigError(
                f"one batch takes one iou, agnostic and retina_masks: {first.iou}/{first.agnostic}/"
                f"{first.retina_masks} and {o.iou}/{o.agnostic}/{o.retina_masks}"
            )
    wanted = [o.classes for o in each]
    classes = None if any(c is None for c in wanted) else tuple(sorted({c for one in wanted for c in one or ()}))
    return replace(first, conf=min(o.conf for o in each), max_det=max(o.max_det for o in each), classes=classes)


def narrowed(result: Results, options: PredictOptions) -> Results:
    """A result of a batch run with looser options, cut to `options`: confidence over conf (NMS's own test), its
    classes, the first max_det (rows come highest score first)."""
    if result.error or result.probs is not None:
        return result
    rows = result.obb if result.obb is not None else result.boxes
    if rows is None:
        return result
    keep = rows.conf > options.conf
    if options.classes is not None:
        keep &= np.isin(rows.cls.astype(np.int64), np.asarray(options.classes, dtype=np.int64))
    index = np.flatnonzero(keep)[: options.max_det]
    parts: dict[str, Any] = {}
    if result.obb is not None:
        parts["obb"] = type(result.obb)(result.obb.data[index], result.obb.orig_shape)
    if result.boxes is not None:
        parts["boxes"] = Boxes(result.boxes.data[index], result.boxes.orig_shape)
    if result.masks is not None:
        parts["masks"] = type(result.masks)(result.masks.data[index])
    if result.keypoints is not None:
        parts["keypoints"] = type(result.keypoints)(result.keypoints.data[index], result.keypoints.orig_shape)
    return replace(result, **parts)


def _original_image(frame: Frame | None, source: Any) -> np.ndarray:
    """ultralytics' orig_img of a frame, made when asked for: from what the caller gave where it gave pixels (its own
    BGR array as it is), else from the frame's file bytes, decoded again on the CPU."""
    if isinstance(source, np.ndarray) and source.dtype == np.uint8 and source.ndim == 3 and source.shape[2] == 3:
        return source
    if source is not None and not is_encoded(source):
        return frame_from_pixels(source).original_bgr()
    assert frame is not None
    return frame.original_bgr()


# How much of a file `rectangles_for` reads: a JPEG's size comes after its EXIF and colour profile (64 KB each at
# most, a phone's photo holding both), any other format's within its first bytes.
HEADER_BYTES = 256 * 1024


def _header(path: str | Path) -> bytes:
    with open(path, "rb") as file:
        return file.read(HEADER_BYTES)


@cache
def _no_pixels() -> torch.Tensor:
    """An empty frame's pixels, shared by every result that keeps a frame only to read its image again: a new tensor a
    result was a torch call an image, each letting go of the GIL and waiting to take it back on a busy stream's
    thread."""
    return torch.empty(0, 0, 3, dtype=torch.uint8)


def _array(values: Any) -> np.ndarray:
    return values.numpy() if isinstance(values, torch.Tensor) else np.asarray(values)


def make_results(meta: ModelMeta, found: dict[str, Any], frame: Frame, source: Any = None) -> Results:
    """A `Results` from one image's task outputs (numpy arrays or torch tensors on the CPU); its original image is
    made when asked for, from what `_original_image` keeps (never the decoded pixels on the device)."""
    shape = frame.shape
    parts: dict[str, Any] = {}
    if "boxes" in found:
        parts["boxes"] = Boxes(_array(found["boxes"])[:, :6].astype(np.float32), shape)
    if "masks" in found:
        from yolojet.tasks.segment import Masks

        parts["masks"] = Masks(_array(found["masks"]).astype(bool))
    if "keypoints" in found:
        from yolojet.tasks.pose import Keypoints

        parts["keypoints"] = Keypoints(_array(found["keypoints"]).astype(np.float32), shape)
    if "obb" in found:
        from yolojet.tasks.obb import OBB

        parts["obb"] = OBB(_array(found["obb"]).astype(np.float32), shape)
    if "probs" in found:
        from yolojet.tasks.classify import Probs

        parts["probs"] = Probs(_array(found["probs"]).astype(np.float32))
    # Kept for the original image: what the caller gave, or the file's bytes; never the decoded pixels.
    keep: Frame | None = frame
    if source is not None and not is_encoded(source):
        keep = None
    elif frame.reads_again:
        keep = replace(frame, pixels=_no_pixels())
    return Results(
        names=meta.names, path=frame.path, image=partial(_original_image, keep, source), orig_shape=shape, **parts
    )
