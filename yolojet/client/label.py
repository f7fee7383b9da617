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

import contextlib
import fcntl
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from yolojet.client import records as recs
from yolojet.client.formats import check_dataset_folder, made_by_label
from yolojet.client.sources import LIST_SUFFIXES, label_sources
from yolojet.errors import EngineConfigError, ImageReadError, OutputPathError, RecordsError
from yolojet.outputs import (
    JsonLines,
    check_output_file,
    check_output_folder,
    is_special,
    is_stdout,
    json_line,
    refuse_overwriting_inputs,
    resolved,
    shown_path,
    write_atomically,
)
from yolojet.progress import Progress

# The first images whose headers tell a local labeler which rectangles to build at its load: a batch's worth, the
# headers read in a few ms.
FIRST_IMAGES = 64
# Errors named on the terminal as they come; past these, only in the error log (a folder of many unreadable files
# would bury the progress bar).
ERRORS_SHOWN = 20
MAX_DET = 300  # the engines' most detections an image (CapturedPath.capacity)
# What a run without --conf, --iou or --max-det gets, locally and from a server (PredictOptions' defaults): a resume
# that names one of them at its default asks for what its records were made with.
DEFAULT_OPTIONS: dict[str, Any] = {"conf": 0.25, "iou": 0.7, "max_det": MAX_DET}


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
    servers: int = 1  # whole servers behind a server's address (`serve --processes`, from ListModels)


@dataclass
class Summary:
    labeled: int = 0
    failed: int = 0
    skipped: int = 0
    detections: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    writing_formats: bool = False  # every image done; the COCO file or YOLO dataset being written

    def lines(self, job: LabelJob) -> list[str]:
        rate = self.labeled / self.seconds if self.seconds > 0 else 0.0
        skipped = f", {self.skipped} done before and skipped" if self.skipped else ""
        done = [
            f"{self.labeled} images labeled ({rate:,.1f} img/s), {self.detections} detections, "
            f"{self.failed} errors{skipped}"
        ]
        done.append(f"records: {job.out}")
        if self.failed and error_log(job) is not None:
            done.append(f"errors: {error_log(job)}")
        if job.coco is not None:
            done.append(f"COCO: {job.coco}")
        if job.yolo_txt is not None:
            done.append(f"YOLO dataset: {job.yolo_txt / 'data.yaml'}")
        return done + self.notes


def error_log(job: LabelJob) -> Path | None:
    """Where the images that fail are logged: --errors, else beside the output; none when the records go to
    standard output and no --errors is given (the errors are then named on standard error only)."""
    if job.errors is not None:
        return job.errors
    return None if is_stdout(job.out) else job.out.with_name(job.out.name + ".errors.jsonl")


def settings_file(job: LabelJob) -> Path | None:
    """Where a run's prediction options are kept beside its records, for --resume to compare (none for records on
    standard output or in a special file, which cannot be resumed)."""
    if is_stdout(job.out) or is_special(job.out):
        return None
    return job.out.with_name(job.out.name + ".settings.json")


def _shown_options(options: dict[str, Any]) -> str:
    if not options:
        return "no --conf, --iou, --max-det or --classes (the model's defaults)"
    flags = []
    for name in sorted(options):
        value = options[name]
        shown = " ".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)
        flags.append(f"--{name.replace('_', '-')} {shown}")
    return " ".join(flags)


def _asked(job: LabelJob) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in job.options.items()}


def check_kept_settings(job: LabelJob) -> None:
    """A resumed run asks for what its records were made with, which would otherwise mix two sets of options
    silently; checked before anything is changed."""
    where = settings_file(job)
    if where is None or not where.is_file() or not _holds_records(job.out):  # nothing to compare with
        return
    try:
        kept = json.loads(where.read_text())["options"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise OutputPathError(f"{where}: not the settings label keeps ({e}); remove it to resume anyway") from e
    if _in_effect(kept) != _in_effect(_asked(job)):
        raise OutputPathError(
            f"--resume {job.out}: its records were made with {_shown_options(kept)}; this run asks for "
            f"{_shown_options(_asked(job))}: give the same, or --overwrite to start again"
        )


def _in_effect(options: dict[str, Any]) -> dict[str, Any]:
    """The options a run predicts with: those given over the defaults (`--conf 0.25` is no flag at all)."""
    given = {name: value for name, value in options.items() if value is not None}
    return {**DEFAULT_OPTIONS, **given}


def _holds_records(out: Path) -> bool:
    return out.is_file() and out.stat().st_size > 0


def _keep_settings(job: LabelJob) -> None:
    """The run's options kept for the next resume, written before any record (a resume of records keeps the file it
    found; one of a run that wrote none, stopped or failed before its first record, is this run's to write)."""
    where = settings_file(job)
    if where is None or (job.resume and where.is_file() and _holds_records(job.out)):
        return
    write_atomically(where, lambda p: p.write_text(json.dumps({"options": _asked(job)}) + "\n"))


def _key(path: str) -> str:
    return os.path.abspath(path)


def _forget_retried_errors(log: Path, retried: set[str]) -> None:
    """The error log without the entries of images a resumed run tries again (each gets a new entry if it fails
    again, not one more each resume), rewritten atomically; a log that is not one of label's is left as it is."""
    try:
        entries = list(recs.iter_records(log))
    except RecordsError:
        return
    kept = [entry for entry in entries if _key(entry["path"]) not in retried]
    if len(kept) != len(entries):
        write_atomically(log, lambda p: p.write_text("".join(json_line(entry) for entry in kept)))


def _writable_name(path: str) -> bool:
    """Whether a path can be written in a JSON record: a file name of bytes that are not UTF-8 comes from the file
    system as lone surrogates, which no JSON encoder writes."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _output_files(job: LabelJob) -> dict[str, Path | None]:
    """The job's output files by the flag that names them (the YOLO dataset is a folder)."""
    return {"--out": job.out, "--errors": error_log(job), "--coco": job.coco, "(settings)": settings_file(job)}


def check_label_options(options: dict[str, Any], names: dict[int, str] | None) -> None:
    """The prediction options checked once, before any image is sent (a server would refuse each image for them), by
    their flags' names; the classes only where the model's `names` are known (None: before a model is loaded)."""
    for name in ("conf", "iou"):
        if name in options and not 0 <= options[name] <= 1:
            raise EngineConfigError(f"--{name} {options[name]}: expected a number in [0, 1]")
    if "max_det" in options and not 1 <= options["max_det"] <= MAX_DET:
        raise EngineConfigError(f"--max-det {options['max_det']}: expected an int in 1..{MAX_DET}")
    if names is None:
        return
    unknown = [c for c in options.get("classes") or () if c not in names]
    if unknown:
        raise EngineConfigError(f"--classes {unknown}: the model's class ids are 0 to {len(names) - 1}")


def check_outputs(job: LabelJob) -> None:
    """Fail before any work if an output cannot be written, or two of them are one file."""
    check_output_file(job.out, "--out")
    check_output_file(error_log(job), "--errors")
    if job.coco is not None:
        check_output_file(job.coco, "--coco")
    if job.yolo_txt is not None:
        check_output_folder(job.yolo_txt, "--yolo-txt")
        check_dataset_folder(job.yolo_txt)
    if job.resume and job.overwrite:
        raise OutputPathError("--resume and --overwrite: choose one")
    if is_stdout(job.out):
        asked = (("--coco", job.coco), ("--yolo-txt", job.yolo_txt), ("--resume", job.resume))
        needs = [flag for flag, given in asked if given]
        if needs:
            raise OutputPathError(f"--out {job.out}: {' and '.join(needs)} read the records back: give --out FILE")
    seen: dict[str, str] = {}
    for flag, path in _output_files(job).items():
        if path is None or is_stdout(path) or is_special(path):
            continue
        where = os.path.realpath(path)
        if where in seen:
            raise OutputPathError(f"{flag} {path}: the same file as {seen[where]}; give each output its own")
        seen[where] = f"{flag} {path}"


def job_paths(job: LabelJob, model: str | None = None) -> list[str]:
    """The image paths the job's sources name, but the YOLO dataset's own image links where label made the dataset (one
    made inside a source folder would otherwise be labeled again by every run; the folder's other images, and a
    user's own dataset of links, are labeled); an ImageReadError
    where they name none, an OutputPathError where an output would overwrite one of them or a file of the local
    `model`, or where --out holds records and neither --resume nor --overwrite says what to do with them (said after
    the images, so that an output that is an image is named as one)."""
    sources = label_sources(job.sources)
    if job.yolo_txt is not None and made_by_label(job.yolo_txt):
        links = os.path.join(os.path.abspath(job.yolo_txt), "images") + os.sep
        sources = [path for path in sources if not (os.path.abspath(path).startswith(links) and os.path.islink(path))]
    if not sources:
        raise ImageReadError(f"{' '.join(job.sources)}: no images found")
    lists = [s for s in job.sources if Path(s).suffix.lower() in LIST_SUFFIXES and Path(s).is_file()]
    refuse_overwriting_inputs(_output_files(job), sources, model, lists)
    if not job.resume and not job.overwrite and _holds_records(job.out):
        try:
            next(recs.iter_records(job.out), None)
        except RecordsError as e:  # not label's output: never invite replacing it
            raise OutputPathError(f"--out {job.out}: not records label wrote ({e}); give another file") from e
        raise OutputPathError(f"--out {job.out}: holds records already; --resume continues it, --overwrite replaces it")
    return sources


@contextlib.contextmanager
def sole_writer(out: Path) -> Iterator[None]:
    """An exclusive lock on the records file, held by the label command from before its model loads until its formats
    are written: two runs on one --out (a resume started beside the run it resumes) would each label every image and
    write each record twice. The system releases it when the process ends, however it ends."""
    if is_stdout(out) or is_special(out):
        yield
        return
    target = resolved(out)
    created = not target.exists()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        held = open(target, "a", encoding="utf-8")  # held open for the run: the lock lives with it
    except OSError as e:
        raise OutputPathError(f"--out {out}: cannot write there ({e.strerror})") from e
    with held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputPathError(
                f"--out {out}: another yolojet label is writing it now; wait for it to end, or give another --out"
            ) from None
        try:
            yield
        finally:
            # Made only to hold the lock and still empty: no output. Removed while the lock is held, so that no other
            # run can lock this file between its release and its removal.
            if created and target.is_file() and target.stat().st_size == 0:
                target.unlink()


def run(job: LabelJob, label: Any, facts: ModelFacts, summary: Summary, sources: list[str] | None = None) -> Summary:
    """Label the job's images (`sources`: its `job_paths`, found again where not given) with `label(paths,
    on_record, on_error)` (a server's or a local engine's), write the outputs; `summary` counts as it goes (so a run
    that fails still says what it did)."""
    if sources is None:
        sources = job_paths(job)
    done: set[str] = set()
    if job.yolo_txt is not None and facts.task == "classify":  # said before the labeling, not after it
        raise OutputPathError("--yolo-txt: a classification dataset is folders of images by class, not label files")
    if job.resume and _holds_records(job.out):
        check_kept_settings(job)
        models: set[tuple[Any, Any]] = set()
        for r in recs.iter_records(job.out):  # every line a record (a RecordsError otherwise) before any change
            done.add(_key(r["path"]))
            models.add((r.get("model"), r.get("model_version")))
        other = models - {(facts.name, facts.version)}
        if other:
            model, version = sorted(other, key=str)[0]
            raise OutputPathError(
                f"--resume {job.out}: its records come from model {model} {version}, this run "
                f"labels with {facts.name} {facts.version}; --overwrite to start again"
            )
        recs.repair_records(job.out)  # a last line a kill cut short, which iter_records left out
    _keep_settings(job)
    todo, seen, unwritable = [], set(done), []
    for path in sources:
        key = _key(path)
        if key in done:
            summary.skipped += 1
        elif key not in seen:  # a path named twice among the sources is labeled once
            seen.add(key)
            if _writable_name(path):
                todo.append(key)  # records name images by absolute path: --resume finds them from any folder
            else:
                unwritable.append(path)
    # Records reach the file 64 at a time (or every half second): a write a record costs a GIL round trip beside the
    # threads feeding the engine; a kill loses at most those not flushed, which --resume labels again.
    records = JsonLines(job.out, append=job.resume, flush_every=64)
    log = error_log(job)
    if job.resume and log is not None and log.is_file():
        _forget_retried_errors(log, set(todo) | {_key(shown_path(path)) for path in unwritable})
    errors = JsonLines(log, append=job.resume) if log is not None else None
    progress = Progress(len(todo) + len(unwritable), "label", enabled=not job.quiet)

    counting = threading.Lock()  # errors come from the thread reading files and from the one taking replies

    def on_record(record: dict) -> None:
        records.write(record)
        with counting:
            summary.labeled += 1
            summary.detections += len(record.get("detections", ()))
            progress.update(1)

    def on_error(path: str, message: str) -> None:
        if errors is not None:
            errors.write({"path": path, "error": message})
        with counting:
            summary.failed += 1
            progress.update(1)
            if job.quiet or (errors is not None and summary.failed > ERRORS_SHOWN + 1):
                return
            if summary.failed <= ERRORS_SHOWN or errors is None:
                progress.write(f"{path}: error: {message.removeprefix(f'{path}: ')}", file=sys.stderr)
            else:
                progress.write(f"more than {ERRORS_SHOWN} errors: the others go to {log} only", sys.stderr)

    for path in unwritable:
        shown = shown_path(path)
        on_error(shown, f"{shown}: the file name is not UTF-8, which JSON lines cannot hold; rename the file")
    start = time.perf_counter()
    try:
        if todo:
            label(todo, on_record, on_error)
    finally:
        summary.seconds = time.perf_counter() - start
        progress.close()
        records.close()
        if errors is not None:
            errors.close()
    if not job.resume:  # this run's outputs replace the last run's even where it wrote none
        for lines, output in ((records, job.out), (errors, log)):
            if lines is not None and lines.written == 0 and output is not None and output.is_file():
                output.write_bytes(b"")
    if job.coco is not None or job.yolo_txt is not None:
        summary.writing_formats = True
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
