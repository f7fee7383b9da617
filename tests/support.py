"""Helpers for tests that compare yolojet with ultralytics: random-weight models and tie-aware comparisons."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch
from torch import nn

# (architecture, imgsz, head mode, per-output errors) of every passing export comparison in this session.
VERIFIED: list[tuple[str, tuple[int, int], str, tuple[float, ...]]] = []


def randomize_batchnorm(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give every BatchNorm random running statistics and affine parameters, so folding is really exercised."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.2)
                m.running_var.copy_(torch.rand(n, generator=g) * 1.5 + 0.5)
                m.weight.copy_(torch.rand(n, generator=g) + 0.5)
                m.bias.copy_(torch.randn(n, generator=g) * 0.2)
    return model


@functools.lru_cache(maxsize=4)
def random_model(cfg: str, seed: int = 0) -> nn.Module:
    """An ultralytics model built from an architecture YAML, random weights and BatchNorm statistics, eval mode."""
    from ultralytics import YOLO

    torch.manual_seed(seed)
    return randomize_batchnorm(YOLO(cfg, verbose=False).model, seed).float().eval()


def relative_max_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """max |ours − ref| / max |ref|, the export tolerance measure; NaN anywhere is infinitely wrong."""
    if ours.shape != ref.shape:
        raise AssertionError(f"shape {tuple(ours.shape)} != reference {tuple(ref.shape)}")
    if torch.isnan(ours).any() or torch.isnan(ref).any():
        return float("inf")
    return float((ours - ref).abs().max() / ref.abs().max().clamp_min(1e-12))


def relative_l2(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """‖ours − ref‖ / ‖ref‖ in float32, the kernel and engine tolerance measure."""
    return float((ours.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-12))


def topk_relative_error(ours: torch.Tensor, ref: torch.Tensor, score_tol: float = 1e-6) -> float:
    """Relative error between two one-to-one outputs (N, K, 6+extra), sorted by score, up to tie order.

    Rows whose scores lie within `score_tol` of each other may come out in either order (both
    implementations are right); each of our rows is compared with the closest reference row of
    the same tie group. A row of the last group may be missing from the reference when the
    selection was cut inside a tie.
    """
    if ours.shape != ref.shape:
        raise AssertionError(f"shape {tuple(ours.shape)} != reference {tuple(ref.shape)}")
    scale = float(ref.abs().max().clamp_min(1e-12))
    worst = float((ours[..., 4] - ref[..., 4]).abs().max()) / scale
    for b in range(ours.shape[0]):
        scores = ref[b, :, 4]
        cut = float(scores[-1])
        for row in ours[b]:
            group = ref[b][(scores - row[4]).abs() <= score_tol]
            if len(group) == 0:
                if abs(float(row[4]) - cut) <= score_tol:
                    continue
                return float("inf")
            worst = max(worst, float((group - row).abs().amax(1).min()) / scale)
    return worst


def compare_outputs(ours, ref, end2end: bool) -> list[float]:
    """Per-output relative errors between our head outputs and ultralytics' first eval output."""
    ours = ours if isinstance(ours, tuple) else (ours,)
    ref = tuple(ref) if isinstance(ref, (tuple, list)) else (ref,)
    if len(ours) != len(ref):
        raise AssertionError(f"{len(ours)} outputs, reference has {len(ref)}")
    errors = []
    for i, (o, r) in enumerate(zip(ours, ref, strict=True)):
        one_to_one = end2end and i == 0
        errors.append(topk_relative_error(o, r) if one_to_one else relative_max_error(o, r))
    return errors


def real_photos() -> dict[str, np.ndarray]:
    """Photos that installed packages ship, as BGR uint8 arrays (OpenCV's order, what ultralytics reads)."""
    import cv2
    import skimage.data
    from ultralytics.utils import ASSETS

    return {
        "bus.jpg": cv2.imread(str(ASSETS / "bus.jpg")),
        "zidane.jpg": cv2.imread(str(ASSETS / "zidane.jpg")),
        "astronaut": skimage.data.astronaut()[..., ::-1].copy(),
        "coffee": skimage.data.coffee()[..., ::-1].copy(),
        "chelsea": skimage.data.chelsea()[..., ::-1].copy(),
    }


def extreme_frames() -> dict[str, np.ndarray]:
    """bus.jpg squeezed to aspect ratios of 10:1 and 1:10 (100x1000 and 1000x100), the far ends of letterboxing."""
    import cv2
    from ultralytics.utils import ASSETS

    bus = cv2.imread(str(ASSETS / "bus.jpg"))
    return {"wide 100x1000": cv2.resize(bus, (1000, 100)), "tall 1000x100": cv2.resize(bus, (100, 1000))}


def head_conv_operands(
    shape: tuple[int, int, int], c_in: int, c_out: int, dtype: torch.dtype, seed: int, scale: float, device: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A head fold's 1x1 conv operands (kernels/conv/scores.py, boxes.py, extras.py): x an (N, H, W) map of c_in
    channels as a channel slice of a wider NHWC buffer, the weight (c_out, 1, 1, c_in) scaled by scale/sqrt(c_in), both
    of `dtype` on `device`, and a float32 bias there."""
    g = torch.Generator().manual_seed(seed)
    buffer = torch.randn(*shape, c_in + 8, generator=g, dtype=torch.float64)
    weight = torch.randn(c_out, 1, 1, c_in, generator=g, dtype=torch.float64) * scale / c_in**0.5
    bias = torch.randn(c_out, generator=g, dtype=torch.float64)
    return buffer.to(device, dtype)[..., 5 : 5 + c_in], weight.to(device, dtype).contiguous(), bias.float().to(device)


def exact_head_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, activation: str) -> torch.Tensor:
    """act(bias + x · wᵀ) of a head fold's operands in float64 on the CPU, NHWC, unrounded ("identity" or "silu")."""
    exact = torch.einsum("nhwk,ck->nhwc", x.double().cpu(), weight.double().cpu()[:, 0, 0]) + bias.double().cpu()
    return exact * torch.sigmoid(exact) if activation == "silu" else exact


def calibrate_batchnorm(model: nn.Module, imgsz: int = 640) -> nn.Module:
    """Measure every BatchNorm's statistics on the shipped photos (one pass in train mode); returns the model in
    eval mode.

    Random BatchNorm statistics make the activations collapse, so every anchor scores alike and the
    detections are ties; statistics measured on real images keep the outputs image-dependent, giving
    distinct scores and boxes worth comparing with ultralytics.
    """
    from ultralytics.data.augment import LetterBox

    letterbox = LetterBox((imgsz, imgsz), auto=False)
    batch = torch.stack(
        [
            torch.from_numpy(np.ascontiguousarray(letterbox(image=img)[..., ::-1])).permute(2, 0, 1).float() / 255
            for img in real_photos().values()
        ]
    )
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None  # a cumulative average over the one batch
    model.train()
    with torch.no_grad():
        model(batch)
    return model.eval()


@functools.lru_cache(maxsize=4)
def calibrated_model(cfg: str, imgsz: int = 640, seed: int = 0) -> nn.Module:
    """Random weights from an architecture YAML, BatchNorm statistics measured on the shipped photos."""
    from ultralytics import YOLO

    torch.manual_seed(seed)
    return calibrate_batchnorm(YOLO(cfg, verbose=False).model.float(), imgsz)


def detection_pairs(
    ours, theirs, iou_min: float = 0.99, conf_tol: float = 0.01, px_tol: float = 0.25
) -> list[tuple[int | None, float]]:
    """For each ultralytics box (rows x1 y1 x2 y2 conf cls), the index of ours it matches one-to-one (same class,
    |Δconf| ≤ conf_tol, and IoU ≥ iou_min or every corner within px_tol pixels; the best IoU among those left) or
    None, and its best IoU with any of ours. (The IoU of a box a few pixels thin drops by a percent for a tenth of a
    pixel: the float rounding of two fp32 networks, scaled up from a small input to the original image.)"""
    from torchvision.ops import box_iou

    # ultralytics' results stay on the device predict ran on; ours are on the host.
    ours = torch.as_tensor(ours, dtype=torch.float32).cpu()
    theirs = torch.as_tensor(theirs, dtype=torch.float32).cpu()
    if len(ours) == 0 or len(theirs) == 0:
        return [(None, 0.0)] * len(theirs)

    def corners(boxes: torch.Tensor) -> torch.Tensor:
        # Random weights can predict inverted boxes (x2 < x1); compare them as the rectangles they span.
        return torch.cat([torch.minimum(boxes[:, :2], boxes[:, 2:4]), torch.maximum(boxes[:, :2], boxes[:, 2:4])], 1)

    iou = box_iou(corners(theirs[:, :4]), corners(ours[:, :4]))
    same_class = theirs[:, 5:6] == ours[:, 5][None]
    close_conf = (theirs[:, 4:5] - ours[:, 4][None]).abs() <= conf_tol
    close_corners = (corners(theirs[:, :4])[:, None] - corners(ours[:, :4])[None]).abs().amax(-1) <= px_tol
    candidates = ((iou >= iou_min) | close_corners) & same_class & close_conf
    used: set[int] = set()
    pairs: list[tuple[int | None, float]] = []
    for i in range(len(theirs)):
        options = [j for j in candidates[i].nonzero().flatten().tolist() if j not in used]
        best = max(options, key=lambda j: float(iou[i, j])) if options else None
        if best is not None:
            used.add(best)
        pairs.append((best, float(iou[i].max())))
    return pairs


def match_detections(ours, theirs, iou_min: float = 0.99, conf_tol: float = 0.01, px_tol: float = 0.25) -> list[str]:
    """Problems found matching our boxes (rows x1 y1 x2 y2 conf cls) one-to-one with ultralytics' ones
    (`detection_pairs`)."""
    problems = []
    if len(ours) != len(theirs):
        problems.append(f"{len(ours)} boxes, ultralytics has {len(theirs)}")
    for row, (j, best_iou) in zip(theirs, detection_pairs(ours, theirs, iou_min, conf_tol, px_tol), strict=True):
        if j is None and len(ours):
            problems.append(f"ultralytics box {torch.as_tensor(row).tolist()} has no match (best IoU {best_iou:.4f})")
    return problems


def assert_same_top5(ours: list[int], theirs: list[int], their_probs, tie: float = 1e-4, label: str = "") -> None:
    """Same top-5 class ids in the same order as predict, except where predict's own probabilities of the two ids
    differ by at most `tie`: a near tie that float rounding may order either way."""
    probs = np.asarray(their_probs, dtype=np.float64)
    assert len(ours) == len(theirs), f"{label}: top-5 {ours} vs predict's {theirs}"
    for a, b in zip(ours, theirs, strict=True):
        assert a == b or abs(probs[a] - probs[b]) <= tie, (
            f"{label}: top-5 {ours} vs predict's {theirs}; p[{a}] = {probs[a]:.6f}, p[{b}] = {probs[b]:.6f}"
        )


def letterboxed(photos: dict[str, np.ndarray], imgsz: int) -> tuple[torch.Tensor, list]:
    """The photos letterboxed to imgsz × imgsz by the torch path (float NCHW batch), with each placement."""
    from yolojet.images import load_frame
    from yolojet.reference import pipeline as torch_pipeline

    inputs, boxes = [], []
    for image in photos.values():
        x, box = torch_pipeline.letterbox(load_frame(image), (imgsz, imgsz))
        inputs.append(x)
        boxes.append(box)
    return torch.stack(inputs), boxes


def ultralytics_results(model: nn.Module, cfg: str, images: list, imgsz: int, end2end: bool, conf: float) -> list:
    """ultralytics predict's Results per image on the host (rect=False: the square input our export takes)."""
    from copy import deepcopy

    from ultralytics import YOLO

    wrapper = YOLO(cfg, verbose=False)
    wrapper.model = deepcopy(model)  # predict fuses the model it is given in place
    wrapper.model.end2end = end2end
    nms = False if end2end else None
    results = wrapper.predict(images, imgsz=imgsz, conf=conf, verbose=False, nms=nms, rect=False)
    return [r.cpu() for r in results]  # predict leaves them on its device


def assert_identical_replays(first, second, batch: int, imgsz: int, replays: int = 20) -> None:
    """Two engines of one model give bit-identical raw outputs on fresh random batches, with every activation
    poisoned with NaN before each run (a value one of them fails to write then shows)."""
    for _ in range(replays):
        x = torch.rand(batch, 3, imgsz, imgsz, device=first.device)
        first.network.poison()
        second.network.poison()
        ours, theirs = first.raw(x), second.raw(x)
        ours = ours if isinstance(ours, tuple) else (ours,)
        theirs = theirs if isinstance(theirs, tuple) else (theirs,)
        for a, b in zip(ours, theirs, strict=True):
            assert torch.equal(a, b)


def sigint_as_in_a_terminal() -> None:
    """A `preexec_fn` for a command the test interrupts: SIGINT to its default, as a terminal's job has it. A shell
    starts background jobs (`pytest ... &`, nohup) with SIGINT ignored, which their children inherit, and Python
    then installs no KeyboardInterrupt handler: the command would run to its end and the test fail for the way the
    suite was started."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """`yolojet ARGV...` in this process: (exit status, stdout, stderr). argparse's usage errors exit through
    SystemExit, which a user sees as the status it carries."""
    from yolojet.cli import main

    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def self_signed_pem(folder: Path, stem: str) -> tuple[Path, Path]:
    """A self-signed certificate for `localhost` and its private key, as PEM files `STEM.cert.pem` and `STEM.key.pem`
    in `folder` (a key of its own each call)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / f"{stem}.cert.pem", folder / f"{stem}.key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pkcs8 = serialization.PrivateFormat.PKCS8
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, pkcs8, serialization.NoEncryption()))
    return cert_file, key_file


class RunningServer:
    """A yolojet `Server` on an event loop of its own thread, started at once; `stop()` shuts it down gracefully."""

    def __init__(self, models, options, **server_options) -> None:
        import asyncio
        import threading

        from yolojet.serve.server import Server

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = Server(models, options, **server_options)
        self.call(self.server.start())
        self.address = f"127.0.0.1:{self.server.port}"

    def call(self, coroutine):
        import asyncio

        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=120)

    def stop(self) -> None:
        self.call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)

    def stub(self, **channel_options):
        import grpc

        from yolojet.serve.proto.yolojet.v1 import inference_pb2_grpc as pb_grpc

        return pb_grpc.InferenceStub(grpc.insecure_channel(self.address, **channel_options))


class OpenStream:
    """An `InferStream` call kept open: answered one image, then waiting for requests put on `feed` (one of a server's
    calls under way, for its `max_calls`); `close()` ends it."""

    def __init__(self, stub, image: bytes) -> None:
        import queue

        from yolojet.serve.proto.yolojet.v1 import inference_pb2 as pb

        self.feed: queue.Queue = queue.Queue()
        self.replies = stub.InferStream(iter(self.feed.get, None), timeout=120)
        self.ask(pb.InferRequest(id="open", image=image))

    def ask(self, request) -> None:
        self.feed.put(request)
        assert next(self.replies).id == request.id

    def close(self) -> None:
        self.feed.put(None)
        assert list(self.replies) == []


def served(name: str, model_dir, max_batch: int = 4, **engine_options):
    """A model of the reference backend on the CPU, ready to serve (its latency measured)."""
    from yolojet.engine.engine import Engine
    from yolojet.serve.models import ServedModel, measure_latency

    engine = Engine.load(model_dir, device="cpu", backend="reference", max_batch=max_batch, **engine_options)
    return ServedModel.of(name, engine, measure_latency(engine, repeats=1))


# -- oriented boxes: exact rotated IoU and matching ---------------------------------------


def _corners(xywhr: np.ndarray) -> np.ndarray:
    cx, cy, w, h, t = (float(v) for v in xywhr)
    c, s = np.cos(t), np.sin(t)
    along, across = np.array([w / 2 * c, w / 2 * s]), np.array([-h / 2 * s, h / 2 * c])
    centre = np.array([cx, cy])
    return np.stack(
        [centre + along + across, centre + along - across, centre - along - across, centre - along + across]
    )


def _area(poly: np.ndarray) -> float:
    if len(poly) < 3:
        return 0.0
    x, y = poly[:, 0], poly[:, 1]
    return 0.5 * float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)))


def _ccw(poly: np.ndarray) -> np.ndarray:
    return poly if _area(poly) >= 0 else poly[::-1]


def _clip(subject: np.ndarray, clipper: np.ndarray) -> np.ndarray:
    """Sutherland–Hodgman: the part of convex `subject` inside convex `clipper` (both counter-clockwise)."""
    out = subject
    for a, b in zip(clipper, np.roll(clipper, -1, 0), strict=True):
        if len(out) == 0:
            break
        edge = b - a

        def inside(p, a=a, edge=edge):
            # Points on the edge (up to rounding) count as inside, so coincident edges clip nothing.
            cross = edge[0] * (p[1] - a[1]) - edge[1] * (p[0] - a[0])
            return cross >= -1e-9 * np.hypot(*edge) * (1.0 + np.hypot(*(p - a)))

        points = []
        for p, q in zip(out, np.roll(out, -1, 0), strict=True):
            if inside(p):
                points.append(p)
            if inside(p) != inside(q):
                d = q - p
                t = (edge[0] * (a[1] - p[1]) - edge[1] * (a[0] - p[0])) / (edge[0] * d[1] - edge[1] * d[0])
                points.append(p + t * d)
        out = np.array(points).reshape(-1, 2)
    return out


def rotated_iou(box1: np.ndarray, box2: np.ndarray) -> float:
    """Polygon IoU of two xywhr rectangles."""
    p1, p2 = _ccw(_corners(box1)), _ccw(_corners(box2))
    a1, a2 = abs(_area(p1)), abs(_area(p2))
    inter = abs(_area(_clip(p1, p2)))
    union = a1 + a2 - inter
    if union <= 1e-9:  # both degenerate: equal when their corners coincide
        return float(np.allclose(p1, p2, atol=1e-3))
    return inter / union


def match_rotated(ours: np.ndarray, theirs: np.ndarray, iou_min: float = 0.99, conf_tol: float = 0.01) -> list[str]:
    """Problems matching our rows [cx, cy, w, h, angle, conf, cls] one-to-one with ultralytics' ones.

    A box also matches when its centre and sides are within 0.05 px and its angle within 1e-3 rad: the IoU of a box
    under a pixel wide moves by percents for hundredths of a pixel (float rounding between two fp32 networks)."""
    problems = []
    if len(ours) != len(theirs):
        problems.append(f"{len(ours)} boxes, ultralytics has {len(theirs)}")
    used: set[int] = set()
    for i, row in enumerate(theirs):
        best, best_iou = None, 0.0
        for j, mine in enumerate(ours):
            if j in used or mine[6] != row[6] or abs(mine[5] - row[5]) > conf_tol:
                continue
            if np.hypot(*(mine[:2] - row[:2])) > max(row[2], row[3], 1.0):
                continue  # too far apart to overlap 99%
            iou = rotated_iou(row[:5], mine[:5])
            if np.abs(mine[:4] - row[:4]).max() <= 0.05 and abs(mine[4] - row[4]) <= 1e-3:
                iou = max(iou, 1.0)
            if iou > best_iou:
                best, best_iou = j, iou
        if best is None or best_iou < iou_min:
            problems.append(f"ultralytics box {i} {row.tolist()} has no match (best IoU {best_iou:.4f})")
            continue
        used.add(best)
    return problems
