"""Images in, results out, on one GPU: the decoders and the batched image path, from JPEG files on disk.

Stages (--stages, in this order; each adds to one JSON file under --out, and a short table is printed last):
  decoders   each decoder's pixels against OpenCV's (cv2.imdecode, what ultralytics reads with) on the shipped
             JPEGs: largest level difference and share of pixels that differ; img/s decoding --batch copies of
             bus.jpg in one call (frames on the GPU, synchronized)
  contention each hardware decoder's call (nvimgcodec, hardware; --batch copies of bus.jpg's bytes, 2 s of calls)
             alone and beside a thread running Python code; how long a call holds its caller, and with the wait
             for the decode
  call       engine(list of --batch JPEG paths), yolo11n at 640, per decoder: img/s, median of --repeats calls; the
             calls again with their steps timed by thread, and the last one's timeline; beside them cv2.imdecode
             alone on the process's cores (the CPU decoder's ceiling on this machine)
  stream     engine.stream over --files JPEG files on disk (copies of bus.jpg, 1080x810), per decoder: img/s; beside
             it the decode alone (the same files through the feed, no engine) and the engine alone (staged GPU
             frames, run(--batch) repeated), whose ratio to the stream says how busy the GPU was; then the stream
             again with its steps timed by thread (waiting for chunks, submitting, collecting, making results,
             reading and checking files, the decoder's call)
  feeds      ways of feeding the hardware decoder, each over --files JPEG files, the feed alone and under
             engine.stream: a list on one feed thread (the product's) or an iterator on two (source and decode
             threads); files read by nvImageCodec itself or by Python; output images decoded into again once
             released or allocated a call
  overlap    decode beside the network: bus.jpg's bytes decoded in calls of 32 for 2 s on one thread, or on two
             with a decoder each, alone and while another thread runs run(--batch) on staged frames back to back:
             decode img/s, and the network's img/s beside it
  latency    batch 1 from a frame already on the GPU: preprocess + run + get, wall ms, median of 500; and each step's
             host time (preprocess, run_async before and after the graph's launch, sync, get)
  agreement  each decoder's detections against the CPU decoder's (OpenCV's pixels) on the shipped JPEGs and on
             awkward ones (EXIF-rotated, CMYK, progressive, grey)
  profile    where the host's time goes (cProfile, by own time): 300 batch-1 runs of a staged GPU frame, and 5 calls
             engine(list of --batch paths) with the default decoder
  startup    fresh processes: Engine.load then a first result from a JPEG path, with this run's kernel and tuning
             caches (warm), and with empty ones (cold)
  letterbox  the letterbox kernel alone on --batch copies of bus.jpg (1080x810) into 640x480 slots (rows of 4, fp16),
             device us of each candidate tile (LETTERBOX_TILES), with and without the one-store padded rows, and at
             batch 1; every tile's output checked equal to the product's; the fastest is then used by the stages
             after it (rect)
  launch     batch 1 on bus.jpg's rectangle: the host time of one graph launch (the replay call alone) of the whole
             path's graph, of the network's own graph and of a one-kernel graph, against the device time of the path's
             graph and run(1)'s wall time; with programmatic dependent launch and parallel streams each on and off
  uploads    --batch copies of bus.jpg decoded on the CPU pool's threads and moved to the GPU three ways (the CPU
             decoder's pinned copies, straight from pageable memory, a reused pinned buffer a thread): img/s
  rect       the square letterbox (rect=False) against each image's own rectangle (rect=True, 480x640 for bus.jpg):
             run(--batch) on staged GPU frames, img/s; batch 1 from a GPU frame, ms; and, in fresh processes with
             warm caches, how long the first image of a shape not yet built waits (bus.jpg then zidane.jpg, 384x640)

The model has random weights with BatchNorm statistics measured on the shipped photos (tests/support.py), so NMS
has real work; conf 0.25 as predict's default.

    python3 bench/bench_images.py --out results/ --stages decoders call stream latency agreement startup
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import faulthandler
import functools
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from yolojet.timing import Timing

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

STAGES = (
    "decoders",
    "contention",
    "call",
    "stream",
    "feeds",
    "overlap",
    "latency",
    "agreement",
    "profile",
    "startup",
    "letterbox",
    "launch",
    "rect",
    "uploads",
)
DECODERS = ("nvimgcodec", "hardware", "cpu", "nvjpeg")
STREAM_DECODERS = ["auto", "nvimgcodec", "hardware", "cpu"]  # --stream-decoders replaces them


def assets() -> Path:
    from ultralytics.utils import ASSETS

    return Path(ASSETS)


def cv2_rgb(data: bytes) -> np.ndarray:
    import cv2

    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)[..., ::-1]


def exported_model(work: Path, name: str = "yolo11n") -> Path:
    """An ultralytics architecture (yolo11n, yolo11n-seg, yolov8n-pose, ...) at 640 with random weights and calibrated
    BatchNorm statistics, exported into `work`/`name` once (a later run with the same `work` finds it there)."""
    from support import calibrated_model

    import yolojet

    model_dir = work / name
    if not (model_dir / "graph.json").exists():
        yolojet.export(calibrated_model(f"{name}.yaml", 640), out=model_dir, imgsz=640)
    return model_dir


def bus_rgb_cuda() -> torch.Tensor:
    """bus.jpg as one contiguous uint8 (H, W, 3) RGB tensor on the GPU: a camera's frame already on the device."""
    return torch.from_numpy(np.ascontiguousarray(cv2_rgb((assets() / "bus.jpg").read_bytes()))).cuda()


def awkward_jpegs() -> dict[str, bytes]:
    """The shipped JPEGs, and bus.jpg as a phone or an old scanner might store it."""
    from PIL import Image

    photo = Image.open(assets() / "bus.jpg").convert("RGB")

    def save(image, **kw) -> bytes:
        out = io.BytesIO()
        image.save(out, format="JPEG", quality=90, **kw)
        return out.getvalue()

    exif = Image.Exif()
    exif[0x0112] = 6
    stored = photo.transpose(Image.Transpose.ROTATE_90)
    return {
        "bus.jpg": (assets() / "bus.jpg").read_bytes(),
        "zidane.jpg": (assets() / "zidane.jpg").read_bytes(),
        "exif6": save(stored, exif=exif.tobytes()),
        "cmyk": save(photo.convert("CMYK")),
        "progressive": save(photo, progressive=True),
        "grey": save(photo.convert("L")),
    }


def decoder_or_none(name: str, device: torch.device):
    """`name` as make_decoder knows it, or "hardware-2lanes": the hardware decoder with two nvJPEG states."""
    from yolojet.errors import EngineConfigError
    from yolojet.images.decoders import CpuDecoder, NvjpegHardwareDecoder, make_decoder

    try:
        if name == "hardware-2lanes":
            return NvjpegHardwareDecoder(CpuDecoder(device), lanes=2)
        return make_decoder(name, device)
    except EngineConfigError as e:
        print(f"decoder {name}: not available ({e})", flush=True)
        return None


def stage_decoders(found: dict, batch: int, repeats: int) -> None:
    from yolojet.images.decoders import Encoded

    device = torch.device("cuda")
    jpegs = awkward_jpegs()
    rows = {}
    for name in DECODERS:
        decoder = decoder_or_none(name, device)
        if decoder is None:
            continue
        row: dict = {"describe": decoder.describe(), "pixels": {}}
        for photo in ("bus.jpg", "zidane.jpg"):
            data = jpegs[photo]
            decoded = decoder.decode([Encoded.of(data)])
            decoded.wait_on(torch.cuda.current_stream())
            frame = decoded.items[0]
            ours = (frame.pixels.flip(-1) if frame.bgr else frame.pixels).cpu().numpy().astype(int)
            diff = np.abs(ours - cv2_rgb(data).astype(int))
            row["pixels"][photo] = {"max": int(diff.max()), "percent_differ": float((diff.max(-1) > 0).mean() * 100)}
        row["img_per_s_by_batch"] = {}
        for size in sorted({8, 16, 32, batch}):
            items = [Encoded.of(jpegs["bus.jpg"])] * size
            samples = []
            for i in range(repeats + 2):
                torch.cuda.synchronize()
                start = time.perf_counter()
                decoded = decoder.decode(items)
                decoded.wait_on(torch.cuda.current_stream())
                torch.cuda.synchronize()
                if i >= 2:
                    samples.append(time.perf_counter() - start)
            row["img_per_s_by_batch"][size] = size / Timing(tuple(samples)).p50
        row["batch_ms"] = batch * 1000 / row["img_per_s_by_batch"][batch]
        row["img_per_s"] = row["img_per_s_by_batch"][batch]
        rows[name] = row
        decoder.close()
        by_batch = ", ".join(f"{k}: {v:,.0f}" for k, v in row["img_per_s_by_batch"].items())
        print(f"decoder {name}: img/s by batch {by_batch}; pixels {row['pixels']}", flush=True)
    found["decoders"] = rows


def stage_contention(found: dict, batch: int, seconds: float = 2.0) -> None:
    """Whether a hardware decoder's call waits for the GIL: nvImageCodec lets go of it and takes it back twice an
    image inside one batched call (reading the image's header, allocating its output), and each time back waits while
    another thread runs Python code, up to the interpreter's switch interval (5 ms); the `hardware` decoder (nvJPEG's
    C API) lets go of it once a call. Also, for `hardware`: how long the call itself holds the caller against the
    decode's whole time (whether nvJPEG returns before the hardware is done)."""
    from bench_switch import python_thread

    from yolojet.errors import EngineConfigError
    from yolojet.images.decoders import CpuDecoder, Encoded, HardwareJpegDecoder, NvjpegHardwareDecoder

    data = (assets() / "bus.jpg").read_bytes()
    chunk = [Encoded.of(data)] * batch
    rows: dict = {}
    kinds = {
        "nvimgcodec": HardwareJpegDecoder,
        "hardware": NvjpegHardwareDecoder,
        "hardware-2lanes": lambda cpu: NvjpegHardwareDecoder(cpu, lanes=2),
    }
    for name, kind in kinds.items():
        try:
            started = time.perf_counter()
            decoder = kind(CpuDecoder(torch.device("cuda")))
            start_s = time.perf_counter() - started
        except EngineConfigError as e:
            print(f"contention: no {name} decoder ({e})", flush=True)
            continue

        def decode_for(duration: float, decoder=decoder) -> float:
            done, start = 0, time.perf_counter()
            while time.perf_counter() - start < duration:
                decoder.decode(chunk)
                decoder.stream.synchronize()
                done += len(chunk)
            return done / (time.perf_counter() - start)

        decode_for(0.3)
        row: dict = {"describe": decoder.describe(), "start_s": start_s, "alone_img_per_s": decode_for(seconds)}
        with python_thread():
            row["beside_python_thread_img_per_s"] = decode_for(seconds)
        calls, wholes = [], []
        for _ in range(20):
            start = time.perf_counter()
            decoder.decode(chunk)
            returned = time.perf_counter()
            decoder.stream.synchronize()
            calls.append(returned - start)
            wholes.append(time.perf_counter() - start)
        row["call_us_per_image"] = Timing(tuple(calls)).p50 * 1e6 / batch
        row["call_and_wait_us_per_image"] = Timing(tuple(wholes)).p50 * 1e6 / batch
        decoder.close()
        print(f"contention, {name}: {json.dumps(row)}", flush=True)
        rows[name] = row
    found["contention"] = rows


def build_engine(model_dir: Path, batch: int, buckets: list[int]):
    from yolojet.engine.engine import Engine

    start = time.perf_counter()
    engine = Engine.load(model_dir, device="cuda", half=True, max_batch=batch, buckets=buckets, verbose=True)
    print(f"engine built in {time.perf_counter() - start:.1f} s ({engine.decoder.describe()})", flush=True)
    return engine


def with_decoder(engine, name: str) -> bool:
    """Swap the engine's decoder for `name`; False where it cannot run here."""
    decoder = decoder_or_none(name, engine.device)
    if decoder is None:
        return False
    engine.decoder.close()
    engine.decoder = decoder
    return True


def stage_call(found: dict, engine, files: list[Path], batch: int, repeats: int) -> None:
    from yolojet.images.decoders import cpu_threads

    paths = [str(f) for f in files[:batch]]
    threads = cpu_threads()
    rows: dict = {"opencv_alone_img_per_s": opencv_alone([Path(p).read_bytes() for p in paths], threads)}
    print(f"cv2.imdecode alone on {threads} threads: {rows['opencv_alone_img_per_s']:,.0f} img/s", flush=True)
    # hardware-2lanes: the hardware decoder with two nvJPEG states, a chunk's halves decoded side by side (not the
    # default: one stream run gave it +6.5 %, bench/NOTES.md).
    for name in ("auto", *DECODERS, "hardware-2lanes"):
        if not with_decoder(engine, name):
            continue
        engine(paths)  # warm: graphs captured, decoder started
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            results = engine(paths)
            samples.append(time.perf_counter() - start)
        assert all(r.error is None for r in results), [r.error for r in results if r.error][:3]
        ms = Timing(tuple(samples)).p50 * 1000
        # The same calls with their steps timed by thread (seconds a call), and the last call's timeline (ms from
        # its start): where a call of `batch` paths waits.
        spans: list = []
        with timed_calls(image_path_steps(engine), spans) as totals:
            for _ in range(repeats):
                spans.clear()
                call_start = time.perf_counter()
                engine(paths)
                call_end = time.perf_counter()
        timeline = [
            (thread, step, round((start - call_start) * 1e3, 3), round((end - call_start) * 1e3, 3))
            for thread, step, start, end in sorted(spans, key=lambda span: span[2])
        ]
        rows[name] = {
            "ms": ms,
            "img_per_s": batch * 1000 / ms,
            "min_ms": min(samples) * 1000,
            "steps_s_a_call": {k: v / repeats for k, v in totals.most_common()},
            "timed_call_ms": (call_end - call_start) * 1e3,
            "timeline_ms": [t for t in timeline if not t[1].startswith(("decode", "to_device", "make_results"))],
            "pool_ms": [t for t in timeline if t[1].startswith(("decode", "to_device"))][:48],
        }
        print(
            f"engine({batch} paths), {name}: {ms:.2f} ms, {batch * 1000 / ms:,.0f} img/s; a call's steps (ms): "
            + ", ".join(f"{k} {v * 1e3 / repeats:.2f}" for k, v in totals.most_common(8)),
            flush=True,
        )
    # The hardware decoder's call of `batch` paths fed as the product feeds it (two threads taking turns, each preparing
    # a chunk and decoding it) against the product before it (one thread preparing, handing whole chunks to a finishing
    # thread) and one thread doing both (both chunks prepared before the first decodes). The variants take turns, a few
    # calls each a round: timed one after another, a later one came out faster than the same configuration timed
    # earlier in 7 of 10 runs (bench/NOTES.md), a drift that turns would spread over all of them.
    if with_decoder(engine, "hardware"):
        from feed_variants import short_list_fed

        decoder = engine.decoder
        labels = ("product", "handed_over", "one_thread")
        samples: dict[str, list[float]] = {label: [] for label in labels}
        rounds = max(1, repeats // 3)
        for _ in range(rounds):
            for label in labels:
                if label == "one_thread":
                    decoder.blocking_finish = False  # the instance's, over its class's
                try:
                    with short_list_fed("handed_over" if label == "handed_over" else "product"):
                        engine(paths)
                        for _ in range(3):
                            start = time.perf_counter()
                            engine(paths)
                            samples[label].append(time.perf_counter() - start)
                finally:
                    vars(decoder).pop("blocking_finish", None)
        for label, taken in samples.items():
            ms = Timing(tuple(taken)).p50 * 1000
            rows[f"hardware_turns_{label}"] = {"ms": ms, "img_per_s": batch * 1000 / ms, "min_ms": min(taken) * 1000}
            rate = batch * 1000 / ms
            print(f"engine({batch} paths), hardware in turns, {label}: {ms:.2f} ms, {rate:,.0f} img/s", flush=True)
    found["call"] = rows


def stage_uploads(found: dict, batch: int, files: list[Path], repeats: int = 7) -> None:
    """Decoding --batch copies of bus.jpg on the CPU pool's threads and moving each frame to the GPU, three ways:
    the CPU decoder's own (`CpuDecoder.to_device`: a pinned buffer from torch's caching host allocator, a copy into
    it, an asynchronous copy to the device on the copy stream), straight from the decoded (pageable) array on the copy
    stream, and through a pinned buffer of each thread's own reused once its last copy has finished. img/s, best and
    median of `repeats`; decode alone beside them."""
    from concurrent.futures import ThreadPoolExecutor

    import cv2

    from yolojet.images.decoders import CpuDecoder, cpu_threads

    data = np.frombuffer((assets() / "bus.jpg").read_bytes(), dtype=np.uint8)
    device = torch.device("cuda")
    decoder = CpuDecoder(device)
    stream = decoder.copy_stream
    local = threading.local()

    def decoded() -> torch.Tensor:
        return torch.from_numpy(cv2.imdecode(data, cv2.IMREAD_COLOR))

    def pageable(_) -> torch.Tensor:
        pixels = decoded()
        with torch.cuda.stream(stream):
            return pixels.to(device, non_blocking=True)

    def own_pinned(_) -> torch.Tensor:
        pixels = decoded()
        held = getattr(local, "held", None)
        if held is None or held[0].numel() < pixels.numel():
            held = local.held = (torch.empty(pixels.numel(), dtype=torch.uint8, pin_memory=True), torch.cuda.Event())
        buffer, done = held
        done.synchronize()
        staged = buffer[: pixels.numel()].view(pixels.shape)
        staged.copy_(pixels)
        with torch.cuda.stream(stream):
            out = staged.to(device, non_blocking=True)
            done.record(stream)
        return out

    ways = {
        "decode_alone": lambda _: decoded(),
        "product_to_device": lambda _: decoder.to_device(decoded()),
        "pageable": pageable,
        "own_pinned": own_pinned,
    }
    rows: dict = {"threads": cpu_threads()}
    with ThreadPoolExecutor(cpu_threads()) as pool:
        for _ in range(2):
            for name, way in ways.items():
                rates = []
                for _ in range(repeats):
                    start = time.perf_counter()
                    list(pool.map(way, range(batch)))
                    stream.synchronize()
                    rates.append(batch / (time.perf_counter() - start))
                rows[name] = {"best_img_per_s": max(rates), "median_img_per_s": float(np.median(rates))}
    print("uploads: " + ", ".join(f"{k} {v['median_img_per_s']:,.0f}" for k, v in rows.items() if k != "threads"))
    decoder.close()
    rows["file_reads_us"] = file_reads(files)
    print(f"file reads (us a file): {json.dumps(rows['file_reads_us'])}", flush=True)
    found["uploads"] = rows


def file_reads(files: list[Path], rounds: int = 20) -> dict:
    """us a file (median of `rounds` passes over `files`) of reading a cached file: the hardware decoder's way
    (`read_cached_file`, a new bytes object each) with nothing kept and with the last 128 kept alive (as a feed keeps a
    chunk's bytes until its results are made), and with os.preadv into one reused buffer."""
    from yolojet.images.sources import read_cached_file

    paths = [str(f) for f in files]
    largest = max(os.path.getsize(p) for p in paths)
    reused = bytearray(largest)

    def into_buffer(path: str) -> None:
        handle = os.open(path, os.O_RDONLY)
        try:
            os.preadv(handle, [reused], 0)
        finally:
            os.close(handle)

    kept: collections.deque = collections.deque(maxlen=128)
    ways = {
        "read_cached_file": read_cached_file,
        "read_cached_file_128_kept": lambda path: kept.append(read_cached_file(path)),
        "preadv_reused_buffer": into_buffer,
    }
    found = {}
    for name, way in ways.items():
        passes = []
        for _ in range(rounds):
            start = time.perf_counter()
            for path in paths:
                way(path)
            passes.append((time.perf_counter() - start) / len(paths) * 1e6)
        found[name] = float(np.median(passes))
    return found


def engine_alone(engine, batch: int, repeats: int = 50, rounds: int = 3) -> float:
    """img/s of the whole path on `batch` staged GPU frames (no decode): the median of `rounds` rounds of run(batch)
    repeated, after a round of warm-up. The first two runs after a load wait 19-47 ms each on the host's first use of
    the path (bench/first_replays.py), which inside a timed round reads 7-17 % slow."""

    frame = bus_rgb_cuda()
    for slot in range(batch):
        engine.preprocess(frame, slot)
    rates = []
    for _ in range(rounds + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            engine.run_async(batch)
        engine.sync()
        rates.append(batch * repeats / (time.perf_counter() - start))
    return float(np.median(rates[1:]))


def stage_overlap(found: dict, engine, batch: int, seconds: float = 2.0) -> None:
    """Whether decoding overlaps the network, and what a second call in flight adds: the hardware JPEG decoders are
    engines of their own, but each call also has host work (parsing, allocating, waiting for its last image)."""

    from yolojet.images.decoders import Encoded

    chunk = [Encoded.of((assets() / "bus.jpg").read_bytes())] * 32
    frame = bus_rgb_cuda()
    for slot in range(batch):
        engine.preprocess(frame, slot)
    engine.run(batch)
    decoders = [decoder_or_none("nvimgcodec", engine.device) for _ in range(2)]
    if decoders[0] is None or decoders[1] is None:
        return

    def decoding(decoder, stop: threading.Event, done: list[int]) -> None:
        while not stop.is_set():
            decoder.decode(chunk)
            decoder.stream.synchronize()
            done[0] += len(chunk)

    def running(stop: threading.Event, done: list[int]) -> None:
        while not stop.is_set():
            engine.run(batch)
            done[0] += batch

    rows: dict = {}
    for threads in (1, 2):
        for beside in (False, True):
            stop = threading.Event()
            decoded = [[0] for _ in range(threads)]
            ran = [0]
            workers = [threading.Thread(target=decoding, args=(decoders[i], stop, decoded[i])) for i in range(threads)]
            if beside:
                workers.append(threading.Thread(target=running, args=(stop, ran)))
            start = time.perf_counter()
            for w in workers:
                w.start()
            time.sleep(seconds)
            stop.set()
            for w in workers:
                w.join()
            torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            key = f"{threads}thread{'s' if threads > 1 else ''}_{'beside' if beside else 'alone'}"
            rows[key] = {
                "decode_img_per_s": sum(d[0] for d in decoded) / elapsed,
                "network_img_per_s": ran[0] / elapsed if beside else None,
            }
            network = f", network {rows[key]['network_img_per_s']:,.0f} img/s" if beside else ""
            print(f"overlap {key}: decode {rows[key]['decode_img_per_s']:,.0f} img/s{network}", flush=True)
    rows["network_alone_img_per_s"] = engine_alone(engine, batch)
    for decoder in decoders:
        decoder.close()
    found["overlap"] = rows


@contextlib.contextmanager
def timed_calls(targets: list[tuple[object, str]], spans: list | None = None):
    """Each (class or module, name) wrapped, while the block runs, to add the wall time of its calls to a total by
    the calling thread's name (pool threads' numbers dropped) and its own name; with `spans`, each call is also
    appended to it as (thread, name, start, end) in perf_counter seconds."""
    totals: collections.Counter = collections.Counter()
    saved = []
    for owner, name in targets:
        original = getattr(owner, name)
        saved.append((owner, name, owner.__dict__.get(name)))

        def wrapped(*args, _original=original, _name=name, **kwargs):
            start = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                end = time.perf_counter()
                thread = re.sub(r"[_-]\d+$", "", threading.current_thread().name)
                totals[f"{thread}: {_name}"] += end - start
                if spans is not None:
                    spans.append((threading.current_thread().name, _name, start, end))

        setattr(owner, name, wrapped)
    try:
        yield totals
    finally:
        for owner, name, own in reversed(saved):
            if own is None:
                delattr(owner, name)
            else:
                setattr(owner, name, own)


def image_path_steps(engine) -> list[tuple[object, str]]:
    """The steps of the image path timed by `timed_calls`: the caller's (waiting for decoded chunks, submitting,
    collecting, making results), the feed's (preparing an image, the decoder's call) and the CPU pool's (a file's
    read and decode, OpenCV's call, the copy to the device)."""
    import yolojet.engine.engine as engine_module
    import yolojet.images.decoders as decoders_module
    from yolojet.engine.feed import FrameFeed
    from yolojet.images.decoders import CpuDecoder

    decoder_type = type(engine.decoder)
    steps = [(FrameFeed, "next_batch"), (type(engine), "_submit_fed"), (type(engine), "_collect")]
    steps += [(engine_module, "make_results"), (decoder_type, "prepare"), (decoder_type, "finish")]
    steps += [(CpuDecoder, "decode_bytes")] if decoder_type is not CpuDecoder else []
    steps += [(CpuDecoder, "decode_one"), (CpuDecoder, "to_device"), (decoders_module, "decode_cpu")]
    steps += [(decoders_module, "read_cached_file"), (decoders_module, "check_encoded")]
    if decoder_type.__name__ == "NvjpegHardwareDecoder":
        from yolojet.images.nvjpeg_hardware import NvjpegHardware

        steps += [(NvjpegHardware, "takes"), (NvjpegHardware, "decode"), (decoder_type, "_queued_work_done")]
    if hasattr(decoder_type, "_decode_jpegs"):
        steps.append((decoder_type, "_decode_jpegs"))
    return steps


def opencv_alone(datas: list[bytes], threads: int, repeats: int = 5) -> float:
    """img/s of cv2.imdecode alone over `datas` on `threads` threads (best of `repeats`): what this machine's cores
    can decode, the CPU decoder's ceiling."""
    from concurrent.futures import ThreadPoolExecutor

    import cv2

    arrays = [np.frombuffer(d, dtype=np.uint8) for d in datas]
    best = 0.0
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            start = time.perf_counter()
            list(pool.map(lambda a: cv2.imdecode(a, cv2.IMREAD_COLOR), arrays))
            best = max(best, len(arrays) / (time.perf_counter() - start))
    return best


def stage_stream(found: dict, engine, files: list[Path], batch: int) -> None:
    import yolojet.engine.engine as engine_module
    from yolojet.engine.feed import FrameFeed

    paths = [str(f) for f in files]
    rows: dict = {"files": len(paths), "engine_alone_img_per_s": engine_alone(engine, batch)}
    print(f"engine alone (staged GPU frames, batch {batch}): {rows['engine_alone_img_per_s']:,.0f} img/s", flush=True)
    for name in STREAM_DECODERS:
        if not with_decoder(engine, name):
            continue
        print(f"stream {name}: the feed alone over {len(paths)} files", flush=True)
        feed_start = time.perf_counter()
        decoded = 0
        for fed in FrameFeed(paths, engine.decoder, batch):
            fed.decoded.wait_on(torch.cuda.current_stream())
            decoded += len(fed.sources)
        torch.cuda.synchronize()
        decode_rate = decoded / (time.perf_counter() - feed_start)
        start = time.perf_counter()
        count = errors = boxes = 0
        for result in engine.stream(paths):
            count += 1
            errors += result.error is not None
            boxes += len(result)
        seconds = time.perf_counter() - start
        rate = count / seconds
        busy = rate / rows["engine_alone_img_per_s"]
        # The same stream again with its steps timed, thread by thread: where each thread spends the stream's time
        # (the caller's thread waiting for decoded chunks, submitting, collecting, making results; the feed's threads
        # reading and checking files, in the decoder's call, or waiting).
        with timed_calls(image_path_steps(engine)) as totals:
            timed_start = time.perf_counter()
            for _ in engine.stream(paths):
                pass
            timed_seconds = time.perf_counter() - timed_start
        rows[name] = {
            "img_per_s": rate,
            "seconds": seconds,
            "errors": errors,
            "boxes": boxes,
            "decode_alone_img_per_s": decode_rate,
            "gpu_busy": busy,
            "timed_seconds": timed_seconds,
            "steps_s": dict(totals.most_common()),
        }
        print(
            f"stream over {count} files, {name}: {rate:,.0f} img/s (decode alone {decode_rate:,.0f} img/s, GPU "
            f"busy ~{rows[name]['gpu_busy']:.0%}), {errors} errors, {boxes} boxes; timed again in "
            f"{timed_seconds:.2f} s: " + ", ".join(f"{k} {v:.2f} s" for k, v in totals.most_common()),
            flush=True,
        )
    # A long stream's decode calls of 64 (the product's, feed.chunk_for) against 32, and with shorter switch intervals,
    # twice in turn: the stream's decode thread is its limit, and each of its calls ends waiting for the GIL, up to the
    # switch interval while another thread runs Python.
    if with_decoder(engine, "auto"):
        from yolojet.engine.feed import CHUNK

        interval = sys.getswitchinterval()
        variants = [("chunk32", CHUNK, interval), ("chunk64", None, interval)]
        variants += [("chunk64_switch1ms", None, 0.001), ("chunk64_switch0.2ms", None, 0.0002)]
        for attempt in range(2):
            for name, chunk, switch in variants:
                engine_module.FrameFeed = functools.partial(FrameFeed, chunk=chunk)  # type: ignore[misc]
                sys.setswitchinterval(switch)
                try:
                    start = time.perf_counter()
                    count = sum(1 for _ in engine.stream(paths))
                    seconds = time.perf_counter() - start
                finally:
                    engine_module.FrameFeed = FrameFeed  # type: ignore[misc]
                    sys.setswitchinterval(interval)
                label = f"auto_{name}_{attempt}"
                rows[label] = {"img_per_s": count / seconds, "seconds": seconds}
                print(f"stream over {count} files, {label}: {count / seconds:,.0f} img/s", flush=True)
    found["stream"] = rows


def stage_feeds(found: dict, engine, files: list[Path], batch: int) -> None:
    """The hardware decoder fed in the ways yolojet/engine/feed.py can: a list on one thread (the product's), an
    iterator on two (a source thread beside the decode thread); files read by nvImageCodec or by Python; output
    images decoded into again once released, or allocated a call. The feed alone and under engine.stream."""
    import yolojet.engine.feed as feed_module
    import yolojet.images.decoders as decoders_module

    if not with_decoder(engine, "nvimgcodec"):
        return
    paths = [str(f) for f in files]
    # What the hardware decoder itself makes of JPEGs cut short (the file route's end-of-image check keeps them from
    # it): a frame, None (a refusal) or an exception.
    whole = Path(paths[0]).read_bytes()
    hardware = engine.decoder
    cut = {}
    for label, data in (("half", whole[: len(whole) // 2]), ("first_600_bytes", whole[:600])):
        try:
            (image,) = hardware._decoder.decode([hardware._nv.CodeStream(data)], params=hardware._params)
            cut[label] = None if image is None else list(image.shape)
        except Exception as e:
            cut[label] = f"{type(e).__name__}: {e}"[:200]
    print(f"feeds: the hardware decoder on JPEGs cut short: {cut}", flush=True)
    variants = [
        ("list", list, True, True),
        ("list_no_reuse", list, True, False),
        ("list_python_reads", list, False, True),
        ("iterator", iter, True, True),
        ("iterator_python_reads_no_reuse", iter, False, False),
    ]
    file_stream, release = decoders_module.jpeg_file_stream, feed_module.FrameFeed.release
    rows: dict = {"files": len(paths), "cut_short_on_the_hardware": cut}
    try:
        for name, source, file_streams, reuse in variants:
            decoders_module.jpeg_file_stream = file_stream if file_streams else (lambda *args: None)
            feed_module.FrameFeed.release = release if reuse else (lambda self, fed: None)
            row = {}
            for attempt in range(2):
                start = time.perf_counter()
                decoded = 0
                feed = feed_module.FrameFeed(source(paths), engine.decoder, batch)
                for fed in feed:
                    fed.decoded.wait_on(torch.cuda.current_stream())
                    torch.cuda.current_stream().synchronize()
                    decoded += len(fed.sources)
                    feed.release(fed)
                row[f"feed_alone_img_per_s_{attempt}"] = decoded / (time.perf_counter() - start)
                start = time.perf_counter()
                count = errors = 0
                for result in engine.stream(source(paths)):
                    count += 1
                    errors += result.error is not None
                row[f"stream_img_per_s_{attempt}"] = count / (time.perf_counter() - start)
                row["errors"] = errors
            rows[name] = row
            print(f"feeds {name}: {json.dumps(row)}", flush=True)
    finally:
        decoders_module.jpeg_file_stream, feed_module.FrameFeed.release = file_stream, release
    found["feeds"] = rows


def batch1_latency(engine, frame: torch.Tensor) -> dict:
    """preprocess + run + get from a frame on the GPU, from two GPU frames taken in turn (a camera's new buffers: each
    run stages its frame's table row again), and from host memory; and run(1) alone: ms quantiles."""
    rows = {}
    for where, pixels in (("gpu", [frame]), ("gpu_alternating", [frame, frame.clone()]), ("host", [frame.cpu()])):
        samples = []
        for i in range(520):
            torch.cuda.synchronize()
            start = time.perf_counter()
            engine.preprocess(pixels[i % len(pixels)], 0)
            engine.run(1)
            engine.get(0)
            if i >= 20:
                samples.append(time.perf_counter() - start)
        samples.sort()
        rows[where] = {
            "p50_ms": samples[len(samples) // 2] * 1000,
            "p90_ms": samples[int(len(samples) * 0.9)] * 1000,
            "p99_ms": samples[int(len(samples) * 0.99)] * 1000,
        }
    engine.preprocess(frame, 0)
    rows["run_only_gpu_p50_ms"] = run1_walls(engine, 500).p50 * 1000
    return rows


def run1_walls(engine, repeats: int) -> Timing:
    """Wall time of run(1) on the frame staged in slot 0, `repeats` times."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        engine.run(1)
        samples.append(time.perf_counter() - start)
    return Timing(tuple(samples))


def preprocess_parts(engine, pixels: torch.Tensor, repeats: int = 300) -> dict:
    """Host microseconds (p50) of what `preprocess` of a GPU frame does, each alone: the frame made from the tensor,
    the current stream asked for (torch's, the engine's cached one, its identity alone), an event recorded, a copy
    into a buffer of the same shape, a clone; and the whole preprocess."""
    from yolojet.images.frames import frame_from_pixels

    buffer = torch.empty_like(pixels)
    index = engine.device.index if engine.device.index is not None else torch.cuda.current_device()
    stream = torch.cuda.current_stream(engine.device)
    done = torch.cuda.Event()
    parts = {
        "frame_from_pixels": lambda: frame_from_pixels(pixels),
        "current_stream": lambda: torch.cuda.current_stream(engine.device),
        "current_stream_cached": engine._current_stream,
        "stream_identity": lambda: torch._C._cuda_getCurrentStream(index),
        "event_record": lambda: done.record(stream),
        "copy_into_buffer": lambda: buffer.copy_(pixels),
        "clone": lambda: pixels.clone(),
        "preprocess": lambda: engine.preprocess(pixels, 0),
    }
    found = {}
    for name, part in parts.items():
        samples = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            start = time.perf_counter()
            part()
            samples.append(time.perf_counter() - start)
        found[name] = Timing(tuple(samples)).p50 * 1e6
    return found


def stage_latency(found: dict, model_dir: Path) -> None:
    from yolojet.engine.engine import Engine

    engine = Engine.load(model_dir, device="cuda", half=True, max_batch=1, buckets=[1])
    rows = batch1_latency(engine, bus_rgb_cuda())
    rows["trio_steps_p50_us"] = trio_steps(engine, bus_rgb_cuda())
    # A, B, A, B in one process: the current stream torch's or the engine's cached one.
    cached = engine._current_stream
    variants = {"public_stream": functools.partial(torch.cuda.current_stream, engine.device), "cached_stream": cached}
    rows["trio_variants_p50_us"] = collections.defaultdict(list)
    try:
        for _ in range(2):
            for name, current in variants.items():
                engine._current_stream = current
                steps = trio_steps(engine, bus_rgb_cuda())
                rows["trio_variants_p50_us"][name].append(steps)
                shown = {k: round(v, 1) for k, v in steps.items()}
                print(f"batch 1, trio with {name}: {json.dumps(shown)}", flush=True)
    finally:
        engine._current_stream = cached
    # The same with a new copy of the frame every preprocess (as before the slots' own buffers): one process, one
    # machine, so the difference is the change's.
    own_buffers = type(engine)._slot_copy
    type(engine)._slot_copy = lambda self, slot, pixels, stream: pixels.clone()
    try:
        rows["trio_steps_cloned_p50_us"] = trio_steps(engine, bus_rgb_cuda())
    finally:
        type(engine)._slot_copy = own_buffers
    print(f"batch 1, the trio's steps, a clone a frame: {json.dumps(rows['trio_steps_cloned_p50_us'])}", flush=True)
    rows["preprocess_parts_p50_us"] = preprocess_parts(engine, bus_rgb_cuda())
    print(f"batch 1, preprocess's parts (p50 us): {json.dumps(rows['preprocess_parts_p50_us'])}", flush=True)
    print(f"batch 1, the trio's steps (p50 us): {json.dumps(rows['trio_steps_p50_us'])}", flush=True)
    print(
        f"batch 1, frame on the GPU: p50 {rows['gpu']['p50_ms']:.3f} ms, two GPU frames in turn "
        f"{rows['gpu_alternating']['p50_ms']:.3f} ms, host {rows['host']['p50_ms']:.3f} ms; "
        f"run(1) alone {rows['run_only_gpu_p50_ms']:.3f} ms",
        flush=True,
    )
    found["latency"] = rows
    engine.close()


NEW_SHAPE_CHILD = """
import json, sys, time
from yolojet.engine.engine import Engine
engine = Engine.load(sys.argv[1], device="cuda", half=True, max_batch=1)
found = {"built": [list(s) for s in engine.shapes()]}
for name in sys.argv[2:]:
    start = time.perf_counter()
    result = engine([name])[0]
    found[name.rsplit("/", 1)[-1]] = {"s": time.perf_counter() - start, "error": result.error,
                                      "shapes": [list(s) for s in engine.shapes()]}
print(json.dumps(found))
"""


# (rows, pixels a row, warps) of a letterbox program, the product's first.
LETTERBOX_TILES = [
    (2, 128, 4),
    (8, 32, 2),
    (16, 32, 4),
    (8, 64, 4),
    (4, 128, 4),
    (16, 64, 8),
    (32, 32, 8),
    (4, 64, 2),
    (16, 32, 2),
    (8, 64, 2),
]


def stage_letterbox(found: dict, batch: int) -> None:
    import yolojet.kernels.preprocess as preprocess
    from yolojet.geometry import Letterbox
    from yolojet.timing import time_on_device

    frame = bus_rgb_cuda()
    frames = [frame.clone() for _ in range(batch)]  # one frame each, as a batch of photos reads 64 frames
    placement = Letterbox.fit(tuple(frame.shape[:2]), (480, 640))
    rows_of = [preprocess.frame_row(f, bgr=False, placement=placement) for f in frames]
    table = torch.tensor(rows_of, dtype=torch.int64, device="cuda")
    buffer = torch.empty(batch, 480, 640, 4, dtype=torch.float16, device="cuda")
    product = preprocess.LETTERBOX_TILE
    rows: dict = {"product_tile": list(product), "tiles": {}}
    expected = None
    try:
        for tile in LETTERBOX_TILES:
            preprocess.LETTERBOX_TILE = tile
            row = {}
            for n in (batch, 1):
                for pad in (True, False):
                    out = buffer[:n, ..., :3]
                    buffer.fill_(float("nan"))
                    preprocess.letterbox_frames(out, table, pad_row=pad)
                    if n == batch and pad:
                        if expected is None:
                            expected = out.clone()
                        row["equal"] = bool(torch.equal(out, expected))
                    call = functools.partial(preprocess.letterbox_frames, out, table, pad_row=pad)
                    row[f"{n}{'_pad' if pad else ''}_us"] = time_on_device(call, repeats=50, warmup=5).p50 * 1e6
            rows["tiles"][str(tile)] = row
            shown = {k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}
            print(f"letterbox tile {tile}: {json.dumps(shown)}", flush=True)
    finally:
        preprocess.LETTERBOX_TILE = product
    fastest = min(
        rows["tiles"], key=lambda t: rows["tiles"][t][f"{batch}_pad_us"] if rows["tiles"][t]["equal"] else 1e9
    )
    rows["fastest"] = fastest
    preprocess.LETTERBOX_TILE = tuple(json.loads(fastest.replace("(", "[").replace(")", "]")))
    print(f"letterbox: the fastest tile {fastest} is used from here on", flush=True)
    found["letterbox"] = rows


def replay_host_us(graph, repeats: int = 300) -> dict:
    """p50 / p90 microseconds of the replay call alone (host), and of replay + synchronize (wall), from an idle GPU."""
    host, wall = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        graph.replay()
        launched = time.perf_counter()
        torch.cuda.synchronize()
        host.append(launched - start)
        wall.append(time.perf_counter() - start)
    host_t, wall_t = Timing(tuple(host)), Timing(tuple(wall))
    return {"host_p50_us": host_t.p50 * 1e6, "host_p80_us": host_t.p80 * 1e6, "wall_p50_us": wall_t.p50 * 1e6}


def trio_steps(engine, pixels: torch.Tensor, repeats: int = 300) -> dict:
    """Host microseconds (p50) of each step of preprocess + run + get from a GPU frame: preprocess, run_async up to
    and after the graph's launch, sync (waiting for the device, then reading the results), get; and the whole."""
    import yolojet.engine.predict_path as predict_path

    marks: dict[str, float] = {}
    launch = predict_path.CapturedPath.launch

    def timed_launch(self, *args):
        marks["launch_start"] = time.perf_counter()
        launch(self, *args)
        marks["launch_end"] = time.perf_counter()

    steps: dict[str, list[float]] = collections.defaultdict(list)
    predict_path.CapturedPath.launch = timed_launch  # type: ignore[method-assign]
    try:
        for _ in range(repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            engine.preprocess(pixels, 0)
            t1 = time.perf_counter()
            engine.run_async(1)
            t2 = time.perf_counter()
            engine.sync()
            t3 = time.perf_counter()
            engine.get(0)
            t4 = time.perf_counter()
            steps["preprocess"].append(t1 - t0)
            steps["run_async_before_launch"].append(marks["launch_start"] - t1)
            steps["graph_launch"].append(marks["launch_end"] - marks["launch_start"])
            steps["run_async_after_launch"].append(t2 - marks["launch_end"])
            steps["sync"].append(t3 - t2)
            steps["get"].append(t4 - t3)
            steps["whole"].append(t4 - t0)
    finally:
        predict_path.CapturedPath.launch = launch  # type: ignore[method-assign]
    return {k: Timing(tuple(v)).p50 * 1e6 for k, v in steps.items()}


def stage_launch(found: dict, model_dir: Path) -> None:
    from yolojet.engine.engine import Engine
    from yolojet.timing import time_on_device

    pixels = bus_rgb_cuda()
    one = torch.zeros(1, device="cuda")
    trivial = torch.cuda.CUDAGraph()
    with torch.cuda.graph(trivial):
        one.add_(1)
    rows: dict = {"one_kernel_graph": replay_host_us(trivial)}
    print(f"launch: a one-kernel graph {json.dumps(rows['one_kernel_graph'])}", flush=True)
    variants = (("default", {}), ("no_pdl", {"pdl": False}), ("no_branches", {"branches": False}))
    for label, switches in (*variants, ("neither", {"pdl": False, "branches": False})):
        engine = Engine.load(model_dir, device="cuda", half=True, max_batch=1, buckets=[1], **switches)
        engine.preprocess(pixels, 0)
        for _ in range(3):
            engine.run(1)
        shape, _ = engine.input_shape_of(tuple(pixels.shape[:2]))
        path = engine.shape_path(shape)
        graph = next(iter(path.graphs.values()))[0]
        row = {"path_graph": replay_host_us(graph), "network_graph": replay_host_us(path.network.graphs[1])}
        row["path_device_us"] = time_on_device(graph.replay, repeats=200, warmup=10).p50 * 1e6
        row["network_device_us"] = engine.time_network(1, repeats=200, shape=shape).p50 * 1e6
        row["run1_wall_p50_us"] = run1_walls(engine, 300).p50 * 1e6
        if label == "default":
            row["trio_steps_p50_us"] = trio_steps(engine, pixels)
        engine.close()
        rows[label] = row
        print(f"launch {label}: {json.dumps(row)}", flush=True)
    found["launch"] = rows


def stage_rect(found: dict, model_dir: Path, batch: int, buckets: list[int]) -> None:
    from yolojet.engine.engine import Engine
    from yolojet.images import load_frame

    frame = load_frame(assets() / "bus.jpg")
    pixels = frame.pixels.contiguous().cuda()
    rows: dict = {}
    for name, rect in (("square", False), ("rect", True)):
        engine = Engine.load(model_dir, device="cuda", half=True, max_batch=batch, buckets=buckets, rect=rect)
        row = {"input": list(engine.input_shape(frame)[0]), "batch": batch}
        row["img_per_s"] = engine_alone(engine, batch)
        shape = tuple(row["input"])
        row["network_ms"] = engine.time_network(batch, repeats=50, shape=shape).p50 * 1000
        row["kernels"] = batch_kernels(engine, batch)
        print(f"{name}: network alone at {batch} {row['network_ms']:.3f} ms; device us a run of {batch}, by kernel:")
        for k in row["kernels"][:24]:
            print(f"  {k['per_run_us']:9.1f}  x{k['calls_per_run']:<5.1f} {k['name']}", flush=True)
        engine.close()
        single = Engine.load(model_dir, device="cuda", half=True, max_batch=1, buckets=[1], rect=rect)
        row["batch1"] = batch1_latency(single, pixels)
        row["batch1_network_ms"] = single.time_network(1, repeats=200, shape=shape).p50 * 1000
        row["batch1_kernels"] = batch_kernels(single, 1)
        row["batch1_timeline"] = batch_timeline(single)
        line = row["batch1_timeline"]
        print(
            f"{name}: batch 1 network alone {row['batch1_network_ms']:.3f} ms; run(1)'s device span "
            f"{line.get('span_us', 0):.1f} us, busy {line.get('busy_us', 0):.1f}, idle {line.get('idle_us', 0):.1f}; "
            "outside the network, by kernel:",
            flush=True,
        )
        for k in row["batch1_kernels"]:
            if not re.search(r"conv|dwconv|attention|pool|decode_kernel|_copy_kernel", k["name"]):
                print(f"  {k['per_run_us']:9.1f}  x{k['calls_per_run']:<5.1f} {k['name']}", flush=True)
        single.close()
        rows[name] = row
        print(
            f"{name} letterbox ({row['input'][0]}x{row['input'][1]} for bus.jpg): run({batch}) "
            f"{row['img_per_s']:,.0f} img/s; batch 1 from a GPU frame p50 {row['batch1']['gpu']['p50_ms']:.3f} ms, "
            f"run(1) alone {row['batch1']['run_only_gpu_p50_ms']:.3f} ms",
            flush=True,
        )
    images = [str(assets() / "bus.jpg"), str(assets() / "zidane.jpg")]
    for attempt in ("first", "again"):  # the first may still tune zidane's shape; the second finds it in the caches
        done = subprocess.run(
            [sys.executable, "-c", NEW_SHAPE_CHILD, str(model_dir), *images],
            capture_output=True,
            text=True,
            timeout=400,
        )
        try:
            rows[f"new_shape_{attempt}"] = json.loads(done.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            rows[f"new_shape_{attempt}"] = {"failed": done.stderr[-2000:]}
        print(f"first image of a new shape, {attempt} process: {rows[f'new_shape_{attempt}']}", flush=True)
    found["rect"] = rows


def batch_kernels(engine, batch: int) -> list[dict]:
    """Device time by kernel of run(batch) on the frames staged (the path's letterbox, network, decode, NMS and
    copies), per run, largest first."""
    from bench_pipeline import kernel_profile  # beside this script

    try:
        return kernel_profile(lambda: engine.run(batch), iters=10)
    except Exception as e:  # the profile is extra information; never lose the timings over it
        return [{"name": f"profile failed: {type(e).__name__}: {e}", "per_run_us": 0, "calls_per_run": 0}]


def batch_timeline(engine) -> dict:
    """One run(1)'s launches on the device: span, busy and idle time, each launch's start and length."""
    from bench_pipeline import timeline  # beside this script

    try:
        return timeline(lambda: engine.run(1))
    except Exception as e:  # extra information, as batch_kernels
        return {"failed": f"{type(e).__name__}: {e}"}


def stage_agreement(found: dict, engine) -> None:
    from support import match_detections

    jpegs = awkward_jpegs()
    rows = {}
    with_decoder(engine, "cpu")
    truth = dict(zip(jpegs, engine(list(jpegs.values()), conf=0.05), strict=True))
    for name in ("nvimgcodec", "nvjpeg"):
        if not with_decoder(engine, name):
            continue
        rows[name] = {}
        for (photo, result), want in zip(
            zip(jpegs, engine(list(jpegs.values()), conf=0.05), strict=True), truth.values(), strict=True
        ):
            problems = match_detections(result.boxes.data, want.boxes.data) if result.error is None else [result.error]
            rows[name][photo] = {
                "boxes": len(result),
                "cpu_boxes": len(want),
                "problems": problems[:3],
                "shape": list(result.orig_shape),
                "cpu_shape": list(want.orig_shape),
            }
        print(
            f"agreement {name}: "
            + ", ".join(f"{p} {'ok' if not r['problems'] else r['problems'][0]}" for p, r in rows[name].items()),
            flush=True,
        )
    found["agreement"] = rows


def profiled(fn, top: int = 18) -> list[str]:
    """fn() under cProfile: the functions with the most own time, as text lines."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    fn()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return [line for line in out.getvalue().splitlines() if line.strip()][-top - 1 :]


def stage_profile(found: dict, model_dir: Path, engine, files: list[Path], batch: int) -> None:
    from yolojet.engine.engine import Engine

    single = Engine.load(model_dir, device="cuda", half=True, max_batch=1, buckets=[1])
    single.preprocess(bus_rgb_cuda(), 0)
    single.run(1)

    def runs() -> None:
        for _ in range(300):
            single.run(1)

    rows = {"batch1_run": profiled(runs)}
    single.close()
    with_decoder(engine, "auto")
    paths = [str(f) for f in files[:batch]]
    engine(paths)

    def calls() -> None:
        for _ in range(5):
            engine(paths)

    rows["call"] = profiled(calls)
    for name, lines in rows.items():
        print(f"profile {name}:\n" + "\n".join(lines), flush=True)
    found["profile"] = rows


STARTUP_CHILD = """
import json, sys, time
start = time.perf_counter()
from yolojet.engine.engine import Engine
imported = time.perf_counter() - start
engine = Engine.load(sys.argv[1], device="cuda", half=True, max_batch=1)
loaded = time.perf_counter() - start
result = engine([sys.argv[2]])[0]
first = time.perf_counter() - start
phases = {k: round(v, 3) for k, v in engine.network.startup_seconds.items()}
print(json.dumps({"imported_s": imported, "loaded_s": loaded, "first_result_s": first, "error": result.error,
                  "boxes": len(result), "decoder": engine.decoder.name, "phases": phases,
                  "torchvision_imported": "torchvision" in sys.modules, "shapes": engine.shapes()}))
"""


def stage_startup(found: dict, model_dir: Path, cold: bool, out: Path) -> None:
    """Fresh processes, warm and cold; where py-spy is on PATH, one more warm one recorded by it (every thread,
    waiting included, 100 samples a second) into `out`/pyspy-startup.txt as collapsed stacks."""
    rows = {}
    kinds = ["warm", "warm again"] + (["cold"] if cold else []) + (["warm, py-spy"] if shutil.which("py-spy") else [])
    for kind in kinds:
        env = dict(os.environ)
        if kind == "cold":
            scratch = Path(tempfile.mkdtemp())
            env.update(YOLOJET_CACHE=str(scratch / "yolojet"), TRITON_CACHE_DIR=str(scratch / "triton"))
        spy = []
        if kind == "warm, py-spy":
            spy = [
                "py-spy",
                "record",
                "-r",
                "100",
                "--threads",
                "--idle",
                "-f",
                "raw",
                "-o",
                str(out / "pyspy-startup.txt"),
                "--",
            ]
        start = time.perf_counter()
        done = subprocess.run(
            [*spy, sys.executable, "-c", STARTUP_CHILD, str(model_dir), str(assets() / "bus.jpg")],
            capture_output=True,
            text=True,
            env=env,
            timeout=400,
        )
        row = {"process_s": time.perf_counter() - start}
        try:
            # The child's own line (py-spy adds lines of its own to the output).
            row.update(json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1]))
        except (IndexError, json.JSONDecodeError):
            row["failed"] = done.stderr[-2000:]
        rows[kind] = row
        print(f"start-up {kind}: {row}", flush=True)
    found["startup"] = rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--files", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--cold", action="store_true", help="also time a cold start-up (empty caches; ~40 s)")
    parser.add_argument("--stream-decoders", nargs="+", default=None, help=f"default {STREAM_DECODERS}")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    # A stage cut short by its time limit (gpu_check.sh's `timeout` sends SIGTERM) prints every thread's stack first.
    faulthandler.register(signal.SIGTERM, chain=True)
    if args.stream_decoders:
        STREAM_DECODERS[:] = args.stream_decoders

    from yolojet.timing import provenance

    args.out.mkdir(parents=True, exist_ok=True)
    found: dict = {"provenance": provenance(), "batch": args.batch}
    work = Path(tempfile.mkdtemp(prefix="bench_images_"))
    # Exported at the first stage that needs a model (building and calibrating one takes tens of seconds on a GPU
    # machine's CPU; the decoder and letterbox stages need none).
    exported: list[Path] = []

    def model() -> Path:
        if not exported:
            exported.append(exported_model(work))
        return exported[0]

    files_dir = work / "jpegs"
    files_dir.mkdir()
    bus = assets() / "bus.jpg"
    files = []
    for i in range(args.files):
        files.append(files_dir / f"{i:06d}.jpg")
        shutil.copyfile(bus, files[-1])
    engine = None
    # The chunks the feed hands over (16 images) and what they merge into; fewer buckets than the default's seven keep
    # a cold tuning short.
    buckets = sorted({1, 16, 32, args.batch})
    out_file = args.out / f"images-{found['provenance']['commit']}.json"
    # Each stage's start and length, printed and kept: a run cut short by its time limit then says which stage had the
    # time (a stage killed mid-way and one that stalled look alike without them).
    began = time.perf_counter()
    for stage in args.stages:
        stage_began = time.perf_counter()
        print(f"[{stage_began - began:7.1f} s] stage {stage}", flush=True)
        try:
            if stage == "decoders":
                stage_decoders(found, args.batch, args.repeats)
            elif stage == "contention":
                stage_contention(found, args.batch)
            elif stage in ("call", "stream", "feeds", "overlap", "agreement"):
                if engine is None:
                    engine = build_engine(model(), args.batch, buckets)
                if stage == "call":
                    stage_call(found, engine, files, args.batch, args.repeats)
                elif stage == "stream":
                    stage_stream(found, engine, files, args.batch)
                elif stage == "feeds":
                    stage_feeds(found, engine, files, args.batch)
                elif stage == "overlap":
                    stage_overlap(found, engine, args.batch)
                else:
                    stage_agreement(found, engine)
            elif stage == "latency":
                stage_latency(found, model())
            elif stage == "profile":
                if engine is None:
                    engine = build_engine(model(), args.batch, buckets)
                stage_profile(found, model(), engine, files, args.batch)
            elif stage == "startup":
                stage_startup(found, model(), args.cold, args.out)
            elif stage == "letterbox":
                stage_letterbox(found, args.batch)
            elif stage == "launch":
                stage_launch(found, model())
            elif stage == "rect":
                stage_rect(found, model(), args.batch, buckets)
            elif stage == "uploads":
                stage_uploads(found, args.batch, files[: args.batch])
        except Exception:
            found.setdefault("failures", {})[stage] = traceback.format_exc()
            print(f"stage {stage} failed:\n{traceback.format_exc()}", flush=True)
        found.setdefault("stage_seconds", {})[stage] = time.perf_counter() - stage_began
        out_file.write_text(json.dumps(found, indent=1))
    print_table(found)
    return 1 if found.get("failures") else 0


def print_table(found: dict) -> None:
    print("\n| measure | value |\n|---|---|")
    for name, row in found.get("decoders", {}).items():
        bus, zidane = row["pixels"]["bus.jpg"], row["pixels"]["zidane.jpg"]
        versus = (
            f"bus max {bus['max']} ({bus['percent_differ']:.1f} %), "
            f"zidane max {zidane['max']} ({zidane['percent_differ']:.1f} %)"
        )
        print(f"| decode {name} | {row['img_per_s']:,.0f} img/s; vs cv2 {versus} |")
    for name, row in found.get("contention", {}).items():
        print(
            f"| {name} decode call of 64, alone / beside a Python thread | {row['alone_img_per_s']:,.0f} / "
            f"{row['beside_python_thread_img_per_s']:,.0f} img/s; call {row['call_us_per_image']:.1f} us an image, "
            f"with the wait {row['call_and_wait_us_per_image']:.1f}; start {row['start_s']:.2f} s |"
        )
    for name, row in found.get("call", {}).items():
        if not isinstance(row, dict):
            continue
        print(f"| engine(64 paths) {name} | {row['img_per_s']:,.0f} img/s ({row['ms']:.2f} ms) |")
    stream = found.get("stream", {})
    if stream:
        print(f"| engine alone, staged GPU frames | {stream['engine_alone_img_per_s']:,.0f} img/s |")
    for name in ("auto", "nvimgcodec", "hardware", "hardware-2lanes", "cpu"):
        if name in stream:
            r = stream[name]
            print(
                f"| stream {stream['files']} files {name} | {r['img_per_s']:,.0f} img/s; decode alone "
                f"{r['decode_alone_img_per_s']:,.0f}; GPU busy ~{r['gpu_busy']:.0%} |"
            )
    for name, r in stream.items():
        if name.startswith("auto_") and isinstance(r, dict) and "gpu_busy" not in r:
            print(f"| stream {stream['files']} files {name} | {r['img_per_s']:,.0f} img/s |")
    feeds = found.get("feeds", {})
    for key, row in feeds.items():
        if key == "cut_short_on_the_hardware":
            print(f"| the hardware decoder on JPEGs cut short | {row} |")
        elif isinstance(row, dict):
            alone = max(v for k, v in row.items() if k.startswith("feed_alone"))
            streamed = max(v for k, v in row.items() if k.startswith("stream_img"))
            name = key.replace("_", " ")
            print(f"| feed {name}, {feeds['files']} files | alone {alone:,.0f} img/s; stream {streamed:,.0f} |")
    for key, row in found.get("overlap", {}).items():
        if isinstance(row, dict):
            network = f"; network beside it {row['network_img_per_s']:,.0f} img/s" if row["network_img_per_s"] else ""
            print(f"| decode {key.replace('_', ', ')} | {row['decode_img_per_s']:,.0f} img/s{network} |")
    if "overlap" in found:
        print(f"| network alone, staged GPU frames | {found['overlap']['network_alone_img_per_s']:,.0f} img/s |")
    latency = found.get("latency", {})
    if latency:
        print(f"| batch 1, GPU frame, preprocess+run+get | p50 {latency['gpu']['p50_ms']:.3f} ms |")
        alternating = latency["gpu_alternating"]["p50_ms"]
        print(f"| batch 1, two GPU frames in turn, preprocess+run+get | p50 {alternating:.3f} ms |")
        print(f"| batch 1, GPU frame staged, run(1) | p50 {latency['run_only_gpu_p50_ms']:.3f} ms |")
    for kind, row in found.get("startup", {}).items():
        print(
            f"| start-up {kind} | loaded {row.get('loaded_s', float('nan')):.2f} s, first result "
            f"{row.get('first_result_s', float('nan')):.2f} s |"
        )
    letterbox = found.get("letterbox", {})
    n = found["batch"]
    for tile, row in letterbox.get("tiles", {}).items():
        differs = "" if row["equal"] else " DIFFERS"
        print(
            f"| letterbox kernel, tile {tile}, batch {n} padded / not / batch 1 | {row[f'{n}_pad_us']:.1f} / "
            f"{row[f'{n}_us']:.1f} / {row['1_pad_us']:.1f} us{differs} |"
        )
    for label, row in found.get("launch", {}).items():
        if label != "one_kernel_graph":
            print(
                f"| batch 1 launch, {label}: path graph replay host / wall, network graph host, run(1) | "
                f"{row['path_graph']['host_p50_us']:.1f} / {row['path_graph']['wall_p50_us']:.1f} us, "
                f"{row['network_graph']['host_p50_us']:.1f} us, {row['run1_wall_p50_us']:.1f} us (device "
                f"{row['path_device_us']:.1f}, network {row['network_device_us']:.1f}) |"
            )
    rect = found.get("rect", {})
    for name in ("square", "rect"):
        if name in rect:
            r = rect[name]
            print(
                f"| {name} letterbox {r['input'][0]}x{r['input'][1]}, run({r['batch']}) staged | "
                f"{r['img_per_s']:,.0f} img/s |"
            )
            print(
                f"| {name} letterbox, batch 1 GPU frame | p50 {r['batch1']['gpu']['p50_ms']:.3f} ms (run(1) "
                f"{r['batch1']['run_only_gpu_p50_ms']:.3f} ms) |"
            )
    for attempt in ("first", "again"):
        row = rect.get(f"new_shape_{attempt}", {})
        if "zidane.jpg" in row:
            print(
                f"| first image of a new shape ({attempt} process) | bus {row['bus.jpg']['s']:.2f} s, zidane "
                f"{row['zidane.jpg']['s']:.2f} s |"
            )
    for stage in found.get("failures", {}):
        print(f"| stage {stage} | FAILED |")


if __name__ == "__main__":
    sys.exit(main())
