"""How close yolojet's widest convs come to the chip: each conv against a plain GEMM of the same sizes.

For each conv shape (by default yolo11m's largest at batch 64; `--shapes yolo11n-narrow` for yolo11n's narrow stride-1
3x3 convs), every tile candidate the engine would time is checked against torch's fp32 conv of the same fp16 values (its
output poisoned with NaN first), then timed here too (median of CUDA-event-timed runs); the best within the 1e-2 gate is
kept, and the run fails if any tile is over it. Beside it, three ceilings for the same M = N·OH·OW, N = C_out, K =
kh·kw·C_in: yolojet's own 1x1 conv of a (M, K) input (a plain GEMM whose operands the TMA loads, every candidate checked
and timed), torch.mm (cuBLAS) and F.conv2d channels_last (cuDNN). Where the conv trails its own plain GEMM, the gathers
of the implicit GEMM cost; where both trail cuBLAS, the GEMM tiles do; `--conv-only` times the conv's candidates alone,
without the ceilings. The GPU's SM clock and power are sampled while each shape runs, since the same kernels time
differently at different clocks.

    python bench/bench_conv_ceiling.py --out results/ [--shapes yolo11n-narrow] [--conv-only]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import threading
from pathlib import Path

import torch
import torch.nn.functional as F
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent))

from yolojet.kernels.conv import ConvConfig, ConvKind, conv2d_nhwc, conv_candidate_configs, tma_patch_loadable
from yolojet.timing import provenance

# (name, batch, H, W, C_in, pixel stride of the input, C_out, kernel, stride): yolo11m at 640, batch 64. A pixel
# stride above C_in is a channel slice of a concat buffer, as the engine's plan gives model.5 its input.
SHAPE_SETS = {
    "yolo11m": [
        ("yolo11m model.5", 64, 80, 80, 512, 1024, 512, 3, 2),
        ("yolo11m model.3", 64, 160, 160, 256, 256, 256, 3, 2),
        ("yolo11m model.1", 64, 320, 320, 64, 64, 128, 3, 2),
        ("yolo11m model.6.m.0.m.0.cv1", 64, 40, 40, 128, 128, 128, 3, 1),
    ],
    # yolo11n's narrow 3x3 convs at batch 64, the network's slowest launches for their bytes.
    "yolo11n-narrow": [
        ("yolo11n model.2.m.0.cv1", 64, 160, 160, 16, 48, 8, 3, 1),
        ("yolo11n model.2.m.0.cv2", 64, 160, 160, 8, 8, 16, 3, 1),
        ("yolo11n 80x80 16->32", 64, 80, 80, 16, 16, 32, 3, 1),
        ("yolo11n 80x80 32->16", 64, 80, 80, 32, 96, 16, 3, 1),
    ],
    # The three launches of yolo11n's batch 64 furthest above their bytes whose tiles gather their operands.
    "yolo11n-gather": [
        ("yolo11n model.2.m.0.cv1", 64, 160, 160, 16, 48, 8, 3, 1),
        ("yolo11n model.2.m.0.cv2", 64, 160, 160, 8, 8, 16, 3, 1),
        ("yolo11n model.1", 64, 320, 320, 16, 16, 32, 3, 2),
    ],
}
DEVICE = "cuda"
GATE = 1e-2  # relative L2 error of an fp16 output against fp32, as the engine's per-op gate


class ClockSampler:
    """nvidia-smi's SM clock (MHz) and power draw (W) every 100 ms while a block runs."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        # nvidia-smi numbers every GPU of the machine; this process's device 0 is the first CUDA_VISIBLE_DEVICES names.
        index = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
        query = ["nvidia-smi", f"--id={index}", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"]
        while not self._stop.wait(0.1):
            try:
                line = subprocess.run(query, capture_output=True, text=True, timeout=5).stdout.strip()
                clock, power = (float(v) for v in line.split(","))
            except (OSError, ValueError, subprocess.TimeoutExpired):
                continue
            self.samples.append((clock, power))

    def __enter__(self) -> ClockSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float]:
        if not self.samples:
            return {}
        clocks, powers = zip(*self.samples, strict=True)
        return {
            "sm_mhz_median": statistics.median(clocks),
            "sm_mhz_min": min(clocks),
            "power_w_median": statistics.median(powers),
        }


def median_ms(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=25, rep=150, return_mode="median"))


def best_of(configs, launch, error) -> tuple[float, ConvConfig, dict[str, float], dict[str, float]]:
    """Checks, then times, launch(config) for every config that builds: error() is the relative L2 error of the
    output launch(config) just wrote (poisoned with NaN first, so an unwritten output counts as wrong). Returns the
    best time among the configs within GATE, its config, and every config's time and error."""
    times, errors, by_name = {}, {}, {repr(c): c for c in configs}
    for config in configs:
        if config.split_k > 1:  # split K is for small M; these shapes have tens of thousands of rows
            continue
        try:
            launch(config)
            errors[repr(config)] = error()
            times[repr(config)] = median_ms(lambda c=config: launch(c))
        except Exception as failure:  # a tile that does not build on this GPU is skipped, as the tuner does
            times[repr(config)] = float("nan")
            print(f"  {config}: {type(failure).__name__}: {str(failure)[:120]}", flush=True)
    usable = {k: v for k, v in times.items() if v == v and errors[k] <= GATE}
    best = min(usable, key=usable.get)
    return usable[best], by_name[best], times, errors


def _worst(errors: list[float]) -> float:
    """The largest error, NaN (an output left unwritten) counting as the largest."""
    return math.nan if any(math.isnan(e) for e in errors) else max(errors)


def bench_shape(name, batch, h, w, c_in, pixel_stride, c_out, k, stride, ceilings: bool = True) -> dict:
    pad = k // 2
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    m, gemm_k = batch * oh * ow, k * k * c_in
    flops = 2 * m * c_out * gemm_k
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    buffer = torch.randn(batch, h, w, pixel_stride, device=DEVICE, dtype=torch.float16, generator=gen)
    x = buffer[..., :c_in]
    weight = (torch.randn(c_out, k, k, c_in, device=DEVICE, generator=gen) / gemm_k**0.5).half().contiguous()
    bias = torch.randn(c_out, device=DEVICE, generator=gen)
    out = torch.empty(batch, oh, ow, c_out, device=DEVICE, dtype=torch.float16)
    # fp32 torch on the same fp16 values is the reference every tile's output is checked against.
    reference = F.silu(
        F.conv2d(x.permute(0, 3, 1, 2).float(), weight.permute(0, 3, 1, 2).float(), bias, stride=stride, padding=pad)
    ).permute(0, 2, 3, 1)

    def conv(config):
        out.fill_(float("nan"))
        conv2d_nhwc(out, x, weight, bias, stride=stride, padding=pad, activation="silu", config=config)

    def conv_error() -> float:
        return float((out.float() - reference).norm() / reference.norm())

    row = {"shape": name, "M": m, "N": c_out, "K": gemm_k, "gflop": flops / 1e9}
    with ClockSampler() as clocks:
        # As the engine offers them: TMA tiles only where they can load this conv's operands.
        offered = [
            c
            for c in conv_candidate_configs(m, c_out, gemm_k, k == 1, c_in=c_in)
            if not c.loads_by_tma
            or (c.kind is ConvKind.TMA_PATCH and tma_patch_loadable(x, weight, (stride, stride), c.block_k))
        ]
        conv_ms, conv_config, conv_times, conv_errors = best_of(offered, conv, conv_error)
        nan = float("nan")
        gemm_ms, gemm_config, gemm_times, gemm_errors, cublas_ms, cudnn_ms = nan, None, {}, {}, nan, nan
        if ceilings:
            # The same GEMM through yolojet's 1x1 conv: a contiguous (M, K) input.
            a = torch.randn(batch, oh, ow, gemm_k, device=DEVICE, dtype=torch.float16, generator=gen)
            w1 = weight.reshape(c_out, 1, 1, gemm_k).contiguous()
            out1 = torch.empty(batch, oh, ow, c_out, device=DEVICE, dtype=torch.float16)
            gemm_reference = F.silu(a.reshape(m, gemm_k).float() @ w1.reshape(c_out, gemm_k).float().t() + bias)

            def gemm(config):
                out1.fill_(float("nan"))
                conv2d_nhwc(out1, a, w1, bias, activation="silu", config=config)

            def gemm_error() -> float:
                return float((out1.reshape(m, c_out).float() - gemm_reference).norm() / gemm_reference.norm())

            gemm_ms, gemm_config, gemm_times, gemm_errors = best_of(
                conv_candidate_configs(m, c_out, gemm_k, True), gemm, gemm_error
            )
            a2 = a.reshape(m, gemm_k)
            b2 = w1.reshape(c_out, gemm_k).t()
            cublas_ms = median_ms(lambda: torch.mm(a2, b2))
            x_cl = x.permute(0, 3, 1, 2)  # NHWC memory: channels_last already
            w_cl = weight.permute(0, 3, 1, 2)
            cudnn_ms = median_ms(lambda: F.conv2d(x_cl, w_cl, None, stride=stride, padding=pad))
    row.update(
        conv_ms=conv_ms,
        conv_config=repr(conv_config),
        conv_candidates=conv_times,
        conv_errors=conv_errors,
        gemm_ms=gemm_ms,
        gemm_config=repr(gemm_config),
        gemm_candidates=gemm_times,
        gemm_errors=gemm_errors,
        worst_rel_l2=_worst([*conv_errors.values(), *gemm_errors.values()]),
        cublas_ms=cublas_ms,
        cudnn_ms=cudnn_ms,
        clocks=clocks.summary(),
    )
    for key in ("conv", "gemm", "cublas", "cudnn"):
        row[f"{key}_tflops"] = flops / row[f"{key}_ms"] / 1e9
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--shapes", choices=sorted(SHAPE_SETS), default="yolo11m", help="which convs to time")
    parser.add_argument(
        "--conv-only", action="store_true", help="the conv's candidates alone (no GEMM, cuBLAS or cuDNN ceilings)"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_conv_ceiling needs a CUDA GPU")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for shape in SHAPE_SETS[args.shapes]:
        print(f"{shape[0]} ...", flush=True)
        rows.append(row := bench_shape(*shape, ceilings=not args.conv_only))
        # Written as each shape ends, so that a run cut short by its time limit keeps the shapes it finished.
        (args.out / f"conv_ceiling-{args.shapes}.json").write_text(
            json.dumps({**provenance(), "shapes": rows}, indent=1)
        )
        print(f"  conv {row['conv_ms']:.3f} ms ({row['conv_config']})", flush=True)
    lines = [
        "| conv | M×N×K | yolojet conv | same GEMM, yolojet 1x1 | cuBLAS mm | cuDNN conv | worst tile's rel L2 "
        "| SM MHz | W |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c = r["clocks"]
        lines.append(
            f"| {r['shape']} | {r['M']}×{r['N']}×{r['K']} | {r['conv_ms']:.3f} ms, {r['conv_tflops']:.0f} TF "
            f"| {r['gemm_ms']:.3f} ms, {r['gemm_tflops']:.0f} TF "
            f"| {r['cublas_ms']:.3f} ms, {r['cublas_tflops']:.0f} TF "
            f"| {r['cudnn_ms']:.3f} ms, {r['cudnn_tflops']:.0f} TF | {r['worst_rel_l2']:.1e} "
            f"| {c.get('sm_mhz_median', float('nan')):.0f} (min {c.get('sm_mhz_min', float('nan')):.0f}) "
            f"| {c.get('power_w_median', float('nan')):.0f} |"
        )
    table = "\n".join(lines)
    (args.out / f"conv_ceiling-{args.shapes}.md").write_text(table + "\n")
    print(table)
    wrong = [r["shape"] for r in rows if not r["worst_rel_l2"] <= GATE]
    if wrong:
        sys.exit(f"tiles over the error gate {GATE:.0e} (see conv_errors and gemm_errors): {', '.join(wrong)}")


if __name__ == "__main__":
    main()
