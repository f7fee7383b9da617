"""Registers, spills and the resident warps an SM allows for the decode kernel, compiled for sm_90 on any machine.

The decode's launch is captured with a stand-in launcher (nothing runs), then compiled by Triton for sm_90 and
assembled by the ptxas Triton ships, with and without NMS's best-class pass folded in, for each (warps, BLOCK_A):

    python3 bench/decode_registers.py
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget

import yolojet.kernels.decode as decode
from yolojet.kernels.nms import BestClassTargets

REGISTERS_PER_SM = 65536
MAX_WARPS_PER_SM = 64
DTYPES = {torch.float32: "*fp32", torch.float16: "*fp16", torch.int32: "*i32", torch.uint8: "*u8"}


def captured_launch(best: bool, block_a: int) -> dict:
    """The decode kernel's arguments for yolo11n's head at 640x480 (80 classes, reg_max 16), by name."""
    found: dict = {}

    def stand_in(kernel, grid, pdl, compile_only=False):
        def call(*args, **named):
            found.update(zip(kernel.arg_names, args, strict=False))  # the positional ones
            found.update(named, PDL=pdl)

        return call

    sizes = [(60, 80), (30, 40), (15, 20)]
    anchors = sum(h * w for h, w in sizes)
    boxes = [torch.zeros(1, h, w, 64, dtype=torch.float16) for h, w in sizes]
    scores = [torch.zeros(1, h, w, 80, dtype=torch.float16) for h, w in sizes]
    targets = None
    if best:
        targets = BestClassTargets(
            torch.zeros(1, anchors), torch.zeros(1, anchors, dtype=torch.int32), torch.tensor([0.25, 0.7]), None
        )
    spec = decode.DecodeSpec(task="detect", nc=80, reg_max=16, strides=(8, 16, 32))
    launcher, block = decode.network_launcher, decode._BLOCK_A
    decode.network_launcher, decode._BLOCK_A = stand_in, block_a
    try:
        decode.decode_heads(torch.zeros(1, 84, anchors), boxes, scores, None, spec, best=targets, pdl=True)
    finally:
        decode.network_launcher, decode._BLOCK_A = launcher, block
    return found


def compiled(values: dict, warps: int) -> tuple[int, str]:
    kernel = decode._decode_kernel
    signature, constants = {}, {}
    for name, param in zip(kernel.arg_names, kernel.params, strict=True):
        value = values[name]
        if param.is_constexpr:
            signature[name], constants[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name] = DTYPES[value.dtype]
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            signature[name] = "i64" if abs(int(value)) >= 2**31 else "i32"
    source = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constants)
    built = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
        ptx.write(built.asm["ptx"])
        ptx.flush()
        said = subprocess.run([ptxas, "-arch=sm_90a", "-v", ptx.name, "-o", os.devnull], capture_output=True, text=True)
    report = said.stdout + said.stderr
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    spills = re.search(r"(\d+) bytes spill stores", report)
    return registers, spills.group(1) if spills else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=["4x32", "4x64", "8x64", "8x32"], help="WARPSxBLOCK_A pairs")
    args = parser.parse_args()
    print("| best-class pass | warps | BLOCK_A | registers | spill bytes | warps an SM holds |")
    print("|---|---|---|---|---|---|")
    for config in args.configs:
        warps, block_a = (int(v) for v in config.split("x"))
        for best in (False, True):
            registers, spills = compiled(captured_launch(best, block_a), warps)
            per_warp = -(-registers // 8) * 8 * 32  # registers are given out 8 a thread at a time
            resident = min(REGISTERS_PER_SM // (per_warp * warps) * warps, MAX_WARPS_PER_SM)
            print(f"| {'yes' if best else 'no'} | {warps} | {block_a} | {registers} | {spills} | {resident} |")


if __name__ == "__main__":
    main()
