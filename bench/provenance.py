"""What a benchmark result was measured on: the date, the GPU, torch's and Triton's versions, and the commit.

The commit is YOLOJET_COMMIT where set (a copy of the checkout on a remote machine has no .git), else git's.
"""

from __future__ import annotations

import datetime
import os
import subprocess
from pathlib import Path

import torch
import triton


def commit() -> str:
    """The short hash, with "-dirty" when tracked files differ from it (then the hash alone does not name the code)."""
    if os.environ.get("YOLOJET_COMMIT"):
        return os.environ["YOLOJET_COMMIT"]
    try:
        found = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=7", "--exclude=*"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return found.stdout.strip() if found.returncode == 0 else "?"


def provenance() -> dict[str, str]:
    return {
        "date": datetime.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "commit": commit(),
    }
