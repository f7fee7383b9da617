"""Where images come from: files, globs and directories expanded to image files, files and http(s) URLs read into
memory; video files, streams and cameras refused with a message saying so."""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import warnings
from pathlib import Path

from yolojet.errors import ImageReadError, YolojetWarning
from yolojet.options import keeping_freed_memory_off

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff"}
VIDEO_SUFFIXES = {".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".mpg", ".mpeg", ".wmv", ".flv", ".ts", ".asf"}
STREAM_SCHEMES = ("rtsp://", "rtsps://", "rtmp://", "rtp://", "udp://", "tcp://", "srt://")
URL_SCHEMES = ("http://", "https://")
URL_TIMEOUT_S = 30.0
URL_MAX_BYTES = 512 << 20  # as a request to yolojet serve can be at most 64 MB, an image URL at most this
NOT_YET = "yolojet reads images only; pass decoded frames as arrays (e.g. from cv2.VideoCapture) instead"


def is_url(source: str) -> bool:
    return source.lower().startswith(URL_SCHEMES)


def refused_source(source: str) -> str | None:
    """Why `source` is not something yolojet reads (a video file, a stream, a camera index, a name no file can have),
    or None."""
    if "\0" in source:  # the system's calls would read the name up to it, or refuse it with a ValueError
        return f"{source!r}: a path with a NUL character, which no file's name can hold"
    if source.lower().startswith(STREAM_SCHEMES):
        return f"{source}: a video stream, which is not supported yet ({NOT_YET})"
    if os.path.splitext(source.rstrip("/"))[1].lower() in VIDEO_SUFFIXES:  # Path(source).suffix, at a tenth the cost
        return f"{source}: a video file, which is not supported yet ({NOT_YET})"
    if source.isdigit() and not Path(source).exists():
        return f"{source}: a camera index, which is not supported yet ({NOT_YET})"
    return None


def fetch_url(url: str) -> bytes:
    """An http(s) URL's bytes; an ImageReadError naming it (and why) where it cannot be fetched."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=URL_TIMEOUT_S) as reply:
            data = reply.read(URL_MAX_BYTES + 1)
    except urllib.error.HTTPError as e:
        raise ImageReadError(f"{url}: cannot fetch it (HTTP {e.code} {e.reason})") from None
    except urllib.error.URLError as e:
        raise ImageReadError(f"{url}: cannot fetch it ({getattr(e.reason, 'strerror', None) or e.reason})") from None
    except (OSError, ValueError) as e:  # a timeout mid-read, a malformed URL
        raise ImageReadError(f"{url}: cannot fetch it ({e})") from None
    if len(data) > URL_MAX_BYTES:
        raise ImageReadError(f"{url}: over {URL_MAX_BYTES >> 20} MB, not fetched")
    return data


def read_image_file(source: str | Path) -> bytes:
    """A file's (or an http(s) URL's) bytes; an ImageReadError naming it where it is missing, a directory,
    unreadable, or not an image source at all."""
    text = str(source)
    if isinstance(source, str) and is_url(text):
        return fetch_url(text)
    refusal = refused_source(text)
    if refusal is not None:
        raise ImageReadError(refusal)
    path = Path(source)
    try:
        return _read_whole(text)
    except FileNotFoundError:
        pattern = any(ch in str(source) for ch in "*?[")  # a glob expand_sources found nothing for
        raise ImageReadError(f"{path}: {'no image file matches it' if pattern else 'no such file'}") from None
    except IsADirectoryError:
        raise ImageReadError(f"{path}: is a directory, not an image file") from None
    except OSError as e:
        raise ImageReadError(f"{path}: cannot read it ({e.strerror})") from None


def _read_whole(path: str) -> bytes:
    """A file's bytes in as few system calls as a regular file allows (open, fstat, one read, close: 13 us for a 137
    KB JPEG against Path.read_bytes' 37 us on a 2-core machine), each of which lets go of the GIL; read to its end
    whatever its size said (a special file says 0, a growing file more)."""
    handle = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        size = os.fstat(handle).st_size
        parts = [os.read(handle, size + 1)] if size else []
        if not parts or len(parts[0]) != size:  # not what fstat said: read on to the end
            while chunk := os.read(handle, max(size, 1 << 16)):
                parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)
    finally:
        os.close(handle)


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


def _c_calls_holding_the_gil():
    """The C library's calls, and CPython's for a new bytes object, called without letting go of the GIL (None off
    Linux or where the C library lacks preadv2)."""
    try:
        libc = ctypes.PyDLL(None, use_errno=True)
        preadv2 = libc.preadv2
    except (OSError, AttributeError):
        return None
    preadv2.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_int, ctypes.c_long, ctypes.c_int]
    preadv2.restype = ctypes.c_ssize_t
    libc.lseek.argtypes, libc.lseek.restype = [ctypes.c_int, ctypes.c_long, ctypes.c_int], ctypes.c_long
    libc.open.argtypes, libc.open.restype = [ctypes.c_char_p, ctypes.c_int], ctypes.c_int
    libc.close.argtypes, libc.close.restype = [ctypes.c_int], ctypes.c_int
    new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
    new_bytes.argtypes, new_bytes.restype = [ctypes.c_void_p, ctypes.c_ssize_t], ctypes.py_object
    buffer_of = ctypes.pythonapi.PyBytes_AsString
    buffer_of.argtypes, buffer_of.restype = [ctypes.py_object], ctypes.c_void_p
    return libc, new_bytes, buffer_of


_HOLDING_THE_GIL = _c_calls_holding_the_gil()
_RWF_NOWAIT = 0x8  # preadv2: fail with EAGAIN rather than wait for the disk
_CACHED_READ_MAX = 64 << 20


def read_cached_file(path: str) -> bytes | None:
    """A local file's bytes when the whole file is in the page cache, read without letting go of the GIL (an open, a
    seek and one preadv2 with RWF_NOWAIT, a few microseconds each); None when it is not all cached, is not a plain
    readable file, or this system cannot say (then `read_image_file`, which lets go of the GIL for each call, reads it
    and names what is wrong).

    Why: every call that lets go of the GIL waits to take it back while another thread runs Python, and a feed thread
    reading a file with Python's calls lets go of it four times. A read that would wait for a disk (an uncached file,
    a network share) is refused here rather than made while holding the GIL."""
    if _HOLDING_THE_GIL is None or is_url(path) or refused_source(path) is not None:
        return None
    libc, new_bytes, buffer_of = _HOLDING_THE_GIL
    handle = libc.open(os.fsencode(path), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0))
    if handle < 0:
        return None
    try:
        size = libc.lseek(handle, 0, os.SEEK_END)
        if not 0 < size <= _CACHED_READ_MAX:  # empty, special (a pipe, a directory), or large: the ordinary path
            return None
        data = new_bytes(None, size)  # a new bytes object nothing else holds yet: filled in place, as CPython does
        vector = _IoVec(buffer_of(data), size)
        read = libc.preadv2(handle, ctypes.byref(vector), 1, 0, _RWF_NOWAIT)
        return data if read == size else None
    finally:
        libc.close(handle)


# glibc's malloc serves a block past its mmap threshold (128 KiB at the start; it rises to the largest block freed)
# from fresh pages of its own mapping and trims freed memory at the heap's top past twice that, so a file read into a
# new bytes object (a 137 KB JPEG: 34 pages) page-faults on every page it fills, again for every image of a batch. Kept
# up to these sizes, freed blocks are reused instead: reading 64 files at a time into new bytes objects took 76-100 us
# a file on a 2-core machine, 19-21 us with them (13-14 us into one reused buffer), on the main thread and on others.
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's largest (HEAP_MAX / 2): a decoded 4K frame and any file below it
TRIM_THRESHOLD_BYTES = 16 << 20  # freed memory an arena keeps at its top for the next images
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (malloc.h)


@functools.cache
def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed memory for reuse (MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES), once: what reads
    files or receives images calls it. It is the whole process's malloc: each arena (up to eight a core, one a busy
    thread) may then keep up to TRIM_THRESHOLD_BYTES freed at its top. False where YOLOJET_KEEP_FREED_MEMORY=0 or the
    C library is not glibc (no mallopt)."""
    if keeping_freed_memory_off():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )


def expand_sources(sources: list[str]) -> list[str]:
    """Files, globs and directories → the image files they name, in a stable order; a name matching nothing is kept
    as is so that loading it reports it."""
    files: list[str] = []
    for source in sources:
        path = Path(source)
        if path.is_dir():
            files += _images_below(str(path))
        elif any(ch in source for ch in "*?[") and not path.is_file():  # `photo[1].jpg` that exists is that file
            matches = sorted(glob.glob(source, recursive=True))
            named = [m for m in matches if Path(m).suffix.lower() in IMAGE_SUFFIXES and not Path(m).is_dir()]
            files += named or [source]
        else:
            files.append(source)
    return files


def _images_below(folder: str) -> list[str]:
    """The files named like images anywhere below `folder`, sorted, named as pathlib names them (`a/b.jpg` below `.`,
    not `./a/b.jpg`). A broken link or an unreadable file so named is kept, so that reading it reports it; a folder
    called 2024.jpg is searched like any other; links to folders are not followed (no cycles); a FIFO, socket or
    device so named is no image file and is passed over (reading a FIFO waits for a writer, for ever); a folder that
    cannot be listed is passed over with a warning naming it. One `scandir` a folder, whose entries say whether they
    are folders without a `stat` a file (a sixth of pathlib's `rglob` time: 100,000 files in 0.17 s against 1.10 s
    on a 2-core machine)."""
    found: list[str] = []
    folders = [folder]
    while folders:
        here = folders.pop()
        try:
            with os.scandir(here) as entries:
                for entry in entries:
                    path = entry.name if here == "." else entry.path
                    if entry.is_dir(follow_symlinks=False):
                        folders.append(path)
                    elif _suffix(entry.name).lower() in IMAGE_SUFFIXES and _is_file_to_read(entry):
                        found.append(path)
        except OSError as e:
            # Said, not failed: the other folders' images are still the run's.
            said = f"{here}: cannot list this folder ({e.strerror}); images below it are left out"
            warnings.warn(said, YolojetWarning, stacklevel=2)
            continue
    return sorted(found)


def _suffix(name: str) -> str:
    """pathlib's `suffix` of a file name: from its last dot, unless that is its first character or its last."""
    at = name.rfind(".")
    return name[at:] if 0 < at < len(name) - 1 else ""


def _is_file_to_read(entry: os.DirEntry) -> bool:
    """A regular file, a link to one, or a broken link (reported when read); not a link to a folder, nor a FIFO,
    socket or device. A regular file costs no `stat`: scandir's entry says what it is."""
    if entry.is_file(follow_symlinks=False):
        return True
    if not entry.is_symlink():
        return False
    try:
        return entry.is_file() or not os.path.exists(entry.path)
    except OSError:
        return True  # cannot be looked at: kept, so that reading it says why
