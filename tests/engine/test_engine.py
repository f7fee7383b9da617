"""Whole models through the engine's Triton kernels (interpreter on CPU, the device on a GPU) vs the reference."""

from __future__ import annotations

import re
import threading

import pytest
import torch
from support import assert_identical_replays, calibrated_model, random_model, relative_l2

import yolojet
from yolojet.engine.engine import Engine
from yolojet.engine.network import batch_buckets
from yolojet.errors import EngineConfigError
from yolojet.kernels import dwconv as dwconv_kernels
from yolojet.kernels.conv import ConvConfig, ConvKind
from yolojet.kernels.conv import dispatch as conv_dispatch
from yolojet.kernels.dwconv import DwConvTile
from yolojet.kernels.pdl import pdl_available

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2}

MODELS = [
    ("yolo11n.yaml", None, torch.float16),
    ("yolo11n.yaml", None, torch.float32),
    ("yolov8n-seg.yaml", None, torch.float16),
    ("yolo26n-seg.yaml", True, torch.float32),
    ("yolo26n-pose.yaml", True, torch.float16),
    ("yolo11n-pose.yaml", None, torch.float32),
    ("yolo11n-obb.yaml", None, torch.float32),
    ("yolov8n-cls.yaml", None, torch.float16),
]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine")
    cache = {}

    def get(cfg: str, end2end: bool | None):
        if (cfg, end2end) not in cache:
            cache[cfg, end2end] = yolojet.export(
                random_model(cfg), out=root / f"{cfg}-{end2end}", imgsz=64, end2end=end2end
            )
        return cache[cfg, end2end]

    return get


@pytest.mark.parametrize(("cfg", "end2end", "dtype"), MODELS, ids=lambda p: str(p).replace("torch.", ""))
def test_engine_matches_reference(cfg, end2end, dtype, model_dirs):
    model_dir = model_dirs(cfg, end2end)
    engine = Engine.load(model_dir, device=DEVICE, half=dtype == torch.float16, max_batch=2, tune=False)
    reference = yolojet.load_reference(model_dir, device=DEVICE)
    x = torch.rand(2, 3, 64, 64, device=DEVICE)
    if reference.meta.end2end:  # the one-to-one selection runs on our kernels, not the reference's torch ops
        assert "one_to_one" in {launch.family for launch in engine.network.launch_list(2)}
    engine.network.poison()
    ours, expected = engine.raw(x), reference(x)
    ours = ours if isinstance(ours, tuple) else (ours,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for i, (o, e) in enumerate(zip(ours, expected, strict=True)):
        assert o.shape == e.shape
        assert not o.isnan().any(), f"output {i}: {int(o.isnan().sum())} NaN (unwritten)"
        if reference.meta.end2end and i == 0:
            # Top-k order among near-equal scores may differ at fp16; compare the selected score sets.
            o, e = o[..., 4].sort(-1).values, e[..., 4].sort(-1).values
        assert relative_l2(o, e) <= TOLERANCE[dtype], f"output {i}: relative L2 {relative_l2(o, e):.2e}"


def test_every_kernel_output_matches_reference_op(model_dirs):
    """Per-op check through dump: each launch's output vs the reference value of the same name."""
    model_dir = model_dirs("yolo11n.yaml", None)
    engine = Engine.load(model_dir, device=DEVICE, half=True, max_batch=1, tune=False)
    x = torch.rand(1, 3, 64, 64, device=DEVICE)
    ours = engine.dump(x)
    expected = yolojet.load_reference(model_dir, device=DEVICE).dump(x)
    checked = 0
    for name, value in ours.items():
        error = relative_l2(value, expected[name])
        assert error <= 1e-2, f"{name}: relative L2 {error:.2e}"
        checked += 1
    assert checked >= 88  # every conv, pool, attention and decode launch of yolo11n


def test_dump_shows_a_value_its_launch_left_unwritten_as_nan(model_dirs, monkeypatch):
    """dump poisons the buffers first: a launch that writes nothing shows as NaN, not as the last run's values."""
    engine = Engine.load(model_dirs("yolo11n.yaml", None), device=DEVICE, half=True, max_batch=1, tune=False)
    x = torch.rand(1, 3, 64, 64, device=DEVICE)
    stem = engine.network.launches[1][0]
    assert not engine.dump(x)[stem.outputs[0]].isnan().any()
    monkeypatch.setattr(stem, "run", lambda: None)
    assert engine.dump(x)[stem.outputs[0]].isnan().all()


def test_folds_take_the_upsample_and_copy_launches_unless_fusion_is_off(model_dirs):
    """With fusion (the default) each neck upsample is read by the 1x1 conv after its concat, and the 1x1 conv
    after C2PSA's concat reads the split half the concat would copy where it lies: neither the upsamples nor the
    copy has a launch of its own, and SPPF's three pools are one. With fuse=False each has its own. Both match the
    reference."""
    model_dir = model_dirs("yolo11n.yaml", None)
    reference = yolojet.load_reference(model_dir, device=DEVICE)
    x = torch.rand(2, 3, 64, 64, device=DEVICE)
    for fuse, alone in ((True, 0), (False, 1)):
        engine = Engine.load(model_dir, device=DEVICE, half=True, max_batch=2, tune=False, fuse=fuse)
        launches = engine.network.launch_list(2)
        upsamples = [launch.nodes for launch in launches if any(n.endswith("/upsample") for n in launch.nodes)]
        assert len(upsamples) == 2 and sum(len(nodes) == 1 for nodes in upsamples) == 2 * alone
        assert sum("<-" in launch.nodes[0] for launch in launches) == alone  # the concat copy
        folded = [launch for launch in launches if launch.family == "conv" and launch.nodes[0].endswith("/concat")]
        assert len(folded) == 1 - alone
        pools = [len(launch.nodes) for launch in launches if launch.family == "pool"]  # SPPF's three
        assert pools == ([3] if fuse else [1, 1, 1])
        engine.network.poison()
        assert relative_l2(engine.raw(x), reference(x)) <= TOLERANCE[torch.float16]


def test_classifier_pools_in_its_head_launch_unless_fusion_is_off(model_dirs):
    """With fusion the classifier's pooling, linear layer and softmax are one launch; with fuse=False the pooling
    is a launch of its own. Both match the reference, replay after replay (the head's arrival counts reset)."""
    model_dir = model_dirs("yolov8n-cls.yaml", None)
    reference = yolojet.load_reference(model_dir, device=DEVICE)
    for fuse, head in ((True, 3), (False, 2)):
        engine = Engine.load(model_dir, device=DEVICE, half=True, max_batch=2, tune=False, fuse=fuse)
        launches = engine.network.launch_list(2)
        assert [len(launch.nodes) for launch in launches if launch.family == "classify"][-1] == head
        for _ in range(2):
            x = torch.rand(2, 3, 64, 64, device=DEVICE)
            engine.network.poison()
            assert relative_l2(engine.raw(x), reference(x)) <= TOLERANCE[torch.float16]


@pytest.mark.gpu(reason="needs PDL (a Hopper GPU)")
@pytest.mark.skipif(DEVICE == "cuda" and not pdl_available(torch.device("cuda")), reason="needs PDL (a Hopper GPU)")
def test_dependent_launch_changes_no_value(tmp_path):
    """Kernels that start while their predecessor drains must still read only finished data: graph replays with
    programmatic dependent launch give bit-identical outputs to ordinary launches, replay after replay."""
    model_dir = yolojet.export(random_model("yolo11n-seg.yaml"), out=tmp_path / "m", imgsz=320)
    engines = [
        Engine.load(model_dir, device=DEVICE, half=True, max_batch=4, tune=False, pdl=pdl) for pdl in (True, False)
    ]
    assert engines[0].network.pdl and not engines[1].network.pdl
    assert_identical_replays(*engines, batch=4, imgsz=320)


def test_split_k_and_direct_tiles_across_the_network(model_dirs):
    """Every conv that the tuner may give the direct kernel or a split-K tile gets it (the largest split
    offered; in whole-pixel loads, with the poisoned arena's NaN in the stem's input rows' padding), the split
    ones all sharing the network's scratch: outputs still match the reference, and the arrival counts end at
    zero."""
    model_dir = model_dirs("yolo11n.yaml", None)
    engine = Engine.load(model_dir, device=DEVICE, half=True, max_batch=2, tune=False)
    split = direct = whole_pixels = 0
    for bucket in engine.network.buckets:
        for launch in engine.network.launch_list(bucket):
            directs = sorted(
                (c for c in launch.candidates if launch.family == "conv" and c.kind is ConvKind.DIRECT),
                key=lambda c: not c.whole_pixels,
            )
            splits = [c for c in launch.candidates if launch.family == "conv" and c.split_k > 1]
            if directs:
                launch.configure(directs[0])
                direct += 1
                whole_pixels += directs[0].whole_pixels
            elif splits:
                launch.configure(max(splits, key=lambda c: c.split_k))
                split += 1
    assert split >= 10 and direct >= 2 and whole_pixels == direct  # the stem's 3 channels and C3k2's 8-channel slices
    if DEVICE == "cuda":
        engine.network._capture()  # the graphs hold the launches' old configs
    x = torch.rand(2, 3, 64, 64, device=DEVICE)
    engine.network.poison()
    assert relative_l2(engine.raw(x), yolojet.load_reference(model_dir, device=DEVICE)(x)) <= 1e-2
    assert int(engine.network.split_scratch.arrivals.abs().sum()) == 0


def test_a_remembered_whole_pixel_tile_falls_back_to_gathers_where_pixels_are_not_words(model_dirs, monkeypatch):
    """Tuning results are keyed by shapes and strides, not addresses: a whole-pixel pick applied to a view whose
    pixels are not 8-byte words (here: every view, as far as either module can tell) runs with gathers."""
    for module in ("yolojet.engine.lowering", "yolojet.kernels.conv.dispatch"):
        monkeypatch.setattr(f"{module}.pixels_are_words", lambda x: False)
    model_dir = model_dirs("yolo11n.yaml", None)
    engine = Engine.load(model_dir, device=DEVICE, half=True, max_batch=1, tune=False)
    stem = engine.network.launch_list(1)[0]
    assert stem.nodes == ["model.0/conv"] and not any(c.whole_pixels for c in stem.candidates)
    stem.configure(ConvConfig(64, 16, 16, 2, 1, ConvKind.DIRECT, whole_pixels=True))
    if DEVICE == "cuda":
        engine.network._capture()
    x = torch.rand(1, 3, 64, 64, device=DEVICE)
    assert relative_l2(engine.raw(x), yolojet.load_reference(model_dir, device=DEVICE)(x)) <= 1e-2


def test_every_attention_tile_in_a_network(tmp_path):
    """yolo11n at 160 pixels: the PSA block attends over 25 tokens, where the candidate tiles differ in query rows
    and warps; each, given to the attention launch, still matches the reference."""
    model_dir = yolojet.export(random_model("yolo11n.yaml"), out=tmp_path / "m", imgsz=160)
    engine = Engine.load(model_dir, device=DEVICE, half=True, max_batch=1, tune=False)
    (attention,) = [launch for launch in engine.network.launch_list(1) if launch.family == "attention"]
    assert attention.tune_key.startswith("attention|") and len(set(attention.candidates)) >= 2
    x = torch.rand(1, 3, 160, 160, device=DEVICE)
    expected = yolojet.load_reference(model_dir, device=DEVICE)(x)
    for tile in attention.candidates:
        attention.configure(tile)
        if DEVICE == "cuda":
            engine.network._capture()
        engine.network.poison()
        assert relative_l2(engine.raw(x), expected) <= 1e-2, tile


def test_tma_tiles_on_every_conv_of_a_network(model_dirs, monkeypatch):
    """The TMA kernels (offered by the tuner from large batches on) given to every conv: 1x1 convs whose operands
    they can load (most, concat slices and residual ones included) run the GEMM one, k x k convs the patch one,
    every stride-2 conv whose input channels are whole K blocks included (its paired-pixel view); the others (the
    16-channel stride-2 conv, a folded upsample's conv, unaligned slices) keep the same tile gathered. Every other
    conv also stores its output by TMA where the output view allows. Outputs still match the reference."""
    model_dir = model_dirs("yolo11n.yaml", None)
    engine = Engine.load(model_dir, device=DEVICE, half=True, max_batch=2, tune=False)
    one_by_one = k_by_k = strided = 0  # in the batch-2 bucket, the one raw() runs
    for bucket in engine.network.buckets:
        for i, launch in enumerate(engine.network.launch_list(bucket)):
            if not (launch.tune_key and launch.family == "conv"):
                continue
            store = i % 2 == 0
            if re.search(r"\|w\(\d+, 1, 1, \d+\)", launch.tune_key):
                launch.configure(ConvConfig(32, 32, 32, 2, 2, ConvKind.TMA_1X1, persistent=True, tma_store=store))
                one_by_one += bucket == 2
            elif "|st[1, 1]|" in launch.tune_key:
                launch.configure(ConvConfig(32, 32, 32, 2, 2, ConvKind.TMA_PATCH, tile_w=8, tma_store=store))
                k_by_k += bucket == 2
            elif "|st[2, 2]|" in launch.tune_key and "|up" not in launch.tune_key:
                launch.configure(ConvConfig(32, 32, 32, 2, 2, ConvKind.TMA_PATCH, tile_w=8, tma_store=store))
                c_in = int(re.match(r"conv\|[^|]*\|x\(\d+, \d+, \d+, (\d+)\)", launch.tune_key).group(1))
                strided += bucket == 2 and c_in % 32 == 0
    if DEVICE == "cuda":
        engine.network._capture()
    launches: dict[str, list] = {"_conv1x1_tma_kernel": [], "_conv_tma_kernel": []}
    for name, counted in launches.items():
        monkeypatch.setattr(conv_dispatch, name, _Counting(getattr(conv_dispatch, name), counted))
    if DEVICE == "cuda":  # a graph replay calls no launcher: count one eager run of the bucket raw() replays
        engine.network._run_eager(2)
    x = torch.rand(2, 3, 64, 64, device=DEVICE)
    engine.network.poison()
    assert relative_l2(engine.raw(x), yolojet.load_reference(model_dir, device=DEVICE)(x)) <= 1e-2
    assert one_by_one >= 40 and len(launches["_conv1x1_tma_kernel"]) >= one_by_one // 2
    strides = [kwargs["STRIDE"] for kwargs in launches["_conv_tma_kernel"]]
    assert k_by_k >= 10 and strides.count(1) >= k_by_k // 2
    assert strided >= 4 and strides.count(2) == strided
    stored = [kwargs["TMA_STORE"] for kernel in launches.values() for kwargs in kernel]
    assert 0.3 * len(stored) <= sum(stored) <= 0.7 * len(stored)


def test_row_walking_depthwise_tiles_on_every_3x3_stride_1_dwconv(model_dirs, monkeypatch):
    """The row-walking depthwise tiles (offered by the tuner from large batches on) given to every 3x3 stride-1
    depthwise conv of a YOLO11 head: each runs that kernel, and each one's output matches the reference executor's
    (the class branch they sit on moves the network's raw output too little to show a wrong tap)."""
    model_dir = model_dirs("yolo11n.yaml", None)
    engine = Engine.load(model_dir, device=DEVICE, half=True, max_batch=2, tune=False)
    walking = []
    for launch in engine.network.launch_list(2):
        if launch.family == "dwconv" and "|w(3, 3, " in launch.tune_key and "|st[1, 1]|" in launch.tune_key:
            launch.configure(DwConvTile(16, 16, 2, 4))
            walking += launch.outputs
    launches: list = []
    monkeypatch.setattr(
        dwconv_kernels, "_dwconv3x3_rows_kernel", _Counting(dwconv_kernels._dwconv3x3_rows_kernel, launches)
    )
    x = torch.rand(2, 3, 64, 64, device=DEVICE)
    ours, expected = engine.dump(x), yolojet.load_reference(model_dir, device=DEVICE).dump(x)
    assert len(walking) >= 6 and len(launches) == len(walking)
    errors = {name: relative_l2(ours[name], expected[name]) for name in walking}
    assert max(errors.values()) <= 1e-2, errors


class _Counting:
    """A jitted kernel whose launches (kernel[grid](...)) are recorded, by their keyword (constexpr) arguments."""

    def __init__(self, kernel, launches: list) -> None:
        self.kernel, self.launches = kernel, launches

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append(kwargs)
            return self.kernel[grid](*args, **kwargs)

        return launch

    def __getattr__(self, name):  # the rest of the kernel (its warmup, for a compile without a launch) as it is
        return getattr(self.kernel, name)


def test_the_probability_copy_to_host_memory_holds_only_inside_its_block(model_dirs):
    """`copying_output` has the classifier's launch also store the probabilities in host memory (pinned on a GPU)
    while the block runs and never after: a dump, a timing or the network's own graph later must not overwrite
    what a predict path's run left there."""
    model_dir = model_dirs("yolov8n-cls.yaml", None)
    engine = Engine.load(model_dir, device=DEVICE, half=True, max_batch=2, tune=False)
    network = engine.network
    output = network.graph.outputs[0]
    host = torch.full(tuple(network.value_view(output, 2).shape), float("nan"), pin_memory=DEVICE == "cuda")
    network.input_view(2).copy_(torch.rand(2, 64, 64, 3, device=DEVICE))
    with network.copying_output(2, output, host) as copied:
        assert copied
        network.run_launches(2)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    assert torch.equal(host, network.value_view(output, 2).cpu())
    host.fill_(float("nan"))
    network.dump(torch.rand(2, 3, 64, 64, device=DEVICE))  # every launch again, eagerly: none may write `host`
    engine.raw(torch.rand(2, 3, 64, 64, device=DEVICE))
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    assert bool(host.isnan().all())
    with network.copying_output(2, output, None) as copied:  # no target: nothing set, copy after the network
        assert not copied
    with pytest.raises(EngineConfigError, match="copy of output"):
        with network.copying_output(2, output, torch.empty(3, 5)):
            pass


def test_batch_larger_than_max_batch_is_split(model_dirs):
    model_dir = model_dirs("yolov8n-cls.yaml", None)
    engine = Engine.load(model_dir, device=DEVICE, half=False, max_batch=2, tune=False)
    x = torch.rand(3, 3, 64, 64, device=DEVICE)
    expected = yolojet.load_reference(model_dir, device=DEVICE)(x)
    assert relative_l2(engine.raw(x), expected) <= 1e-4


def test_a_batch_smaller_than_its_bucket_fills_it_with_its_last_frame(tmp_path):
    """On a GPU a batch runs its whole bucket (one captured graph a bucket): the spare slots repeat the last frame,
    and the frames' own results are those of a run of just the frames."""
    import numpy as np

    model_dir = yolojet.export(calibrated_model("yolo11n.yaml", 64), out=tmp_path / "m", imgsz=64)
    engine = Engine.load(model_dir, device=DEVICE, half=False, max_batch=4, tune=False, rect=False)
    rng = np.random.default_rng(7)
    frames = [rng.integers(0, 255, (64, 64, 3), dtype=np.uint8) for _ in range(3)]
    path = engine.shape_path(64)
    results = {}
    for fill in (False, True):
        path.fill_bucket = fill
        path.count.fill_(-1)
        path.rows.fill_(float("nan"))
        results[fill] = engine(frames, conf=0.001)
    count, rows = path.count.cpu(), path.rows.cpu()
    assert int(count[3]) == int(count[2]) > 0
    # The same pixels in another slot: another place in the convolutions' tiles, so equal only to rounding.
    torch.testing.assert_close(rows[3, : count[3]], rows[2, : count[2]], rtol=1e-3, atol=2e-2)
    for alone, filled in zip(results[False], results[True], strict=True):
        np.testing.assert_allclose(filled.boxes.data, alone.boxes.data, rtol=1e-5, atol=1e-4)
    engine.close()


@pytest.mark.parametrize("cfg", ["yolo11n.yaml", "yolo11n-obb.yaml", "yolov8n-seg.yaml", "yolov8n-pose.yaml"])
def test_the_decode_writes_the_best_class_pass_that_nms_then_skips(cfg, tmp_path, monkeypatch):
    """In the predict path the head's decode and its score convs write NMS's best-class pass (for the whole bucket,
    here 4 slots for 3 frames), so NMS never launches its own; the box convs decode their boxes too and the extra
    convs a segment head's mask coefficients or a pose head's keypoints (not OBB's, whose boxes turn by its angles),
    and the decode no longer launches but for OBB; a single class (yolov8n-pose's) takes the pass too, where NMS
    would otherwise read its score row. Every detection, with and without a class filter, equals that of
    the path whose NMS runs the pass (the network's `writing_best_class` block refused): the same classes, the boxes,
    scores and keypoints to float32 rounding (the folding convs sum their products in another order), masks but for
    the odd pixel on a mask's edge."""
    import contextlib

    import numpy as np

    from yolojet.kernels import decode, nms
    from yolojet.kernels.conv import boxes, extras, scores

    imgsz, size = 64, (64, 96)
    model_dir = yolojet.export(calibrated_model(cfg, imgsz), out=tmp_path / "m", imgsz=imgsz)
    rng = np.random.default_rng(5)
    frames = [rng.integers(0, 255, (imgsz, imgsz + 16 * i, 3), dtype=np.uint8) for i in range(3)]
    launches: list = []
    monkeypatch.setattr(nms, "_best_class_kernel", _Counting(nms._best_class_kernel, launches))
    score_convs: list = []
    monkeypatch.setattr(scores, "_score_conv_kernel", _Counting(scores._score_conv_kernel, score_convs))
    box_convs: list = []
    monkeypatch.setattr(boxes, "_box_conv_kernel", _Counting(boxes._box_conv_kernel, box_convs))
    extra_convs: list = []
    monkeypatch.setattr(extras, "_extra_conv_kernel", _Counting(extras._extra_conv_kernel, extra_convs))
    decodes: list = []
    monkeypatch.setattr(decode, "_decode_kernel", _Counting(decode._decode_kernel, decodes))
    boxes_fold = "obb" not in cfg  # and with them every other part of the head: nothing left for the decode
    extras_fold = "seg" in cfg or "pose" in cfg
    single_class = "pose" in cfg
    filters = (None, (0,) if single_class else (0, 2, 5))

    @contextlib.contextmanager
    def refused(bucket, targets):
        yield False

    found = {}
    for fused in (True, False):
        # An engine each: on a GPU the path's graphs are captured once, with or without the decode's pass.
        # A rectangle: each level's map is wider than high, so its anchors lie H·W after the last level's.
        engine = Engine.load(model_dir, device=DEVICE, half=False, max_batch=4, tune=False, rect=False, imgsz=size)
        engine.shape_path(size).fill_bucket = True
        if not fused:
            monkeypatch.setattr(engine.network, "writing_best_class", refused)
        folded_before, boxes_before, extras_before = len(score_convs), len(box_convs), len(extra_convs)
        for classes in filters:
            before, decodes_before = len(launches), len(decodes)
            results = engine(frames, conf=0.01, classes=classes)
            # NMS's own pass: never where the head wrote it, and never for a single class, whose row it reads.
            assert (len(launches) == before) == (fused or single_class), "the best-class pass ran where written"
            assert (len(decodes) == decodes_before) == (fused and boxes_fold), "a fully folded head's decode ran"
            found[fused, classes] = [r.obb.data if r.obb is not None else r.boxes.data for r in results]
            found[fused, classes, "keypoints"] = [r.keypoints.data for r in results if r.keypoints is not None]
            found[fused, classes, "masks"] = [r.masks.data for r in results if r.masks is not None]
        assert (len(score_convs) > folded_before) == fused, "the score convs write the pass in the block alone"
        assert (len(box_convs) > boxes_before) == (fused and boxes_fold), "the box convs decode in the block alone"
        assert (len(extra_convs) > extras_before) == (fused and extras_fold), "the extra convs decode in the block"
        engine.close()
    for classes in filters:
        assert sum(len(rows) for rows in found[True, classes]) > 0
        for fused_rows, unfused_rows in zip(found[True, classes], found[False, classes], strict=True):
            fused_rows, unfused_rows = np.asarray(fused_rows), np.asarray(unfused_rows)
            assert fused_rows.shape == unfused_rows.shape
            # Boxes or rotated boxes, score, class.
            np.testing.assert_array_equal(fused_rows[:, -1], unfused_rows[:, -1])
            np.testing.assert_allclose(fused_rows[:, :-1], unfused_rows[:, :-1], rtol=1e-5, atol=1e-3)
        keypoints = list(zip(found[True, classes, "keypoints"], found[False, classes, "keypoints"], strict=True))
        for fused_points, unfused_points in keypoints:
            np.testing.assert_allclose(np.asarray(fused_points), np.asarray(unfused_points), rtol=1e-5, atol=1e-3)
        masks = list(zip(found[True, classes, "masks"], found[False, classes, "masks"], strict=True))
        for fused_mask, unfused_mask in masks:
            fused_mask, unfused_mask = np.asarray(fused_mask), np.asarray(unfused_mask)
            assert fused_mask.shape == unfused_mask.shape
            assert np.mean(fused_mask != unfused_mask) < 1e-3
        assert len(masks) == 3 * ("seg" in cfg) and len(keypoints) == 3 * ("pose" in cfg)


@pytest.mark.parametrize("cfg", ["yolo11n-pose.yaml", "yolo11n-obb.yaml", "yolo26n.yaml"])
def test_compiling_the_network_compiles_what_its_predict_path_runs(cfg, tmp_path, monkeypatch):
    """The start-up's compile pass (each launch compiled, nothing launched) also compiles the kernels the predict
    path runs in their stead, with best-class targets shaped as that path's (NmsScratch rows of the bucket's images
    and every anchor), without a class filter and with one (its mask off a 16-byte boundary, as the path's): each
    head fold's fused kernel, and the decode writing the pass (an OBB head's; a pose head folded every way launches
    none). Else a cold engine compiled them one after another at its first frame. An end-to-end head (YOLO26's
    one-to-one selection) takes no pass: nothing of it is compiled."""
    from yolojet.kernels import decode
    from yolojet.kernels.conv import boxes, extras, scores

    imgsz, end2end, obb = 64, "26" in cfg, "obb" in cfg
    model = calibrated_model(cfg, imgsz)
    model_dir = yolojet.export(model, out=tmp_path / "m", imgsz=imgsz, end2end=True if end2end else None)
    engine = Engine.load(model_dir, device=DEVICE, half=False, max_batch=2, tune=False, rect=False)
    compiled: list = []

    def recording(kernel, grid, pdl, compile_only=False):
        def record(*args, **named):
            score = kernel is scores._score_conv_kernel
            rows = args[6] if score else named.get("best_ptr")  # the pass's best scores
            mask = args[11] if score else named.get("class_mask_ptr")
            filtered = named.get("HAS_CLASS_MASK")
            named = dict(named, rows=None if rows is None else tuple(rows.shape))
            named["mask_on_16"] = mask.data_ptr() % 16 == 0 if filtered else None
            compiled.append((kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__, compile_only, named))

        return record

    for module in (decode, boxes, extras, scores):
        monkeypatch.setattr(module, "network_launcher", recording)
    network, anchors = engine.network, (imgsz // 8) ** 2 + (imgsz // 16) ** 2 + (imgsz // 32) ** 2
    for bucket in network.buckets:
        compiled.clear()
        for launch in network.launches[bucket]:
            launch.run(compile_only=True)
        assert compiled and all(only for _, only, _ in compiled), "a launch ran in the compile pass"
        kinds = sorted(name for name, _, _ in compiled)
        best = [named for name, _, named in compiled if name == "_score_conv_kernel" or named.get("BEST")]
        if end2end:
            assert kinds == ["_decode_kernel"] and not best
            continue
        folds = ["_extra_conv_kernel"] * 3 if "pose" in cfg else []
        folds += [] if obb else ["_box_conv_kernel"] * 3
        # The network's own decode, and for OBB the pass's two variants; two variants of each score conv.
        assert kinds == sorted(["_decode_kernel"] * (1 + 2 * obb) + folds + ["_score_conv_kernel"] * 6)
        assert len(best) == 2 * (3 + obb) and all(named["rows"] == (bucket, anchors) for named in best)
        assert sorted(named["HAS_CLASS_MASK"] for named in best) == [False] * (3 + obb) + [True] * (3 + obb)
        assert not any(named["mask_on_16"] for named in best if named["HAS_CLASS_MASK"])
    engine.close()


def test_bad_inputs_and_options(model_dirs):
    model_dir = model_dirs("yolov8n-cls.yaml", None)
    engine = Engine.load(model_dir, device=DEVICE, half=False, max_batch=1, tune=False)
    with pytest.raises(EngineConfigError, match=r"expected a float \(N, 3, 64, 64\)"):
        engine.raw(torch.rand(1, 3, 32, 32, device=DEVICE))
    with pytest.raises(EngineConfigError, match="floating-point"):
        engine.raw(torch.zeros(1, 3, 64, 64, dtype=torch.uint8, device=DEVICE))
    with pytest.raises(EngineConfigError, match="backend"):
        Engine.load(model_dir, device=DEVICE, backend="tensorrt")
    if not pdl_available(torch.device(DEVICE)):
        with pytest.raises(EngineConfigError, match="pdl=True: programmatic dependent launch needs"):
            Engine.load(model_dir, device=DEVICE, tune=False, pdl=True)
    with pytest.raises(EngineConfigError, match="runs on 'cuda' or 'cpu'"):
        Engine.load(model_dir, device="meta", backend="triton")
    with pytest.raises(EngineConfigError, match="device 'bogus'"):
        Engine.load(model_dir, device="bogus")
    if not torch.cuda.is_available():
        with pytest.raises(EngineConfigError, match="no CUDA GPU is visible here"):
            Engine.load(model_dir, device="cuda", backend="reference")
    with pytest.raises(EngineConfigError, match="imgsz '64'"):
        Engine.load(model_dir, device=DEVICE, imgsz="64")
    with pytest.raises(EngineConfigError, match=r"max_batch 2\.5"):
        Engine.load(model_dir, device=DEVICE, max_batch=2.5)


def test_the_default_gpu_has_its_index(monkeypatch):
    """The default device is the GPU with its index, as 'cuda' is: a frame's device (`cuda:0`) compares equal to it,
    so a caller's tensor on the GPU is copied into its slot rather than read later, after the caller rewrote it."""
    from yolojet.engine import engine as engine_module

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert engine_module._device(None) == engine_module._device("cuda") == torch.device("cuda", 1)
    assert engine_module._device("cuda:0") == torch.device("cuda", 0)


def test_the_engine_lock_selects_its_gpu_while_held(monkeypatch):
    """The engine's lock makes its GPU the current device while held, nested or not, and gives back the caller's
    device and the lock on the way out, also when the block raises (the device itself is torch's: recorded here, as
    this machine may have no second GPU)."""
    from yolojet.engine import engine as engine_module

    current = [0]

    def exchange(index):
        previous, current[0] = current[0], index
        return previous

    monkeypatch.setattr(torch.cuda, "_exchange_device", exchange)
    monkeypatch.setattr(torch.cuda, "_maybe_exchange_device", exchange)
    lock = engine_module._DeviceLock(torch.device("cuda", 1))
    with lock:
        assert current == [1]
        with lock:
            assert current == [1]
        assert current == [1]
    assert current == [0]
    with pytest.raises(KeyError), lock:
        raise KeyError("a failing run")
    assert current == [0]
    taken: list[bool] = []
    other = threading.Thread(target=lambda: taken.append(lock._lock.acquire(blocking=False)))
    other.start()
    other.join()
    assert taken == [True]  # released: another thread takes it
    on_the_cpu = engine_module._DeviceLock(torch.device("cpu"))
    with on_the_cpu:
        assert current == [0]


def test_imgsz_at_load_derives_the_network_and_rounds_up_to_the_stride(model_dirs, capsys):
    """One export serves every input size; a size that is not a stride multiple is rounded up with a notice, as
    ultralytics' predict does."""
    model_dir = model_dirs("yolo11n.yaml", None)
    engine = Engine.load(model_dir, device="cpu", backend="reference", imgsz=(33, 96))
    assert engine.meta.imgsz == (64, 96)
    assert "imgsz 33x96 is not a multiple of the model's stride 32; running at 64x96" in capsys.readouterr().err
    x = torch.rand(1, 3, 64, 96)
    exported = yolojet.load_reference(
        yolojet.export(random_model("yolo11n.yaml"), out=model_dir.parent / "r", imgsz=(64, 96)), device="cpu"
    )
    torch.testing.assert_close(engine.raw(x), exported(x), rtol=0, atol=0)


def test_batch_buckets():
    assert batch_buckets(1) == [1]
    assert batch_buckets(6) == [1, 2, 4, 6]
    assert batch_buckets(64) == [1, 2, 4, 8, 16, 32, 64]


def test_staging_writes_the_options_and_frame_table_the_kernels_read(model_dirs):
    """What `stage` writes into a parity's pinned inputs, read back through the torch views the captured path copies
    from: thresholds, limits, the class mask, each frame's table row and box parameters, the spare slots repeating
    the last frame; and a later batch with other options and frames rewrites every field."""
    import numpy as np

    from yolojet.engine.predict_path import MAX_NMS, PredictOptions
    from yolojet.geometry import Letterbox
    from yolojet.images.frames import Frame
    from yolojet.kernels.preprocess import frame_row

    engine = Engine.load(model_dirs("yolo11n.yaml", None), device=DEVICE, max_batch=4, tune=False, rect=False)
    path = engine.shape_path(64)
    path.fill_bucket = True  # as on a GPU: a batch of 3 runs its bucket of 4
    rng = np.random.default_rng(3)
    for options, sizes in (
        (
            PredictOptions(conf=0.31, iou=0.55, max_det=500, classes=(2, 7), agnostic=True),
            [(48, 80), (90, 30), (64, 64)],
        ),
        (PredictOptions(conf=0.05, iou=0.7, max_det=20), [(100, 20), (33, 71), (64, 65)]),
    ):
        frames = [Frame(torch.from_numpy(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)), bgr=True) for h, w in sizes]
        path.stage(1, frames, options)
        host = path.inputs.views(path.inputs.host[1])
        assert host["thresholds"].tolist() == torch.tensor([options.conf, options.iou], dtype=torch.float32).tolist()
        assert host["limits"].tolist() == [min(options.max_det, path.capacity), MAX_NMS, int(options.agnostic)]
        mask = host["class_mask"].tolist()
        assert mask == [int(options.classes is None or c in options.classes) for c in range(len(mask))]
        placed = [Letterbox.fit(f.shape, (64, 64)) for f in frames]
        rows = [frame_row(f.pixels, bgr=True, placement=p) for f, p in zip(frames, placed, strict=True)]
        assert host["table"][:4].tolist() == rows + rows[-1:]
        params = torch.tensor([p.box_params() for p in placed + placed[-1:]], dtype=torch.float32)
        assert torch.equal(host["box_params"][:4], params)
    engine.close()
