"""Writing users' outputs without losing data: whole files atomically, JSON lines as they come, links followed.

- A path that is a symbolic link is written through: its target is replaced or appended to, the link stays.
- Special files (a FIFO, a terminal) are written straight, never renamed over; `-`, `/dev/stdout` and any other
  name of this process's standard output are written through the stream itself.
- Whole-file outputs (COCO JSON, metrics, annotated images) go to a temporary file beside the target, renamed into
  place once complete: a failed or interrupted run never leaves a half-written file, and never destroys the old one.
- JSON lines are written as they arrive, each line in one write, flushed at once and synced to disk every so often
  and at the end: an interrupted run keeps every finished record. The file is created by its first record, so a run
  that produces none leaves no empty file.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

import orjson

from yolojet.errors import OutputPathError
from yolojet.ir import GRAPH_FILE, WEIGHTS_FILE

STDOUT = "-"


def resolved(path: Path) -> Path:
    """Where writing `path` lands: the final target of a chain of symbolic links (which need not exist yet)."""
    return Path(os.path.realpath(path))


def is_stdout(path: Path | str | None) -> bool:
    """`-`, or a path that is this process's standard output (`/dev/stdout`, `/proc/self/fd/1`, a link to it, or the
    file the shell redirected it to): written through the stream itself, so that its position is shared with
    everything else printed there."""
    if path is None:
        return False
    if str(path) == STDOUT:
        return True
    try:
        here, out = os.stat(path), os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no such path, or stdout is not a real file descriptor
        return False
    return (here.st_dev, here.st_ino) == (out.st_dev, out.st_ino)


def is_special(path: Path) -> bool:
    """A path that exists and is neither a regular file nor a directory (a device, a FIFO, a socket): written
    straight, never replaced."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def check_output_file(path: Path | None, flag: str) -> None:
    """Fail before any work if `path` (a file to write, `-` for standard output) cannot be written."""
    if path is None or is_stdout(path):
        return
    if is_special(path):
        if not os.access(path, os.W_OK):
            raise OutputPathError(f"{flag} {path}: not writable")
        return
    target = resolved(path)
    if target.is_dir():
        raise OutputPathError(f"{flag} {path}: is a directory; give a file path")
    if target.exists() and not os.access(target, os.W_OK):
        raise OutputPathError(f"{flag} {path}: {target} is not writable")
    check_output_folder(target.parent, flag, shown=path)


def refuse_overwriting_inputs(
    outputs: dict[str, Path | None],
    images: Iterable[str],
    model: str | os.PathLike[str] | None = None,
    lists: Iterable[str] = (),
    datasets: Iterable[str] = (),
) -> None:
    """Fail before any work if an output file is one of the images the command reads, one of the `lists` of images it
    reads, a dataset description it scores against (`datasets`: a COCO JSON or a dataset YAML), or a file of the model
    it loads (its file, or its directory's graph or weights): writing there would destroy it. Inputs are compared by
    name first, the output's own and its link's target's, then by where they lead: a realpath an image would cost a
    million-image run seconds."""
    by_name: dict[str, list[tuple[str, Path, str]]] = {}
    for flag, path in outputs.items():
        if path is None or is_stdout(path) or is_special(path):
            continue
        where = os.path.realpath(path)
        if model is not None and _holds_model_file(str(model), where):
            raise OutputPathError(f"{flag} {path}: a file of the model {model}; writing there would destroy it")
        for name in {path.name, os.path.basename(where)}:
            by_name.setdefault(name, []).append((flag, path, where))
    if not by_name:
        return
    for what, inputs in (
        ("the dataset this run scores against", datasets),
        ("the list of images this run reads", lists),
        ("an input image", images),
    ):
        for read in inputs:
            for flag, path, where in by_name.get(os.path.basename(read), ()):
                if os.path.realpath(read) == where:
                    raise OutputPathError(f"{flag} {path}: {what}; writing there would destroy it")


def _holds_model_file(model: str, where: str) -> bool:
    """Whether `where` (a resolved path) is the model's file, or one of the files a model directory is made of."""
    if not os.path.exists(model):  # a name ultralytics fetches, or an architecture: no file of the user's
        return False
    home = os.path.realpath(model)
    if os.path.isdir(home):
        return where in {os.path.join(home, GRAPH_FILE), os.path.join(home, WEIGHTS_FILE)}
    return where == home


def check_output_folder(folder: Path, flag: str, shown: Path | None = None) -> None:
    """Fail before any work if `folder` could not be created or written into (nothing is created yet: a run that
    fails later leaves no empty folder behind)."""
    existing = folder.absolute()
    while not existing.exists():
        existing = existing.parent
    name = shown if shown is not None else folder
    if not existing.is_dir():
        raise OutputPathError(f"{flag} {name}: {existing} exists and is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputPathError(f"{flag} {name}: {existing} is not writable")


def write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """Write a whole file through a temporary file beside its target (links followed), renamed into place only when
    complete, with the permissions a plain write would give; a special file is written straight."""
    if is_special(path):
        write(path)
        return
    target = resolved(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, staging = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=target.suffix)
    except OSError as e:
        raise OutputPathError(f"{path}: cannot write there ({e.strerror})") from e
    os.close(fd)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o666 & ~umask)  # mkstemp makes it private
        write(Path(staging))
        os.replace(staging, target)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise


_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)  # POSIX only: elsewhere the staging name is trusted as it is
_CLOSE_ON_EXEC = getattr(os, "O_CLOEXEC", 0)


def write_small_file(path: str, data: bytes) -> None:
    """`data` as the whole of the file at `path` (its folder exists), through a temporary file beside it renamed into
    place, as `write_atomically` does, in the fewest system calls: one of the many label files of a dataset (the
    general way took ~386 us a file on a 2-core machine: a random name, a second open, a mode change, a link check of
    every folder above). A link or a special file at `path` goes the general way, so links are still written
    through."""
    try:
        kind = os.lstat(path).st_mode
    except FileNotFoundError:
        kind = stat.S_IFREG
    if not stat.S_ISREG(kind):
        write_atomically(Path(path), lambda p: p.write_bytes(data))
        return
    folder, name = os.path.split(path)
    # One writer a thread: the name is the thread's own (and a stale one, left by a killed run, is rewritten).
    staging = os.path.join(folder, f".{name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NO_FOLLOW | _CLOSE_ON_EXEC, 0o666)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(staging, path)
    except BaseException as e:
        try:
            os.unlink(staging)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise OutputPathError(f"{path}: cannot write there ({e.strerror})") from e
        raise


def shown_path(path: str) -> str:
    """A path as JSON and a terminal can hold it: a file name that is not UTF-8 (its stray bytes come from the file
    system as lone surrogates, which no JSON encoder writes) with those bytes as backslash escapes, `odd\\xff.jpg`."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def json_line(record: Any) -> str:
    """A record as one line of JSON, newline included: orjson's (a fifth of json.dumps' time for a record of 50
    boxes, 26 against 141 us), keys that are not strings written as strings as json.dumps writes them."""
    return orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS).decode()


class JsonLines:
    """JSON records written one line each as they arrive, to a file (links followed), a special file or `-`.

    Lines reach the file (one write for the lines gathered) every `flush_every` lines or `flush_seconds`, at once
    by default, and at once always on standard output and special files, where someone reads them as they come; the
    file is synced to disk every `sync_every` lines or `sync_seconds`, and when closed. A kill loses at most the
    lines not yet flushed, which a resumed labeling run (`--resume`) labels again. `append` keeps what the file
    holds (a resumed run); otherwise the file is replaced by the first record. Safe to write from several threads (a
    labeler's reader and its replies): the first two writes would otherwise both open the file, the second
    truncating what the first wrote.
    """

    def __init__(
        self,
        path: Path | str,
        append: bool = False,
        sync_every: int = 256,
        sync_seconds: float = 2.0,
        flush_every: int = 1,
        flush_seconds: float = 0.5,
    ):
        self.path = Path(path)
        self.append = append
        self.sync_every, self.sync_seconds = sync_every, sync_seconds
        if is_stdout(self.path) or is_special(self.path):
            flush_every = 1
        self.flush_every, self.flush_seconds = max(1, flush_every), flush_seconds
        self.written = 0
        self._file: IO[str] | None = None
        self._opened = False
        self._lines: list[str] = []  # written but not yet flushed to the file
        self._unsynced = 0
        self._synced_at = self._flushed_at = time.monotonic()
        self._lock = threading.Lock()

    def _open(self) -> IO[str]:
        # Replaced once, by the first record: a write after close (a late reply thread) appends to what was written.
        mode = "a" if self.append or self._opened else "w"
        self._opened = True
        if is_stdout(self.path):
            return sys.stdout
        if is_special(self.path):
            return open(self.path, mode, encoding="utf-8")
        target = resolved(self.path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            return open(target, mode, encoding="utf-8")
        except OSError as e:
            raise OutputPathError(f"{self.path}: cannot write there ({e.strerror})") from e

    def write(self, record: Any) -> None:
        line = json_line(record)
        with self._lock:
            if self._file is None:
                self._file = self._open()
            self._lines.append(line)
            self.written += 1
            self._unsynced += 1
            now = time.monotonic()
            if len(self._lines) >= self.flush_every or now - self._flushed_at >= self.flush_seconds:
                self._flush()
            if self._unsynced >= self.sync_every or now - self._synced_at >= self.sync_seconds:
                self._sync()

    def _flush(self) -> None:
        if self._file is None:
            return
        try:
            if self._lines:
                self._file.write("".join(self._lines))
                self._lines.clear()
            self._file.flush()
        except BrokenPipeError:  # the reader went away (`| head`): the command ends quietly (exit status 141)
            raise
        except OSError as e:  # a full disk, a lost mount: the lines already written stay
            raise OutputPathError(f"{self.path}: cannot write there ({e.strerror})") from e
        self._flushed_at = time.monotonic()

    def sync(self) -> None:
        """Everything written so far on disk (a no-op for standard output and special files)."""
        with self._lock:
            self._sync()

    def _sync(self) -> None:
        if self._file is None or self._unsynced == 0:
            return
        self._flush()
        if self._file is not sys.stdout and not is_special(self.path):
            try:
                os.fsync(self._file.fileno())
            except OSError as e:
                raise OutputPathError(f"{self.path}: cannot write there ({e.strerror})") from e
        self._unsynced = 0
        self._synced_at = time.monotonic()

    def close(self) -> None:
        with self._lock:
            if self._file is None:
                return
            try:
                self._sync()
            finally:
                if self._file is not sys.stdout:
                    self._file.close()
                self._file = None

    def __enter__(self) -> JsonLines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
