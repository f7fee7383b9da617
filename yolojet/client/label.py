"""`yolojet label`: every image of the sources labeled once, into JSON lines as the results come, then COCO and YOLO
label files; against a server (`--server`) or on a local engine (`--local`).

Nothing lost, nothing twice: the JSON lines are appended, flushed and synced in batches, so an interrupted run keeps
every finished record (Ctrl-C) or all but the last few not yet flushed (a kill, a crash); `--resume` reads them back
(dropping a last line a kill cut short) and labels only the images not in them, so a run resumed any number of times
ends with each image exactly once. The COCO file and the YOLO dataset are made from the whole output at the end, each
file written atomically. Images that cannot be read or that the server refuses as bad go to the error log (JSON lines,
`--errors`, by default beside the output) with the reason, and the run goes on; they are tried again by a resumed
run.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from yolojet.client import records as recs
from yolojet.client.sources import label_sources
from yolojet.errors import ImageReadError, OutputPathError
from yolojet.outputs import JsonLines, check_output_file, check_output_folder
from yolojet.progress import Progress

# The first images whose headers tell a local labeler which rectangles to build at its load: a batch's worth, the
# headers read in a few ms.
FIRST_IMAGES = 64
# Errors named on the terminal as they come; past these, only in the error log (a folder of many unreadable files
# would bury the progress bar).
ERRORS_SHOWN = 20


@dataclass
class LabelJob:
    sources: list[str]
    out: Path
    errors: Path | None = None
    coco: Path | None = None
    rle: bool = False
    yolo_txt: Path | None = None
    resume: bool = False
    overwrite: bool = False
    quiet: bool = False
    options: dict[str, Any] = field(default_factory=dict)  # conf, iou, max_det, classes


@dataclass
class ModelFacts:
    """What the outputs need to know of the model (from the server's ListModels, or the local engine)."""

    name: str
    version: str
    task: str
    names: dict[int, str]
    kpt_shape: list[int] | None = None


@dataclass
class Summary:
    labeled: int = 0
    failed: int = 0
    skipped: int = 0
    detections: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def lines(self, job: LabelJob) -> list[str]:
        rate = self.labeled / self.seconds if self.seconds > 0 else 0.0
        skipped = f", {self.skipped} done before and skipped" if self.skipped else ""
        done = [
            f"{self.labeled} images labeled ({rate:,.1f} img/s), {self.detections} detections, "
            f"{self.failed} errors{skipped}"
        ]
        done.append(f"records: {job.out}")
        if self.failed:
            done.append(f"errors: {error_log(job)}")
        if job.coco is not None:
            done.append(f"COCO: {job.coco}")
        if job.yolo_txt is not None:
            done.append(f"YOLO dataset: {job.yolo_txt / 'data.yaml'}")
        return done + self.notes


def error_log(job: LabelJob) -> Path:
    return job.errors if job.errors is not None else job.out.with_name(job.out.name + ".errors.jsonl")


def _key(path: str) -> str:
    return os.path.abspath(path)


def check_outputs(job: LabelJob) -> None:
    """Fail before any work if an output cannot be written, or if the output holds records and neither --resume
    nor --overwrite says what to do with them."""
    check_output_file(job.out, "--out")
    check_output_file(error_log(job), "--errors")
    if job.coco is not None:
        check_output_file(job.coco, "--coco")
    if job.yolo_txt is not None:
        check_output_folder(job.yolo_txt, "--yolo-txt")
    if job.resume and job.overwrite:
        raise OutputPathError("--resume and --overwrite: choose one")
    if not job.resume and not job.overwrite and job.out.is_file() and job.out.stat().st_size > 0:
        raise OutputPathError(f"--out {job.out}: holds records already; --resume continues it, --overwrite replaces it")


def job_paths(job: LabelJob) -> list[str]:
    """The image paths the job's sources name; an ImageReadError where they name none."""
    sources = label_sources(job.sources)
    if not sources:
        raise ImageReadError(f"{' '.join(job.sources)}: no images found")
    return sources


def run(job: LabelJob, label: Any, facts: ModelFacts, summary: Summary, sources: list[str] | None = None) -> Summary:
    """Label the job's images (`sources`: its `job_paths`, found again where not given) with `label(paths,
    on_record, on_error)` (a server's or a local engine's), write the outputs; `summary` counts as it goes (so a run
    that fails still says what it did)."""
    if sources is None:
        sources = job_paths(job)
    done: set[str] = set()
    if job.resume and job.out.is_file():
        recs.repair_records(job.out)
        models: set[tuple[Any, Any]] = set()
        for r in recs.iter_records(job.out):
            done.add(_key(r["path"]))
            models.add((r.get("model"), r.get("model_version")))
        other = models - {(facts.name, facts.version)}
        if other:
            model, version = sorted(other, key=str)[0]
            raise OutputPathError(
                f"--resume {job.out}: its records come from model {model} {version}, this run "
                f"labels with {facts.name} {facts.version}; --overwrite to start again"
            )
    todo, seen = [], set(done)
    for path in sources:
        key = _key(path)
        if key in done:
            summary.skipped += 1
        elif key not in seen:  # a path named twice among the sources is labeled once
            seen.add(key)
            todo.append(path)
    # Records reach the file 64 at a time (or every half second): a write a record costs a GIL round trip beside the
    # threads feeding the engine; a kill loses at most those not flushed, which --resume labels again.
    records = JsonLines(job.out, append=job.resume, flush_every=64)
    errors = JsonLines(error_log(job), append=job.resume)
    progress = Progress(len(todo), "label", enabled=not job.quiet)

    counting = threading.Lock()  # errors come from the thread reading files and from the one taking replies

    def on_record(record: dict) -> None:
        records.write(record)
        with counting:
            summary.labeled += 1
            summary.detections += len(record.get("detections", ()))
            progress.update(1)

    def on_error(path: str, message: str) -> None:
        errors.write({"path": path, "error": message})
        with counting:
            summary.failed += 1
            progress.update(1)
            if job.quiet or summary.failed > ERRORS_SHOWN + 1:
                return
            if summary.failed <= ERRORS_SHOWN:
                progress.write(f"{path}: error: {message.removeprefix(f'{path}: ')}", file=sys.stderr)
            else:
                progress.write(f"more than {ERRORS_SHOWN} errors: the others go to {error_log(job)} only", sys.stderr)

    start = time.perf_counter()
    try:
        if todo:
            label(todo, on_record, on_error)
    finally:
        summary.seconds = time.perf_counter() - start
        progress.close()
        records.close()
        errors.close()
    if job.coco is not None or job.yolo_txt is not None:
        write_formats(job, facts)
    return summary


def write_formats(job: LabelJob, facts: ModelFacts) -> None:
    """The COCO file and the YOLO dataset made from every record of the output, reading it a record at a time."""
    from yolojet.client.formats import write_coco, write_yolo_dataset

    total = recs.count_records(job.out) if job.out.is_file() else 0
    if job.coco is not None:
        progress = Progress(total, "COCO", unit="img", enabled=not job.quiet)
        try:
            write_coco(job.coco, job.out, facts.names, rle=job.rle, progress=progress)
        finally:
            progress.close()
    if job.yolo_txt is not None:
        progress = Progress(total, "YOLO labels", unit="img", enabled=not job.quiet)
        try:
            write_yolo_dataset(job.yolo_txt, job.out, facts.names, facts.task, facts.kpt_shape, progress=progress)
        finally:
            progress.close()
