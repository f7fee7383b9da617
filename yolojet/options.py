"""The engine's options that fronts (the CLI, the server) offer before anything heavy is imported, and the one
place that reads the environment variables yolojet honours (each read when asked, never at import):

  YOLOJET_CACHE            the folder of the tuning and model caches (default ~/.cache/yolojet)
  YOLOJET_NOTUNE=1         untimed default conv tiles (`--no-tune`)
  YOLOJET_PDL=0            no programmatic dependent launch (`--no-pdl`)
  YOLOJET_BRANCHES=0       every launch in order on one stream (`--no-branches`)
  YOLOJET_COMPILE_WORKERS  compile worker processes: a count, or 0 to compile in this process
  YOLOJET_TOKEN            the bearer token `yolojet serve` requires
  YOLOJET_COMMIT           the commit timings name, where the code is a copy without .git (a benchmark machine)
  YOLOJET_SWITCH_INTERVAL_MS  the interpreter's switch interval in the processes yolojet starts (`switch_interval_s`)
  YOLOJET_KEEP_FREED_MEMORY=0  glibc's malloc left as it starts (`images.sources.keep_freed_memory` does nothing)
  TRITON_INTERPRET=1       Triton's own switch: kernels run on the CPU through its interpreter
  NVIMGCODEC_EXTENSIONS_PATH  nvImageCodec's own: where a user's setting is kept, yolojet does not set its own
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from yolojet.errors import EngineConfigError

# How files and bytes are decoded (yolojet/images/decoders.py).
DECODER_NAMES = ("auto", "nvimgcodec", "hardware", "cpu", "nvjpeg")
EVENT_LOOPS = ("auto", "uvloop", "asyncio")  # yolojet serve's event loop (serve/server.py's run_server)
MPS_CHOICES = ("auto", "on", "off")  # yolojet serve --processes --mps (scale/mps.py)
# Pillow's own decompression-bomb bound (PIL.Image.MAX_IMAGE_PIXELS): about 9,459 x 9,459.
DEFAULT_MAX_PIXELS = 89_478_485


@dataclass(frozen=True)
class EngineOptions:
    """How the engine builds and launches its kernels: the switches every front offers (the CLI's --no-tune,
    --no-fuse, --no-pdl and --no-branches; Engine.load's keywords of the same names), carried as one value to the
    network, its lowering and its launches. None: on wherever the machine and the environment allow."""

    tune: bool | None = None  # conv tiles timed at start-up (cached); None: unless YOLOJET_NOTUNE=1
    fuse: bool = True  # SPPF's pools in one launch, upsamples and concat copies folded into convs, the pooled head
    pdl: bool | None = None  # programmatic dependent launch; None: on Hopper and later unless YOLOJET_PDL=0
    branches: bool | None = None  # independent launches on parallel streams; None: on a CUDA device unless
    # YOLOJET_BRANCHES=0

    def tuning(self) -> bool:
        return not tuning_off() if self.tune is None else self.tune

    def overridden(self, **keywords: Any) -> EngineOptions:
        """These options with each keyword that differs from its default in place of the option of its name
        (Engine.load's tune=, fuse=, pdl= and branches= beside its switches=)."""
        defaults = EngineOptions()
        return replace(self, **{k: v for k, v in keywords.items() if v != getattr(defaults, k)})


def mps_directories() -> dict[str, str | None]:
    """CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY as the environment has them: CUDA's own variables, which
    name an MPS daemon its clients connect to (scale/mps.py starts one only where none is named)."""
    return {key: os.environ.get(key) for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")}


def serve_token() -> str | None:
    """The bearer token `yolojet serve` requires, from YOLOJET_TOKEN (a flag would show in the process list)."""
    token = os.environ.get("YOLOJET_TOKEN", "").strip()
    return token or None


def commit_given() -> str | None:
    """The commit a copy of the code says it is (YOLOJET_COMMIT), for timings measured where git cannot tell."""
    return os.environ.get("YOLOJET_COMMIT", "").strip() or None


def cache_dir() -> Path:
    """Where tuned tiles and exported models are kept (YOLOJET_CACHE)."""
    return Path(os.environ.get("YOLOJET_CACHE", Path.home() / ".cache" / "yolojet"))


def tuning_off() -> bool:
    return os.environ.get("YOLOJET_NOTUNE") == "1"


def pdl_off() -> bool:
    return os.environ.get("YOLOJET_PDL") == "0"


def branches_off() -> bool:
    return os.environ.get("YOLOJET_BRANCHES") == "0"


def compile_workers_asked() -> int | None:
    """YOLOJET_COMPILE_WORKERS as a count (0: compile in this process), or None where unset or not a number."""
    asked = os.environ.get("YOLOJET_COMPILE_WORKERS", "").strip()
    return int(asked) if asked.isdigit() else None


def keeping_freed_memory_off() -> bool:
    return os.environ.get("YOLOJET_KEEP_FREED_MEMORY") == "0"


def switch_interval_s() -> float | None:
    """YOLOJET_SWITCH_INTERVAL_MS in seconds, or None where unset: how long a thread running Python code may keep the
    GIL while another waits to take it back (the interpreter's default is 5 ms). Every call that lets go of the GIL (a
    decode, a file read, a socket write) waits up to that long to go on when another thread is busy computing in
    Python: a shorter one helps where a deployment's own threads do that (the decode beside such a thread: 34 → 860
    img/s at 0.2 ms), not yolojet's own stream, whose threads hand work on (measured on an H200: bench/NOTES.md)."""
    asked = os.environ.get("YOLOJET_SWITCH_INTERVAL_MS", "").strip()
    if not asked:
        return None
    try:
        milliseconds = float(asked)
    except ValueError:
        milliseconds = float("nan")
    if not 0 < milliseconds <= 1000:  # NaN fails too
        raise EngineConfigError(f"YOLOJET_SWITCH_INTERVAL_MS={asked!r}: expected milliseconds in (0, 1000]")
    return milliseconds / 1000


def apply_switch_interval() -> None:
    """This process's switch interval from YOLOJET_SWITCH_INTERVAL_MS where it is set: the processes yolojet starts
    (its commands, and the worker processes of its servers and labelers) call it first. A library user's process is
    the user's to set (`sys.setswitchinterval`)."""
    seconds = switch_interval_s()
    if seconds is not None:
        sys.setswitchinterval(seconds)


def nvimgcodec_extensions_given() -> bool:
    """Whether the user named nvImageCodec's extension folder (NVIMGCODEC_EXTENSIONS_PATH, nvImageCodec's variable)."""
    return bool(os.environ.get("NVIMGCODEC_EXTENSIONS_PATH", "").strip())


def name_nvimgcodec_extensions(folder: Path) -> None:
    """Set NVIMGCODEC_EXTENSIONS_PATH for nvImageCodec's import in this process (and the processes it starts)."""
    os.environ["NVIMGCODEC_EXTENSIONS_PATH"] = str(folder)


def interpreting() -> bool:
    """Whether Triton runs kernels through its CPU interpreter (TRITON_INTERPRET=1, Triton's own variable)."""
    return os.environ.get("TRITON_INTERPRET") == "1"
