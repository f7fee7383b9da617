"""Classification's resize and crop on one GPU: the resample kernel's two load paths, each checked bit for bit
against the torch path first, then timed inside a CUDA graph of back-to-back launches (per launch, median of
replays), for the shipped photos at 224:
  - words: the frame has memory after it (as the engine stages frames), a tap's pixels load as 4-byte words;
  - bytes: the frame ends with its last byte, every pixel byte is gathered on its own.

    python bench/bench_resample.py --out results/
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support import real_photos

from yolojet.images import Frame
from yolojet.kernels.preprocess import _word_run_words
from yolojet.runtime.postprocess.classify import DeviceResamplePlan, classify_plan, classify_preprocess

LAUNCHES_PER_GRAPH = 20


def staged(frame: torch.Tensor, slack: bool) -> torch.Tensor:
    """The frame on the GPU, with 4 bytes of memory after it or none."""
    flat = torch.empty(frame.numel() + 4 * slack, dtype=torch.uint8, device="cuda")
    view = flat[: frame.numel()].view(frame.shape)
    view.copy_(frame)
    return view


def time_per_launch(launch, repeats: int) -> float:
    """Microseconds a launch, from a graph of LAUNCHES_PER_GRAPH back-to-back launches replayed `repeats` times."""
    launch()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(LAUNCHES_PER_GRAPH):
            launch()
    samples = []
    for _ in range(repeats + 5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000 / LAUNCHES_PER_GRAPH)
    return statistics.median(samples[5:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--imgsz", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    rows = []
    for name, photo in real_photos().items():
        frame = torch.from_numpy(photo)
        expected = classify_preprocess(Frame(frame.cuda(), bgr=True), args.imgsz).permute(1, 2, 0).half()
        plan = classify_plan(frame.shape[0], frame.shape[1], args.imgsz)
        device_plan = DeviceResamplePlan(plan, torch.device("cuda"))
        row = {"photo": name, "frame": list(frame.shape), "passes": [step.axis for step in plan.passes]}
        for path, slack in (("words", True), ("bytes", False)):
            source = staged(frame, slack)
            top, left, rows_read, cols_read = plan.window
            window = source[top : top + rows_read, left : left + cols_read]
            row[f"{path}_loaded"] = _word_run_words(window, device_plan.first_axis, device_plan.first[0].shape[1], True)
            out = torch.full((*plan.crop, 3), float("nan"), dtype=torch.float16, device="cuda")
            device_plan(out, source, bgr=True)
            row[f"{path}_equal"] = bool(torch.equal(out, expected))
            row[f"{path}_us"] = time_per_launch(lambda o=out, s=source, p=device_plan: p(o, s, bgr=True), args.repeats)
        rows.append(row)
        print(row, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "resample.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    print(f"\n{torch.cuda.get_device_name()}, classify resize and crop to {args.imgsz}, fp16, us a launch\n")
    print("| photo | frame | words | bytes | bit-identical |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['photo']} | {r['frame'][0]}x{r['frame'][1]} | {r['words_us']:.2f} ({r['words_loaded']} words) | "
              f"{r['bytes_us']:.2f} | {r['words_equal'] and r['bytes_equal']} |")  # fmt: skip


if __name__ == "__main__":
    main()
