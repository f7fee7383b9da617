"""Test-session setup shared by every test.

Without a CUDA device the kernel tests run under Triton's interpreter. The flag must be set before
triton is first imported, which is why it lives here rather than in the kernel test files alone.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Print the architectures whose export was checked against ultralytics in this run."""
    from support import VERIFIED

    if not VERIFIED:
        return
    terminalreporter.section("architectures verified against ultralytics (max |err| / max |ref|)")
    for cfg, imgsz, head, errors in sorted(VERIFIED):
        worst = max(errors)
        terminalreporter.write_line(f"{cfg:<22} {imgsz[0]:>4}x{imgsz[1]:<4} {head:<9} {worst:.2e}")
