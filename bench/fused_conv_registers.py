"""The fused conv kernels (a 3x3 pair, a separable conv) compiled for sm_90 without a GPU (ptxas and cuobjdump from
the Triton wheel): registers a thread, spills and shared memory for every tile offered, by channel count. What the
pair's MAX_PAIR_CHANNELS rests on.

    python3 bench/fused_conv_registers.py [--channels 16 32 64 80 128] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

if __name__ == "__main__":  # compiled kernels, not the interpreter's, whatever the shell says (before any import)
    os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from yolojet.kernels.activations import ACTIVATIONS
from yolojet.kernels.conv import pair, separable
from yolojet.kernels.conv.pair import ConvPairTile, _PairBlocks


def compile_for_sm90(kernel, constants: dict, warps: int, fp32_pointers: tuple[str, ...]) -> dict:
    """Registers a thread, stack (spills) and shared memory of `kernel` compiled for sm_90 with these constants: fp16
    pointers but `fp32_pointers`, 32-bit integers, everything 16-divisible as the engine's aligned views are."""
    names = kernel.arg_names
    signature = {}
    for name in names:
        if name in constants:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = "*fp32" if name in fp32_pointers else "*fp16"
        else:
            signature[name] = "i32"
    aligned = [n for n in names if n.endswith("_ptr") or n.startswith("stride") or n.startswith("C_")]
    source = ASTSource(
        kernel,
        signature,
        constexprs={(names.index(k),): v for k, v in constants.items()},
        attrs={(names.index(n),): [["tt.divisibility", 16]] for n in aligned},
    )
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    cuobjdump = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([str(cuobjdump), "-res-usage", cubin.name], capture_output=True, text=True).stdout
    line = next(row for row in usage.splitlines() if "REG:" in row)
    registers = int(re.search(r"REG:(\d+)", line).group(1))
    stack = int(re.search(r"STACK:(\d+)", line).group(1))
    return {"registers": registers, "stack_bytes": stack, "shared_bytes": compiled.metadata.shared}


SILU = ACTIVATIONS["silu"]
SEPARABLE_FP32 = ("dw_bias_ptr", "pw_bias_ptr", "pw2_bias_ptr")
PAIR_FP32 = ("b1_ptr", "b2_ptr", "b3_ptr")


def pair_rows(channels: int) -> list[tuple[str, dict]]:
    """The 3x3 pair kernel, every tile offered, `channels` in, hidden and out; and with a 1x1 conv of `channels`
    after it (a detect head's box branch)."""
    rows = []
    for third in (False, True):
        for tile in [ConvPairTile(*t) for t in pair._PAIR_TILES]:
            blocks = _PairBlocks.of(tile, 1, 20, 20, channels, channels)
            constants = dict(
                ACT1=SILU, ACT2=SILU, ACT3=ACTIVATIONS["identity"], HAS_RESIDUAL=not third, THIRD_1X1=third,
                TILE_H=tile.tile_h, TILE_W=tile.tile_w, BLOCK_P=blocks.block_p, BLOCK_Q=blocks.block_q,
                BLOCK_MID=blocks.block_mid, BLOCK_N=blocks.block_n, BLOCK_N3=blocks.block_n,
                BLOCK_K1=min(64, pair._block(channels)), BLOCK_K2=min(64, pair._block(channels)), PDL=True,
            )  # fmt: skip
            label = f"pair{'+1x1' if third else ''} {tile.tile_h}x{tile.tile_w}/{tile.num_warps}w"
            rows.append((label, lambda c=constants, w=tile.num_warps: compile_for_sm90(
                pair._conv_pair_kernel, c, w, PAIR_FP32)))  # fmt: skip
    return rows


def separable_rows(channels: int) -> list[tuple[str, dict]]:
    """The separable kernel (3x3 depthwise, stride 1), every tile offered, `channels` in and out; and with a second
    1x1 conv of `channels` after it (a detect head's class branch)."""
    rows = []
    for second in (False, True):
        for tile in separable.separable_candidate_tiles(channels, channels):
            constants = dict(
                KH=3, KW=3, STRIDE=1, PAD=1, ACT1=SILU, ACT2=SILU, ACT3=ACTIVATIONS["identity"], HAS_RESIDUAL=False,
                SECOND_1X1=second, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_N2=tile.block_n,
                BLOCK_K=tile.block_k, PDL=True,
            )  # fmt: skip
            kind = "separable+1x1" if second else "separable"
            label = f"{kind} {tile.block_m}x{tile.block_n}x{tile.block_k}/{tile.num_warps}w"
            rows.append((label, lambda c=constants, w=tile.num_warps: compile_for_sm90(
                separable._separable_conv_kernel, c, w, SEPARABLE_FP32)))  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--channels", type=int, nargs="+", default=[16, 32, 64, 80, 128])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for channels in args.channels:
        for label, compile_row in [*pair_rows(channels), *separable_rows(channels)]:
            try:
                row = {"channels": channels, "kernel": label, **compile_row()}
            except Exception as error:  # a compile that fails is a row of the table too
                row = {"channels": channels, "kernel": label, "error": str(error).splitlines()[-1]}
            rows.append(row)
            print(row, flush=True)
    print(f"triton {triton.__version__}, sm_90")
    print(f"{'channels':>8} {'kernel':<28} {'regs':>5} {'stack B':>8} {'smem B':>7}")
    for row in rows:
        if "error" in row:
            print(f"{row['channels']:>8} {row['kernel']:<28} error: {row['error'][:80]}")
        else:
            usage = f"{row['registers']:>5} {row['stack_bytes']:>8} {row['shared_bytes']:>7}"
            print(f"{row['channels']:>8} {row['kernel']:<28} {usage}")
    if args.json:
        args.json.write_text(json.dumps({"triton": triton.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
