"""The one-to-one selection of YOLO26's end-to-end head alone: the reference's torch ops (what the engine ran before)
against our kernels (yolojet/kernels/one_to_one.py), on one GPU.

For each head (yolo26n: 8,400 anchors at 640 pixels, 80 classes; yolo26n-pose: 1 class and 51 keypoint values),
batch and kind of scores (independent random sigmoids, or correlated: each anchor's classes share a base logit, so
the best anchors hold many of the best pairs), on a fresh random decoded head tensor: run both once and check
that they select the same scores (as sorted multisets, exactly: torch.topk's order among equal scores is
unspecified); then capture each in a CUDA graph and time --iters replays with CUDA events after --warmup
(p20 / p50 / p80): the torch ops (with the copy into the output the engine made), our kernels as the engine
launches them (programmatic dependent launch where the GPU has it) and without it. With --profile, the device
time of each kernel of ours a replay. Writes JSON to --out and prints a markdown table last; exits 1 if any
check failed.

    python bench/bench_one_to_one.py --out bench/results/one_to_one.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from yolojet.ir import Node
from yolojet.kernels.one_to_one import OneToOneScratch, select_one_to_one
from yolojet.kernels.pdl import pdl_available
from yolojet.reference.executor import OPS as REFERENCE_OPS
from yolojet.timing import Timing, provenance, time_on_device

DEVICE = "cuda"
# (anchors, classes, extra values an anchor): YOLO26 heads at 640 pixels.
HEADS = {"yolo26n": (8400, 80, 0), "yolo26n-pose": (8400, 1, 51)}
MAX_DET = 300


def decoded_head(batch: int, anchors: int, nc: int, extra: int, scores: str, seed: int) -> torch.Tensor:
    """(batch, 4 + nc + extra, anchors) as the decode writes it: boxes in pixels, sigmoid scores, extras."""
    g = torch.Generator().manual_seed(seed)
    boxes = torch.rand(batch, 4, anchors, generator=g) * 640
    logits = torch.randn(batch, nc, anchors, generator=g) * 2
    if scores == "correlated":
        logits = torch.randn(batch, 1, anchors, generator=g) * 2 + logits / 4
    extras = torch.randn(batch, extra, anchors, generator=g)
    return torch.cat([boxes, logits.sigmoid(), extras], 1).contiguous().to(DEVICE)


def time_replays(run: Callable[[], object], iters: int, warmup: int) -> Timing:
    """Device time of each replay of `run` captured in a CUDA graph (run once before, so nothing compiles inside)."""
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return time_on_device(graph.replay, iters, warmup)


def kernel_times(run: Callable[[], object], replays: int = 20) -> dict[str, float]:
    """Device µs a run of each kernel inside `run`, from the profiler, over `replays` runs."""
    from torch.profiler import ProfilerActivity, profile

    run()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            run()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for event in prof.events():
        if event.device_type.name == "CUDA":
            us = event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
            totals[event.name[:60]] = totals.get(event.name[:60], 0.0) + us / replays
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def quantiles_ms(timing: Timing) -> dict[str, float]:
    return {"p20": timing.p20 * 1000, "p50": timing.p50 * 1000, "p80": timing.p80 * 1000}


def bench_case(
    model: str, anchors: int, nc: int, extra: int, batch: int, scores: str, iters: int, warmup: int, profile: bool
) -> dict:
    preds = decoded_head(batch, anchors, nc, extra, scores, seed=batch * 31 + nc)
    node = Node("one2one", "topk", ["preds"], ["rows"], {"nc": nc, "max_det": MAX_DET})
    k = min(MAX_DET, anchors)
    torch_out = torch.full((batch, k, 6 + extra), float("nan"), device=DEVICE)
    ours = torch.full_like(torch_out, float("nan"))
    scratch = OneToOneScratch.allocate(batch, anchors, nc, extra, MAX_DET, DEVICE)
    pdl = pdl_available(preds.device)

    def torch_ops() -> None:
        torch_out.copy_(REFERENCE_OPS["topk"](node, [preds], {})[0])

    def kernels(pdl: bool = pdl) -> None:
        select_one_to_one(ours, preds, nc=nc, max_det=MAX_DET, scratch=scratch, pdl=pdl)

    torch_ops()
    kernels()
    same = bool(torch.equal(ours[..., 4].sort(-1).values, torch_out[..., 4].sort(-1).values))
    row = {"model": model, "batch": batch, "scores": scores, "pdl": pdl, "same_scores": same}
    row["same_rows"] = bool(torch.equal(ours, torch_out))  # informative only: ties may be ordered differently
    row["torch_ms"] = quantiles_ms(time_replays(torch_ops, iters, warmup))
    row["kernels_ms"] = quantiles_ms(time_replays(kernels, iters, warmup))
    if pdl:
        row["kernels_no_pdl_ms"] = quantiles_ms(time_replays(lambda: kernels(False), iters, warmup))
    if profile:
        row["kernel_us"] = kernel_times(kernels)
    return row


def table(rows: list[dict]) -> str:
    lines = [
        f"{torch.cuda.get_device_name()}: one-to-one selection, max_det {MAX_DET}, CUDA-graph replays, p50 ms",
        "",
        "| head | batch | scores | same scores | torch ops | our kernels | without PDL | torch / ours |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['batch']} | {r['scores']} | failed: {r['error'][:200]} |")
            continue
        t, k = r["torch_ms"]["p50"], r["kernels_ms"]["p50"]
        no_pdl = f"{r['kernels_no_pdl_ms']['p50']:.3f}" if "kernels_no_pdl_ms" in r else "-"
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['scores']} | {r['same_scores']} | {t:.3f} | {k:.3f} | {no_pdl} "
            f"| {t / k:.2f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", nargs="+", default=list(HEADS), choices=list(HEADS))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 64])
    parser.add_argument(
        "--scores", nargs="+", default=["independent", "correlated"], choices=["independent", "correlated"]
    )
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--profile", action="store_true", help="also the device time of each of our kernels")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for model in args.heads:
        anchors, nc, extra = HEADS[model]
        for batch in args.batches:
            for scores in args.scores:
                try:
                    row = bench_case(model, anchors, nc, extra, batch, scores, args.iters, args.warmup, args.profile)
                except Exception as e:  # one case failing must not cost the others' numbers
                    row = {"model": model, "batch": batch, "scores": scores, "error": f"{type(e).__name__}: {e}"}
                rows.append(row)
                print(json.dumps(row), flush=True)
                args.out.write_text(json.dumps({"provenance": provenance(), "rows": rows}, indent=1))
    print(table(rows))
    return 0 if all(r.get("same_scores") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
