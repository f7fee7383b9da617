"""The models a server runs: each a name, a version, an engine, and its latency per batch bucket measured at start-up.

A model is given as `NAME_OR_DIR[:max_batch]`: a model directory, a `.pt` checkpoint, an ultralytics name or an
architecture `.yaml`; its name (what requests route by) is the file or folder name without its suffix, its version
a digest of its weights (two servers with the same version give the same results).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from yolojet.engine.engine import Engine, check_options
from yolojet.engine.predict_path import PredictOptions
from yolojet.errors import EngineConfigError
from yolojet.images import Frame
from yolojet.ir import ModelMeta
from yolojet.serve.batcher import LatencyModel

_SPEC = re.compile(r"^(?P<source>.+?)(?::(?P<batch>\d+))?$")


@dataclass(frozen=True)
class ModelSpec:
    source: str
    max_batch: int

    @property
    def name(self) -> str:
        path = Path(self.source.rstrip("/"))
        return path.stem if path.suffix.lower() in (".pt", ".yaml", ".yml") else path.name


def parse_model_spec(text: str, default_batch: int) -> ModelSpec:
    """`NAME_OR_DIR[:max_batch]`."""
    match = _SPEC.match(text.strip())
    if not text.strip() or match is None:
        raise EngineConfigError(f"--model {text!r}: expected NAME_OR_DIR[:max_batch], e.g. yolo11n.pt:64")
    _, colon, suffix = text.strip().rpartition(":")
    meant_as_batch = colon and not match["batch"] and re.fullmatch(r"[\w-]+", suffix)  # not a URL's or path's colon
    if meant_as_batch and not Path(text).exists():
        raise EngineConfigError(f"--model {text!r}: {suffix!r} after the colon is no max_batch (a whole number)")
    batch = int(match["batch"]) if match["batch"] else default_batch
    if batch < 1:
        raise EngineConfigError(f"--model {text!r}: max_batch must be at least 1")
    return ModelSpec(match["source"], batch)


@dataclass(frozen=True)
class ModelCard:
    """What the service tells of a model and checks requests against, without its engine: a front whose engines
    run in worker processes (scale/) has only this."""

    meta: ModelMeta
    max_batch: int
    capacity: int  # the largest max_det a request may ask for
    backend: str
    decoder: str
    device: str

    @classmethod
    def of(cls, engine: Engine) -> ModelCard:
        return cls(
            engine.meta, engine.max_batch, engine.capacity, engine.backend, engine.decoder.name, str(engine.device)
        )


@dataclass
class ServedModel:
    """A model the server routes requests to. `engine` is None where the engines run in worker processes."""

    name: str
    version: str
    card: ModelCard
    latency: LatencyModel
    engine: Engine | None = None
    _defaults: PredictOptions | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def max_batch(self) -> int:
        return self.card.max_batch

    @property
    def meta(self) -> ModelMeta:
        return self.card.meta

    def options(self, **given: Any) -> PredictOptions:
        """A request's options (conf, iou, max_det, classes) over the defaults, checked as the engine checks them."""
        if not given:  # most requests: the defaults, checked once (10 us a request otherwise)
            if self._defaults is None:
                self._defaults = check_options(PredictOptions(), self.meta.nc, self.card.capacity)
            return self._defaults
        return check_options(replace(PredictOptions(), **given), self.meta.nc, self.card.capacity)

    @classmethod
    def of(cls, name: str, engine: Engine, latency: LatencyModel) -> ServedModel:
        return cls(name, engine.graph.version(), ModelCard.of(engine), latency, engine)


def measure_latency(engine: Engine, repeats: int = 3) -> LatencyModel:
    """The engine's run time for each batch bucket: the median of `repeats` after a warm-up, on grey frames of each
    input shape built (the model's own and those of `--shapes`), the slowest shape's. The warm-up also captures
    every bucket's graph of every shape on both parities, so that the first requests do not wait for captures."""
    buckets = getattr(engine.network, "buckets", None) or [1, engine.max_batch]
    seconds: dict[int, float] = {}
    for h, w in engine.shapes():
        pixels = torch.full((h, w, 3), 114, dtype=torch.uint8, device=engine.device)
        frame = Frame(pixels, bgr=False)
        for bucket in sorted(set(buckets)):
            frames = [frame] * bucket
            engine.submit(frames).results()
            samples = []
            for _ in range(repeats):
                start = time.perf_counter()
                engine.submit(frames).results()
                samples.append(time.perf_counter() - start)
            seconds[bucket] = max(seconds.get(bucket, 0.0), sorted(samples)[len(samples) // 2])
    return LatencyModel(no_faster_when_larger(seconds))


def no_faster_when_larger(seconds: dict[int, float]) -> dict[int, float]:
    """Bucket times where a smaller bucket never takes longer than a larger one, as runs do: a start-up measured while
    other work held the machine once put a run of 1 at 1,129 ms beside a run of 4 at 94 (the server then refused,
    idle, every request with a deadline of a second)."""
    fixed, cap = {}, float("inf")
    for bucket in sorted(seconds, reverse=True):
        cap = fixed[bucket] = min(seconds[bucket], cap)
    return dict(sorted(fixed.items()))


def load_models(specs: list[ModelSpec], **engine_options: Any) -> dict[str, ServedModel]:
    """Every model built, its latency measured; names must differ."""
    names = [s.name for s in specs]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise EngineConfigError(f"--model: two models named {clash[0]!r}; rename one's file or folder")
    models: dict[str, ServedModel] = {}
    try:
        for spec in specs:
            engine = Engine.load(spec.source, max_batch=spec.max_batch, **engine_options)
            latency = measure_latency(engine)
            models[spec.name] = ServedModel.of(spec.name, engine, latency)
    except BaseException:
        for model in models.values():
            if model.engine is not None:
                model.engine.close()
        raise
    return models
