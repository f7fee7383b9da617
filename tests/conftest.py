"""Test-session setup shared by every test.

Without a CUDA device the kernel tests run under Triton's interpreter. The flag must be set before
triton is first imported, which is why it lives here rather than in the kernel test files alone.
On a GPU, TF32 is turned off so that ultralytics' own fp32 forward passes are fp32.
"""

import os
from importlib.util import find_spec
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The tests hold fp32 engines to ultralytics' fp32 forward passes; on a GPU torch would run those cuDNN
# convolutions in TF32 (10-bit mantissas) by default, which is no reference at 1e-4.
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False


# The Ray paths' tests import ray, which the dev extra installs; an environment without it (a GPU machine's image)
# leaves them out and says so in the summary, rather than failing their collection.
RAY_MISSING = find_spec("ray") is None
collect_ignore_glob = ["scale/test_ray_*.py"] if RAY_MISSING else []


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Say which tests were left out for want of ray; print the architectures whose export was checked against
    ultralytics in this run."""
    from support import VERIFIED

    if RAY_MISSING:
        terminalreporter.write_line("ray is not installed: tests/scale/test_ray_*.py were not collected")

    if not VERIFIED:
        return
    terminalreporter.section("architectures verified against ultralytics (max |err| / max |ref|)")
    for cfg, imgsz, head, errors in sorted(VERIFIED):
        worst = max(errors)
        terminalreporter.write_line(f"{cfg:<22} {imgsz[0]:>4}x{imgsz[1]:<4} {head:<9} {worst:.2e}")


def pytest_runtest_logreport(report):
    """With YOLOJET_LIVE_FAILURES=1 (bench/gpu_check.sh sets it), print each failure's traceback as it happens, so
    that a run cut short by a time limit still shows why the tests before the cut failed."""
    if report.failed and os.environ.get("YOLOJET_LIVE_FAILURES") == "1":
        import sys

        print(f"\nFAILED {report.nodeid} ({report.when})\n{report.longreprtext}\n", file=sys.stderr, flush=True)


# The tests that build whole models, run kernels under the interpreter, or start servers: minutes each on two cores.
# `make test-fast` (pytest -m "not slow") runs the rest: the file formats, outputs, CLI parsing and errors, the
# protocols on hand-worked cases, the scheduler.
SLOW = (
    "pipeline",
    "kernels",
    "engine",
    "export",
    "client/test_label.py",
    "serve/test_service.py",
    "serve/test_serve_command.py",
    "eval/test_val_protocol.py",
    "eval/test_val.py",
    "eval/test_val_tasks.py",
    "eval/test_report.py",
    "test_cli_detect.py",
    "scale",
)


def pytest_collection_modifyitems(config, items):
    tests = Path(__file__).parent
    cuda = torch.cuda.is_available()
    for item in items:
        gpu = item.get_closest_marker("gpu")
        if gpu is not None and not cuda:
            item.add_marker(pytest.mark.skip(reason=gpu.kwargs.get("reason", "needs a CUDA GPU")))
        where = Path(item.fspath).relative_to(tests).as_posix()
        if any(where == slow or where.startswith(slow + "/") for slow in SLOW):
            item.add_marker(pytest.mark.slow)
