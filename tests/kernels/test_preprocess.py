"""The batched letterbox kernel and the letterbox placement against ultralytics' own LetterBox on real photos."""

import functools
import os
import random

import cv2
import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from skimage import data as skdata
from ultralytics.data.augment import LetterBox
from ultralytics.utils import ASSETS

from yolojet.geometry import Letterbox
from yolojet.kernels.preprocess import FRAME_FIELDS, frame_row, letterbox_frames

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F16, F32 = torch.float16, torch.float32
SENTINEL = 7.0
OUT_CHANNELS = slice(2, 5)  # the output is a 3-channel slice of an 8-channel-wide buffer, like the engine's input


@functools.cache
def photo_bgr(name: str) -> np.ndarray:
    """A real photo as a contiguous uint8 BGR (h, w, 3) array."""
    if name in ("bus", "zidane"):
        return cv2.imread(str(ASSETS / f"{name}.jpg"))
    return np.ascontiguousarray(getattr(skdata, name)()[..., ::-1])


def reference(img_bgr: np.ndarray, target: tuple[int, int]) -> torch.Tensor:
    """ultralytics' predict pre-processing of a BGR image: LetterBox, BGR → RGB, /255 (float64)."""
    padded = LetterBox(target, auto=False)(image=img_bgr)
    return torch.from_numpy(padded[..., ::-1] / 255)


def run_batch(frames: list, target: tuple[int, int], dtype: torch.dtype, bgr: list[bool] | bool = True):
    """letterbox_frames of every frame in one launch, into NaN-poisoned channel slices of a SENTINEL-filled
    (N, H, W, 8) buffer; returns the slices (on the CPU) and the placements, after checking nothing outside the
    slices was written."""
    frames = [torch.as_tensor(f, device=DEVICE) for f in frames]
    orders = bgr if isinstance(bgr, list) else [bgr] * len(frames)
    buf = torch.full((len(frames), *target, 8), SENTINEL, dtype=dtype, device=DEVICE)
    out = buf[..., OUT_CHANNELS]
    out.fill_(float("nan"))
    placements = [Letterbox.fit(tuple(f.shape[:2]), target) for f in frames]
    rows = [frame_row(f, bgr=b, placement=p) for f, b, p in zip(frames, orders, placements, strict=True)]
    table = torch.tensor(rows, dtype=torch.int64, device=DEVICE)
    letterbox_frames(out, table)
    rest = torch.cat([buf[..., : OUT_CHANNELS.start], buf[..., OUT_CHANNELS.stop :]], dim=-1)
    assert bool((rest == SENTINEL).all()), "kernel wrote outside its channel slice"
    return out.cpu(), placements


def run(frame, target: tuple[int, int], dtype: torch.dtype, bgr: bool):
    out, placements = run_batch([frame], target, dtype, bgr)
    return out[0], placements[0]


def assert_matches(out: torch.Tensor, ref: torch.Tensor, lb) -> None:
    """Pad exactly 114/255 in out's dtype; the image within 1.5/255 (mean 0.3/255) of cv2's uint8 resize."""
    assert not bool(out.isnan().any()), f"{int(out.isnan().sum())} outputs are NaN (unwritten?)"
    inside = torch.zeros(out.shape[:2], dtype=torch.bool)
    inside[lb.pad_top : lb.pad_top + lb.new_h, lb.pad_left : lb.pad_left + lb.new_w] = True
    pad = torch.tensor(114 / 255, dtype=F32).to(out.dtype)
    assert bool((out[~inside] == pad).all()), "pad region is not 114/255"
    err = (out.double() - ref)[inside].abs()
    assert float(err.max()) <= 1.5 / 255, f"max |diff| {float(err.max()) * 255:.3f}/255"
    assert float(err.mean()) <= 0.3 / 255, f"mean |diff| {float(err.mean()) * 255:.3f}/255"


def test_params_match_ultralytics():
    rng = random.Random(0)
    for _ in range(500):
        h0, w0 = rng.randint(1, 4000), rng.randint(1, 4000)
        target = rng.randint(1, 1280), rng.randint(1, 1280)
        ref = LetterBox(target, auto=False).get_params({"img": np.empty((h0, w0, 0), np.uint8)})
        lb = Letterbox.fit((h0, w0), target)
        assert (lb.pad_top, lb.pad_left, (lb.new_w, lb.new_h)) == (ref["top"], ref["left"], ref["new_unpad"])


PHOTOS = ["bus", "zidane", "astronaut", "coffee", "chelsea"]
TARGETS = [(64, 64), (96, 160), (160, 96), (128, 128)]


@pytest.mark.parametrize("dtype", [F16, F32])
@pytest.mark.parametrize("target", TARGETS)
def test_mixed_photos_in_one_launch_match_ultralytics(target, dtype):
    """Photos of five sizes and aspect ratios, one slot each, in one launch."""
    images = [photo_bgr(name) for name in PHOTOS]
    out, placements = run_batch(images, target, dtype)
    for img, got, lb in zip(images, out, placements, strict=True):
        assert_matches(got, reference(img, target), lb)


@pytest.mark.parametrize("dtype", [F16, F32])
def test_rows_of_four_written_whole(dtype):
    """pad_row: each pixel's three channels as without it, and the row's fourth channel zero; nothing past the batch's
    slots written."""
    images = [photo_bgr(name) for name in PHOTOS[:3]]
    target = (96, 160)
    expected, placements = run_batch(images, target, dtype)
    frames = [torch.as_tensor(f, device=DEVICE) for f in images]
    rows = [frame_row(f, bgr=True, placement=p) for f, p in zip(frames, placements, strict=True)]
    table = torch.tensor(rows, dtype=torch.int64, device=DEVICE)
    buf = torch.full((len(frames) + 1, *target, 4), float("nan"), dtype=dtype, device=DEVICE)
    letterbox_frames(buf[: len(frames), ..., :3], table, pad_row=True)
    got = buf.cpu()
    assert torch.equal(got[: len(frames), ..., :3], expected)
    assert bool((got[: len(frames), ..., 3] == 0).all())
    assert bool(got[len(frames)].isnan().all()), "the slot past the batch was written"


def test_half_is_the_float_result_rounded():
    """fp16 slots hold exactly the fp32 result rounded to half: the fp16 path scales by a product, the fp32 path
    divides, and both give torch's (x / 255).half()."""
    images = [photo_bgr(name) for name in PHOTOS]
    half, _ = run_batch(images, (128, 128), F16)
    full, _ = run_batch(images, (128, 128), F32)
    assert torch.equal(half, full.half())
    values = torch.arange(256, dtype=F32)
    assert torch.equal((values * (1 / 255)).half(), (values / 255).half())


def test_rgb_input_matches_bgr_input():
    img = photo_bgr("astronaut")
    out, _ = run_batch([img, np.ascontiguousarray(img[..., ::-1])], (96, 160), F32, bgr=[True, False])
    assert torch.equal(out[1], out[0])


def test_four_channels_drop_alpha():
    img = photo_bgr("coffee")
    alpha = np.random.default_rng(0).integers(0, 256, (*img.shape[:2], 1), dtype=np.uint8)
    frames = [img, np.concatenate([img, alpha], axis=-1), np.concatenate([img[..., ::-1], alpha], axis=-1)]
    out, _ = run_batch(frames, (160, 96), F16, bgr=[True, True, False])
    assert torch.equal(out[1], out[0])
    assert torch.equal(out[2], out[0])


@pytest.mark.parametrize("bgr", [True, False])
def test_grey_replicated(bgr):
    grey = skdata.camera()
    out, lb = run(grey[..., None], (96, 160), F32, bgr=bgr)
    assert_matches(out, reference(cv2.cvtColor(grey, cv2.COLOR_GRAY2BGR), (96, 160)), lb)


def test_strided_views_read_in_place():
    """A crop with the full photo's row stride, and a channels-first tensor seen as (h, w, C) (channel stride h·w),
    read where they lie."""
    full = torch.from_numpy(photo_bgr("bus"))
    crop = full[300:323, 400:431]  # 23×31 view with the full photo's row stride
    planar = full[:120, :90].permute(2, 0, 1).contiguous().permute(1, 2, 0)
    assert not crop.is_contiguous() and planar.stride(2) == 120 * 90
    out, placements = run_batch([crop, planar], (64, 64), F32)
    assert (placements[0].new_h, placements[0].new_w) == (47, 64)
    assert_matches(out[0], reference(crop.numpy().copy(), (64, 64)), placements[0])
    assert_matches(out[1], reference(planar.numpy().copy(), (64, 64)), placements[1])


def test_shrunk_crops_equal_cv2_bit_for_bit():
    """Shrunk, the letterbox is cv2.resize's INTER_LINEAR exactly (its taps from the quotient the table row holds, its
    fixed-point weights), on random crops of real photos, laid out packed and planar."""
    rng = random.Random(3)
    for name in ("bus", "zidane", "coffee"):
        img = photo_bgr(name)
        h, w = img.shape[:2]
        ch, cw = rng.randint(h // 3, h), rng.randint(w // 3, w)
        y, x = rng.randint(0, h - ch), rng.randint(0, w - cw)
        crop = torch.from_numpy(np.ascontiguousarray(img[y : y + ch, x : x + cw]))
        planar = crop.permute(2, 0, 1).contiguous().permute(1, 2, 0)
        target = (rng.randint(40, 130), rng.randint(40, 130))
        out, placements = run_batch([crop, planar], target, F32)
        assert placements[0].new_h < ch and placements[0].new_w < cw
        expected = (reference(crop.numpy(), target) * 255).round()
        for got in out:
            assert torch.equal((got.double() * 255).round(), expected), name


@pytest.mark.parametrize("bgr", [True, False])
def test_packed_frames_equal_the_general_path(bgr):
    """A frame whose channels are neighbouring bytes takes the packed path (32-bit offsets, channels at fixed offsets),
    others the general one: the same photo laid out both ways gives the same values bit for bit."""
    packed = torch.from_numpy(photo_bgr("coffee"))
    planar = packed.permute(2, 0, 1).contiguous().permute(1, 2, 0)
    target = (96, 160)
    rows = [frame_row(f, bgr=bgr, placement=Letterbox.fit(tuple(f.shape[:2]), target)) for f in (packed, planar)]
    assert [row[12] for row in rows] == [1, 0]
    out, _ = run_batch([packed, planar], target, F16, bgr=bgr)
    assert torch.equal(out[0], out[1])
    grey = frame_row(packed[..., :1], bgr=bgr, placement=Letterbox.fit(tuple(packed.shape[:2]), target))
    assert grey[12] == 0  # one channel: its neighbours' bytes are other pixels


def test_exact_size_is_a_copy():
    img = np.ascontiguousarray(photo_bgr("chelsea")[100:164, 200:248])  # 64×48 into 64×64: gain 1, no resize
    out, lb = run(img, (64, 64), F32, bgr=True)
    assert (lb.new_h, lb.new_w, lb.pad_top, lb.pad_left) == (64, 48, 0, 8)
    assert_matches(out, reference(img, (64, 64)), lb)
    assert float((out.double() - reference(img, (64, 64))).abs().max()) <= 1e-6


@pytest.mark.parametrize("shape", [(1, 1, 3), (1, 37, 3), (29, 1, 1)])
def test_one_pixel_sides(shape):
    """A side of one pixel is a value in the table like any other (Triton specializes arguments equal to 1)."""
    img = np.random.default_rng(1).integers(0, 256, shape, dtype=np.uint8)
    out, lb = run(img, (32, 32), F32, bgr=True)
    bgr = cv2.cvtColor(img, cv2.COLOR_GRAY2BGR) if shape[2] == 1 else img
    assert_matches(out, reference(bgr, (32, 32)), lb)


def _frame(shape, dtype=torch.uint8):
    return torch.zeros(shape, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize(
    ("frame", "match"),
    [
        (_frame((32, 32, 3), torch.float32), "frame: .* expected uint8"),
        (_frame((32, 32)), "frame: .* expected uint8"),
        (_frame((32, 32, 5)), "frame: 5 channels"),
        (_frame((0, 32, 3)), "frame: empty"),
    ],
)
def test_frame_row_rejects_bad_frames(frame, match):
    with pytest.raises(ValueError, match=match):
        frame_row(frame, bgr=True, placement=Letterbox.fit((32, 32), (64, 64)))


def test_frame_row_rejects_a_placement_of_another_frame():
    with pytest.raises(ValueError, match="placement"):
        frame_row(_frame((32, 32, 3)), bgr=True, placement=Letterbox.fit((64, 32), (64, 64)))


@pytest.mark.parametrize(
    ("out", "table", "match"),
    [
        (_frame((1, 64, 64, 4), F32), _frame((1, FRAME_FIELDS), torch.int64), "out: shape"),
        (_frame((1, 64, 64, 3), torch.float64), _frame((1, FRAME_FIELDS), torch.int64), "out: dtype"),
        (_frame((2, 64, 64, 3), F32), _frame((1, FRAME_FIELDS), torch.int64), "table"),
        (_frame((1, 64, 64, 3), F32), _frame((1, FRAME_FIELDS), torch.int32), "table"),
    ],
)
def test_launcher_rejects_bad_arguments(out, table, match):
    with pytest.raises(ValueError, match=match):
        letterbox_frames(out, table)


def test_pad_row_needs_rows_of_four():
    out = _frame((1, 64, 64, 8), F16)[..., :3]
    with pytest.raises(ValueError, match="pixel stride 8, pad_row needs rows of 4"):
        letterbox_frames(out, _frame((1, FRAME_FIELDS), torch.int64), pad_row=True)


# -- classification: Pillow's resize and centre crop on the resample kernel -----------------------------------


def run_classify(frame: torch.Tensor, imgsz, dtype: torch.dtype, bgr: bool) -> torch.Tensor:
    """DeviceResamplePlan into a NaN-poisoned channel slice of a SENTINEL-filled buffer, as (3, h, w) on the CPU."""
    from yolojet.engine.classify_input import DeviceResamplePlan
    from yolojet.reference.classify import classify_plan

    plan = classify_plan(int(frame.shape[0]), int(frame.shape[1]), imgsz)
    buf = torch.full((*plan.crop, 8), SENTINEL, dtype=dtype, device=DEVICE)
    out = buf[..., OUT_CHANNELS]
    out.fill_(float("nan"))
    DeviceResamplePlan(plan, int(frame.shape[2]), torch.device(DEVICE))(out, frame.to(DEVICE), bgr=bgr)
    rest = torch.cat([buf[..., : OUT_CHANNELS.start], buf[..., OUT_CHANNELS.stop :]], dim=-1)
    assert bool((rest == SENTINEL).all()), "kernel wrote outside its channel slice"
    return out.permute(2, 0, 1).cpu()


def torch_classify(frame: torch.Tensor, imgsz, bgr: bool) -> torch.Tensor:
    """The torch path, held bit for bit to PIL and to ultralytics' predict by tests/pipeline."""
    from yolojet.images import Frame
    from yolojet.reference.classify import classify_preprocess

    return classify_preprocess(Frame(frame, bgr=bgr), imgsz)


@pytest.mark.parametrize(("imgsz", "dtype"), [(224, F32), (224, F16), (96, F32), (7, F16), ((96, 160), F32)])
@pytest.mark.parametrize("name", PHOTOS)
def test_classify_resample_equals_torch_path(name, imgsz, dtype):
    frame = torch.from_numpy(photo_bgr(name))
    ours = run_classify(frame, imgsz, dtype, bgr=True)
    assert not bool(ours.isnan().any()), f"{int(ours.isnan().sum())} outputs unwritten"
    assert torch.equal(ours, torch_classify(frame, imgsz, bgr=True).to(dtype))


def test_classify_resample_layouts():
    bgr = torch.from_numpy(photo_bgr("coffee"))
    expected = torch_classify(bgr, 96, bgr=True)
    assert torch.equal(run_classify(bgr.flip(-1).contiguous(), 96, F32, bgr=False), expected)
    alpha = torch.randint(0, 256, (*bgr.shape[:2], 1), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(run_classify(torch.cat([bgr, alpha], -1), 96, F32, bgr=True), expected)
    grey = torch.from_numpy(skdata.camera())[..., None]
    assert torch.equal(run_classify(grey, 96, F32, bgr=True), torch_classify(grey, 96, bgr=True))
    crop = torch.from_numpy(photo_bgr("bus"))[300:341, 400:431]  # 41x31 view: an upscale from a strided frame
    assert torch.equal(run_classify(crop, 64, F32, bgr=True), torch_classify(crop, 64, bgr=True))
    exact = torch.from_numpy(photo_bgr("chelsea"))[100:164, 200:264]  # already 64x64: no pass but the crop
    assert torch.equal(run_classify(exact, 64, F32, bgr=True), torch_classify(exact, 64, bgr=True))


@pytest.mark.parametrize(
    ("imgsz", "passes"),
    [((40, 160), (0, 1)), ((160, 40), (1, 0)), ((48, 200), (0,)), ((270, 40), (1,))],
    ids=["vertical-first", "horizontal-first", "rows-only", "columns-only"],
)
def test_classify_resample_pass_orders(imgsz, passes, monkeypatch):
    """Pillow 13 runs the vertical pass first when the height shrinks by over twice the width's shrink; an axis
    left at its size gets no pass. Each order, and each single pass, equals the torch path. Planned as Pillow 13
    plans whatever Pillow is installed, so the kernel's vertical-first order is always run (the torch path is held
    to the installed Pillow itself by tests/pipeline)."""
    from yolojet.reference import classify

    monkeypatch.setattr(classify, "_pillow_may_resize_vertically_first", lambda: True)
    frame = torch.from_numpy(photo_bgr("bus"))[500:770, 300:500]  # a 270 x 200 view of a wider frame
    plan = classify.classify_plan(*frame.shape[:2], imgsz)
    assert tuple(step.axis for step in plan.passes) == passes
    assert torch.equal(run_classify(frame, imgsz, F32, bgr=True), torch_classify(frame, imgsz, bgr=True))


def test_resample_pass_rejects_bad_arguments():
    from yolojet.kernels.preprocess import resample_pass

    src = _frame((10, 12, 3))
    index = torch.zeros(5, 2, dtype=torch.int32, device=DEVICE)
    weights = torch.zeros(5, 2, dtype=torch.int32, device=DEVICE)
    out = torch.zeros(5, 12, 3, device=DEVICE)
    with pytest.raises(ValueError, match="axis"):
        resample_pass(out, src, 2, index, weights, bgr=True)
    with pytest.raises(ValueError, match="int32"):
        resample_pass(out, src, 0, index.long(), weights, bgr=True)
    with pytest.raises(ValueError, match="along axis"):
        resample_pass(out, src, 1, index, weights, bgr=True)
    with pytest.raises(ValueError, match="out: dtype"):
        resample_pass(out, src, 0, index, weights, bgr=None)  # an intermediate pass writes uint8
    with pytest.raises(ValueError, match="src: 5 channels"):
        resample_pass(out, _frame((10, 12, 5)), 0, index, weights, bgr=True)
