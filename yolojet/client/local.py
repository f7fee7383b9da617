"""Labeling on an engine in this process (`yolojet label --local`): the engine's stream API reads and decodes the
images on threads of its own while the GPU runs the batch before."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from yolojet.client import records as recs
from yolojet.client.label import FIRST_IMAGES, ModelFacts
from yolojet.engine.engine import Engine


class LocalLabeler:
    """Labels on an engine in this process. `first_images`: the first of the images to come, whose rectangles are
    built at load rather than at their first batch (0.8 s for a 640x480 network on an H200, bench/NOTES.md)."""

    def __init__(
        self,
        model: str,
        batch: int,
        options: dict[str, Any],
        first_images: Sequence[str] = (),
        **engine_options: Any,
    ) -> None:
        self.engine = Engine.load(
            model, max_batch=batch, shapes_for=list(first_images[:FIRST_IMAGES]), **engine_options
        )
        self.options = options
        meta = self.engine.meta
        path = Path(str(model).rstrip("/"))
        name = path.stem if path.suffix.lower() in (".pt", ".yaml", ".yml") else path.name
        self.facts = ModelFacts(
            name,
            self.engine.graph.version(),
            meta.task,
            dict(meta.names),
            list(meta.kpt_shape) if meta.kpt_shape else None,
        )

    def __call__(
        self, paths: list[str], on_record: Callable[[dict], None], on_error: Callable[[str, str], None]
    ) -> None:
        f = self.facts
        for path, result in zip(paths, self.engine.stream(paths, **self.options), strict=True):
            if result.error:
                on_error(path, result.error)
            else:
                on_record(recs.from_results(path, result, f.name, f.version, f.task))

    def close(self) -> None:
        self.engine.close()
