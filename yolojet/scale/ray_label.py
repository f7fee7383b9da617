"""`yolojet label --ray [ADDRESS]`: the images of a labeling run spread over a Ray cluster by Ray Data.

`RayLabeler` is a labeler as `LocalLabeler` is (`facts`, `__call__(paths, on_record, on_error)`, `close()`), so the
JSON lines, the resume and the COCO / YOLO outputs stay those of `client/label.py`: every record comes back to this
process (the driver) and is handed to its callbacks here only.

The driver loads the model's graph once (the facts come from it; no engine is built here) and puts it in Ray's
object store. Each actor of an autoscaling pool builds its own engine from that one graph (one GPU an actor where the
cluster has GPUs, else the float32 reference backend on a CPU), so the workers need not see the model file and all
run the same model version. The paths go in as a dataset of path strings; each actor reads the files of its batch
itself (the machines of a cluster need a file system they share with the driver, under the same absolute paths) and
answers, for each image, its record as a JSON string or why it failed: it never raises for a bad image.

Exactly once: Ray Data restarts an actor that dies and runs its batch again, so the answers of a batch may come back
twice (its worker died after they were sent). The driver hands on a path's first answer only and drops every later
one, counting them; a path that no answer came for goes to the error log (a resumed run tries it again).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from yolojet import errors
from yolojet.client import records as recs
from yolojet.client.label import ModelFacts
from yolojet.errors import EngineConfigError, YolojetError
from yolojet.scale.ray_cluster import connect

INSTALL = "pip install 'yolojet[ray]'"
NO_ANSWER = "no answer came back from the Ray workers"

Batch = dict[str, np.ndarray]


def _require_ray() -> None:
    try:
        import ray.data  # noqa: F401  (Ray without its data extra has no Dataset)
    except ImportError as e:
        raise EngineConfigError(f"--ray: Ray Data is not installed here ({e}); {INSTALL}") from None


def model_name(model: str) -> str:
    """The name records carry, as `--local` names the model: a checkpoint's or YAML's stem, a folder's name."""
    path = Path(str(model).rstrip("/"))
    return path.stem if path.suffix.lower() in (".pt", ".yaml", ".yml") else path.name


def _column(values: list[str]) -> np.ndarray:
    return np.array(values, dtype=object)


class LabelActor:
    """One engine in a Ray worker process, labeling the batches Ray Data hands it."""

    def __init__(
        self, graph: list[Any], facts: ModelFacts, options: dict[str, Any], engine_options: dict[str, Any]
    ) -> None:
        import ray

        from yolojet.engine.engine import Engine

        # A yolojet error that fails every batch, as "ErrorClass: message": the driver raises it as that class (an
        # exception raised here would reach it as Ray's, its type lost, after Ray has tried the actor again).
        self.failure = ""
        model = ray.get(graph[0])  # in a list, so that Ray hands over the reference rather than fetching it itself
        try:
            with tempfile.TemporaryDirectory(prefix="yolojet-ray-") as folder:
                # Engine.load takes a model directory; the weights are in memory once it has read them.
                self.engine = Engine.load(model.save(Path(folder) / "model"), **engine_options)
        except YolojetError as e:
            self.failure = f"{type(e).__name__}: {e}"
        self.facts = facts
        self.options = options
        context = ray.get_runtime_context()
        # A restarted actor keeps its id in a new process: the driver counts restarts from the pairs it sees.
        self.actor = context.get_actor_id() or ""
        self.worker = f"{context.get_node_id()}:{os.getpid()}"

    def __call__(self, batch: Batch) -> Batch:
        paths = [str(p) for p in batch["path"]]
        answers, failure = [("", "")] * len(paths), self.failure
        if not failure:
            try:
                answers = self.label(paths, [str(f) for f in batch["file"]])
            except YolojetError as e:  # an option or model the engine cannot take: the run fails, as with --local
                failure = f"{type(e).__name__}: {e}"
        return {
            "path": _column(paths),
            "record": _column([r for r, _ in answers]),
            "error": _column([e for _, e in answers]),
            "failure": _column([failure] * len(paths)),
            "actor": _column([self.actor] * len(paths)),
            "worker": _column([self.worker] * len(paths)),
        }

    def label(self, paths: list[str], files: list[str]) -> list[tuple[str, str]]:
        """(record as JSON, "") or ("", why it failed) for each image; `files` are the paths as this worker reads
        them (absolute), `paths` as the records name them."""
        try:
            results = list(self.engine.stream(files, **self.options))
        except YolojetError:
            raise
        except Exception:
            # Something beyond one unreadable image (the stream gives those as errors): each image alone, so that
            # only the image at fault fails.
            return [self._alone(path, file) for path, file in zip(paths, files, strict=True)]
        return [self._answer(path, file, result) for path, file, result in zip(paths, files, results, strict=True)]

    def _alone(self, path: str, file: str) -> tuple[str, str]:
        try:
            (result,) = self.engine([file], **self.options)
        except YolojetError:
            raise
        except Exception as e:
            return "", f"{path}: {type(e).__name__}: {e}"
        return self._answer(path, file, result)

    def _answer(self, path: str, file: str, result: Any) -> tuple[str, str]:
        if result.error:
            # Named as the user named the image (the worker read it by its absolute path).
            return "", result.error.replace(file, path, 1) if file != path else result.error
        f = self.facts
        return json.dumps(recs.from_results(path, result, f.name, f.version, f.task)), ""


@dataclass
class Delivery:
    """Exactly once on the driver: a path's first answer goes to the callbacks, every later one is dropped."""

    restarts: int = 0  # actors Ray started again after they died, seen in the answers of their new process
    repeats: int = 0  # answers dropped: their path had had one
    missing: int = 0  # paths no answer came for

    def deliver(
        self,
        batches: Iterable[Batch],
        paths: list[str],
        on_record: Callable[[dict], None],
        on_error: Callable[[str, str], None],
    ) -> None:
        """Hand each path's first answer in `batches` to the callbacks and drop the later ones; then each of `paths`
        that had none goes to the error log. A batch that carries a worker's failure raises it."""
        delivered: set[str] = set()
        processes: dict[str, set[str]] = {}
        for batch in batches:
            failure = next((str(f) for f in batch["failure"] if f), "")
            if failure:
                raise worker_failure(failure)
            rows = zip(batch["path"], batch["record"], batch["error"], batch["actor"], batch["worker"], strict=True)
            for path, record, error, actor, worker in rows:
                path = str(path)
                processes.setdefault(str(actor), set()).add(str(worker))
                if path in delivered:
                    self.repeats += 1
                    continue
                delivered.add(path)
                if error:
                    on_error(path, str(error))
                else:
                    on_record(json.loads(record))
        self.restarts += sum(len(seen) - 1 for seen in processes.values())
        for path in paths:
            if path not in delivered:
                self.missing += 1
                on_error(path, NO_ANSWER)

    def notes(self) -> list[str]:
        notes = []
        if self.restarts:
            workers = "a worker that" if self.restarts == 1 else f"{self.restarts} workers that"
            notes.append(f"Ray restarted {workers} died; the batches they held ran again")
        if self.repeats:
            answers = "an answer" if self.repeats == 1 else f"{self.repeats} answers"
            notes.append(f"{answers} for images answered already (a batch run again) dropped")
        if self.missing:
            images = "an image" if self.missing == 1 else f"{self.missing} images"
            notes.append(f"{images} got no answer from the Ray workers (in the error log; --resume tries them again)")
        return notes


class RayLabeler:
    """Labels on a Ray cluster with Ray Data: `address` an existing cluster's (HOST:PORT, ray://HOST:PORT, auto) or
    None for one started here; `actors` the most engines at once (default: one a GPU of the cluster, or one a CPU
    where it has none); `device` None (the cluster's GPUs where it has some), "cuda" or "cpu"; `actor` the class that
    runs in the workers (a `LabelActor`)."""

    def __init__(
        self,
        model: str,
        batch: int,
        options: dict[str, Any],
        address: str | None = None,
        actors: int | None = None,
        device: str | None = None,
        actor: type[LabelActor] = LabelActor,
        **engine_options: Any,
    ) -> None:
        from yolojet.engine.models import resolve_graph

        _require_ray()
        if device not in (None, "cuda", "cpu"):
            raise EngineConfigError(f"--ray --device {device}: expected cuda or cpu (Ray gives each worker its GPU)")
        graph = resolve_graph(model)  # a model that cannot load fails here, before a cluster is joined
        meta = graph.meta
        self.facts = ModelFacts(
            model_name(model),
            graph.version(),
            meta.task,
            dict(meta.names),
            list(meta.kpt_shape) if meta.kpt_shape else None,
        )
        self.batch = batch
        self.options = options
        self.actor = actor
        self.delivery = Delivery()
        self._started = connect(address)
        try:
            import ray

            resources = ray.cluster_resources()
            gpus = int(resources.get("GPU", 0))
            if device == "cuda" and not gpus:
                raise EngineConfigError("--ray --device cuda: the Ray cluster has no GPUs")
            self.gpu = device != "cpu" and gpus > 0
            self.actors = actors or max(1, gpus if self.gpu else int(resources.get("CPU", 1)))
            self._graph = ray.put(graph)
        except BaseException:
            self.close()
            raise
        # Without a GPU the engine is the reference, named so that each worker prints no notice of choosing it.
        where = {"device": "cuda"} if self.gpu else {"device": "cpu", "backend": "reference"}
        self.engine_options = {**engine_options, **where, "max_batch": batch}

    def __call__(
        self, paths: list[str], on_record: Callable[[dict], None], on_error: Callable[[str, str], None]
    ) -> None:
        import ray.data

        # The run's own progress bar counts the images; Ray Data's would draw over it on the same terminal, and its
        # plan printed at the start says nothing a labeling run needs.
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        context.print_on_execution_start = False
        items = [{"path": path, "file": os.path.abspath(path)} for path in paths]
        dataset = ray.data.from_items(items).map_batches(
            self.actor,
            batch_size=self.batch,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(min_size=1, max_size=self.actors),
            fn_constructor_kwargs={
                "graph": [self._graph],
                "facts": self.facts,
                "options": self.options,
                "engine_options": self.engine_options,
            },
            num_cpus=1,
            num_gpus=1 if self.gpu else 0,
        )
        batches = iter(dataset.iter_batches(batch_size=None, batch_format="numpy"))
        try:
            self.delivery.deliver(_failures_typed(batches), paths, on_record, on_error)
        finally:  # a run given up (an error, Ctrl-C) stops its dataset now, freeing the cluster's actors
            stop = getattr(batches, "close", None)
            if stop is not None:
                stop()

    def notes(self) -> list[str]:
        """Lines for the run's summary: workers Ray restarted, answers dropped as repeats, images without one."""
        return self.delivery.notes()

    def close(self) -> None:
        """Leave the cluster if this labeler joined it (a cluster started here stops with it)."""
        if self._started:
            import ray

            ray.shutdown()
            self._started = False


def worker_failure(failure: str) -> YolojetError:
    """A worker's "ErrorClass: message" as that yolojet error (a bad model directory, an option out of range), or as
    an EngineConfigError where the class takes more than a message."""
    kind, _, message = failure.partition(": ")
    found = getattr(errors, kind, None)
    text = f"on a Ray worker: {message}"
    if isinstance(found, type) and issubclass(found, YolojetError):
        try:
            return found(text)
        except TypeError:
            pass
    return EngineConfigError(f"{text} ({kind})")


def _failures_typed(batches: Iterator[Batch]) -> Iterator[Batch]:
    """The batches, with a failure of the run on the cluster (a worker that cannot start, a node lost for good)
    raised as an EngineConfigError that says what the worker met."""
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as e:
            raise EngineConfigError(f"--ray: labeling on the cluster failed: {_what_failed(e)}") from e
        yield batch


def _what_failed(error: Exception) -> str:
    """The line that names the exception under Ray's: its traceback, as Ray's message carries it, ends with that line
    just above the (last) one saying it caused Ray's own; else Ray's first line."""
    lines = [line for line in str(error).splitlines() if line.strip()]
    marker = "The above exception was the direct cause of the following exception:"
    last = max((i for i, line in enumerate(lines) if line.strip() == marker), default=0)
    if last > 0:
        return lines[last - 1].strip()
    return lines[0].strip() if lines else type(error).__name__
