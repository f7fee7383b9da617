"""The conv pair kernel compiled for sm_90 without a GPU (ptxas and cuobjdump from the Triton wheel): registers a
thread, spills and shared memory for every tile offered, by channel count. What MAX_PAIR_CHANNELS rests on.

    python3 bench/conv_pair_registers.py [--channels 16 32 64 128] [--json FILE]
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
from yolojet.kernels.conv import pair
from yolojet.kernels.conv.pair import ConvPairTile, _PairBlocks


def compile_pair(tile: ConvPairTile, c_in: int, c_mid: int, c_out: int, residual: bool = True) -> dict:
    blocks = _PairBlocks.of(tile, 1, 20, 20, c_mid, c_out)
    kernel = pair._conv_pair_kernel
    names = kernel.arg_names
    constants = dict(
        ACT1=ACTIVATIONS["silu"],
        ACT2=ACTIVATIONS["silu"],
        HAS_RESIDUAL=residual,
        TILE_H=tile.tile_h,
        TILE_W=tile.tile_w,
        BLOCK_P=blocks.block_p,
        BLOCK_Q=blocks.block_q,
        BLOCK_MID=blocks.block_mid,
        BLOCK_N=blocks.block_n,
        BLOCK_K=min(64, pair._block(min(c_in, c_mid))),
        PDL=True,
    )
    signature = {}
    for name in names:
        if name in constants:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = "*fp32" if name in ("b1_ptr", "b2_ptr") else "*fp16"
        else:
            signature[name] = "i32"
    aligned = [n for n in names if n.endswith("_ptr") or n.startswith("stride") or n.startswith("C_")]
    source = ASTSource(
        kernel,
        signature,
        constexprs={(names.index(k),): v for k, v in constants.items()},
        attrs={(names.index(n),): [["tt.divisibility", 16]] for n in aligned},
    )
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": tile.num_warps})
    cuobjdump = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([str(cuobjdump), "-res-usage", cubin.name], capture_output=True, text=True).stdout
    line = next(row for row in usage.splitlines() if "REG:" in row)
    registers = int(re.search(r"REG:(\d+)", line).group(1))
    stack = int(re.search(r"STACK:(\d+)", line).group(1))
    return {"registers": registers, "stack_bytes": stack, "shared_bytes": compiled.metadata.shared}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--channels", type=int, nargs="+", default=[16, 32, 64, 128])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for channels in args.channels:
        for tile in [ConvPairTile(*t) for t in pair._PAIR_TILES]:
            try:
                row = {"channels": channels, "tile": [tile.tile_h, tile.tile_w, tile.num_warps],
                       **compile_pair(tile, channels, channels, channels)}  # fmt: skip
            except Exception as error:  # a compile that fails is a row of the table too
                row = {"channels": channels, "tile": [tile.tile_h, tile.tile_w], "error": str(error).splitlines()[-1]}
            rows.append(row)
            print(row, flush=True)
    print(f"triton {triton.__version__}, sm_90")
    print(f"{'channels':>8} {'tile':>10} {'regs':>5} {'stack B':>8} {'smem B':>7}")
    for row in rows:
        tile = "x".join(str(v) for v in row["tile"][:2]) + (f"/{row['tile'][2]}w" if len(row["tile"]) > 2 else "")
        if "error" in row:
            print(f"{row['channels']:>8} {tile:>10} error: {row['error'][:80]}")
        else:
            usage = f"{row['registers']:>5} {row['stack_bytes']:>8} {row['shared_bytes']:>7}"
            print(f"{row['channels']:>8} {tile:>10} {usage}")
    if args.json:
        args.json.write_text(json.dumps({"triton": triton.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
