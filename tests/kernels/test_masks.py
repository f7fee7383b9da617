"""assemble_masks and masks_to_original (the segment head after NMS, retina_masks=False) against ultralytics'
`process_mask(..., upsample=True)` and `scale_masks(...) > 0.5`, and end to end against the torch pipeline's
`masks_upsampled`.

Masks are thresholds of float sums, and the kernels add in another order than torch's matmul: a pixel may only
differ where torch's value lies within 1e-3 of the threshold (logit 0, or 0.5 for the resized 0/1 masks), and
such pixels stay under 0.1% of those compared. fp16 prototypes get the same bound: the kernel feeds the fp32
coefficients to the tensor cores as two fp16 halves, so its logits are as accurate as ultralytics' fp32 matmul
of proto.float() (one fp16 dot puts pixels outside the band). Outputs start filled with 2 (bool outputs are
views of such uint8 buffers): rows below the count must hold 0/1 everywhere, rows from the count on must still
hold 2.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from ultralytics.utils.ops import process_mask, scale_masks

from yolojet.geometry import Letterbox
from yolojet.kernels.masks import assemble_masks, masks_to_original
from yolojet.reference.segment import masks_upsampled

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
N, K, NM = 2, 24, 32
MH, MW = 16, 20
H, W = 4 * MH, 4 * MW
POISON = 2
BAND = 1e-3  # |torch value − threshold| within which a pixel may differ
MAX_BAND_FRACTION = 1e-3  # of the pixels compared
# Original image sizes: wide (padding top and bottom), tall (left and right), a half-pixel padding that
# scale_masks rounds down, one equal to the input (no resize) and one upscaled from a small image.
ORIGINALS = [(50, 100), (97, 61), (63, 80), (64, 80), (30, 37)]


def special_boxes() -> torch.Tensor:
    """xyxy boxes in input pixels at the crop's edge cases."""
    return torch.tensor(
        [
            [0.0, 0.0, W, H],  # the whole input
            [-12.5, -7.0, W + 9.0, H + 3.5],  # past every border
            [0.0, 30.0, 17.0, H],  # touching left and bottom exactly
            [60.0, 0.0, W, 11.0],  # touching right and top exactly
            [10.0, 20.0, 10.5, 20.5],  # one pixel: column 10, row 20
            [30.2, 30.2, 30.7, 30.9],  # holds no pixel index: empty
            [5.0, 5.0, 6.0, 6.0],  # exactly one pixel
            [44.0, 40.0, 30.0, 35.0],  # inverted: empty
            [71.5, 50.25, 79.99, 63.01],  # fractional, in the corner
        ]
    )


def make_rows(seed: int) -> torch.Tensor:
    """(N, K, 6 + NM) rows: the special boxes, then random boxes from tiny to half the input, some crossing the
    border; normal coefficients."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(N, K, 2, generator=g) * torch.tensor([W + 10.0, H + 10.0]) - 10.0
    wh = torch.rand(N, K, 2, generator=g) ** 2 * torch.tensor([W / 2, H / 2]) + 0.3
    boxes = torch.cat([xy, xy + wh], -1)
    special = special_boxes()
    boxes[0, : len(special)] = special
    boxes[1, -len(special) :] = special
    score = torch.rand(N, K, 1, generator=g)
    cls = torch.randint(5, (N, K, 1), generator=g).float()
    coefs = torch.randn(N, K, NM, generator=g)
    return torch.cat([boxes, score, cls, coefs], -1).to(DEVICE).contiguous()


def make_proto(seed: int, dtype: torch.dtype) -> torch.Tensor:
    """(N, MH, MW, NM) NHWC prototypes: a channel slice of a wider buffer, as the engine holds them."""
    g = torch.Generator().manual_seed(seed)
    wide = torch.randn(N, MH, MW, NM + 8, generator=g).to(dtype)
    return wide.to(DEVICE)[..., 4 : 4 + NM]


def poisoned(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer, out): a uint8 buffer of POISON and the `dtype` view the kernel writes."""
    buffer = torch.full(shape, POISON, dtype=torch.uint8, device=DEVICE)
    return buffer, buffer if dtype == torch.uint8 else buffer.view(dtype)


def reference_masks(rows: torch.Tensor, proto: torch.Tensor, n: int, c: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(masks (c, H, W) uint8 from ultralytics' process_mask, the upsampled float logits they threshold)."""
    protos = proto[n].permute(2, 0, 1).cpu()  # (NM, MH, MW), the layout ultralytics takes
    coefs, boxes = rows[n, :c, 6:].cpu(), rows[n, :c, :4].cpu()
    masks = process_mask(protos, coefs, boxes, (H, W), upsample=True)
    logits = (coefs @ protos.float().reshape(NM, -1)).reshape(1, c, MH, MW)
    return masks, F.interpolate(logits, (H, W), mode="bilinear")[0]


def compare(got: torch.Tensor, expected: torch.Tensor, value: torch.Tensor, threshold: float, what: str) -> int:
    """Fail on a pixel that differs away from the threshold band, or on too many in it; the count that differ."""
    got = got.cpu()
    assert bool(((got == 0) | (got == 1)).all()), f"{what}: pixels below the count left unwritten"
    differ = got.bool() != expected.bool()
    near = (value - threshold).abs() <= BAND
    assert not bool((differ & ~near).any()), (
        f"{what}: {int((differ & ~near).sum())} pixels differ away from the threshold, first at "
        f"{tuple(int(i) for i in (differ & ~near).nonzero()[0])}"
    )
    assert int(differ.sum()) <= MAX_BAND_FRACTION * max(got.numel(), 1), f"{what}: {int(differ.sum())} differ"
    return int(differ.sum())


def assert_assembled(buffer, rows, proto, counts, *, untouched_from=None) -> int:
    """Rows below counts[n] match process_mask; rows from untouched_from[n] (default: counts) still POISON."""
    mismatches = 0
    for n in range(N):
        c = max(0, min(counts[n], K))
        if c:  # F.interpolate rejects an empty batch
            masks, logits = reference_masks(rows, proto, n, c)
            mismatches += compare(buffer[n, :c], masks, logits, 0.0, f"image {n}")
        start = c if untouched_from is None else untouched_from[n]
        assert bool((buffer[n, start:] == POISON).all()), f"image {n}: rows from {start} on were written"
    return mismatches


@pytest.mark.parametrize("out_dtype", [torch.uint8, torch.bool], ids=["uint8", "bool"])
@pytest.mark.parametrize("proto_dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_assemble_masks_matches_process_mask(proto_dtype, out_dtype):
    rows, proto = make_rows(seed=1), make_proto(seed=2, dtype=proto_dtype)
    counts = [19, K]  # image 0: the special boxes and 10 random ones; image 1: all, special boxes last
    buffer, out = poisoned((N, K, H, W), out_dtype)
    count = torch.tensor(counts, dtype=torch.int32, device=DEVICE)
    assemble_masks(out, rows, count, proto, input_hw=(H, W))
    assert_assembled(buffer, rows, proto, counts)
    # The cases are not vacuous: masks both empty and full of pixels, and pixels cut by the crop.
    filled = buffer[:, :19].flatten(2).sum(2).cpu()
    assert int((filled == 0).sum()) >= 4 and int((filled > 500).sum()) >= 4
    assert int(buffer[0, 4].sum()) <= 1 and int(buffer[0, 5].sum()) == 0 and int(buffer[0, 7].sum()) == 0


def test_assemble_masks_count_from_the_device_between_calls_on_the_same_buffers():
    """What a captured graph does: the same tensors, new counts (and rows) written between runs."""
    rows, proto = make_rows(seed=3), make_proto(seed=4, dtype=torch.float16)
    buffer, out = poisoned((N, K, H, W), torch.uint8)
    count = torch.tensor([5, 9], dtype=torch.int32, device=DEVICE)
    assemble_masks(out, rows, count, proto, input_hw=(H, W))
    assert_assembled(buffer, rows, proto, [5, 9])

    first = buffer.clone()
    count.copy_(torch.tensor([12, 3], dtype=torch.int32))
    rows.copy_(make_rows(seed=5))
    assemble_masks(out, rows, count, proto, input_hw=(H, W))
    assert_assembled(buffer, rows, proto, [12, 3], untouched_from=[12, 9])
    assert torch.equal(buffer[1, 3:9], first[1, 3:9]), "image 1: rows past the new count were rewritten"

    # Out-of-range counts are clamped: nothing for a negative one, every row for one past K.
    buffer.fill_(POISON)
    count.copy_(torch.tensor([-3, 99], dtype=torch.int32))
    assemble_masks(out, rows, count, proto, input_hw=(H, W))
    assert_assembled(buffer, rows, proto, [0, K])


def assemble_reference_input(seed: int) -> tuple[torch.Tensor, list[int], torch.Tensor]:
    """(N, K, H, W) uint8 input masks: process_mask's masks for the first counts, random noise after them (so a
    row past the count that were read would show); the counts; the rows, whose boxes bound each mask."""
    rows, proto = make_rows(seed), make_proto(seed + 1, torch.float32)
    counts = [17, 21]
    g = torch.Generator().manual_seed(seed)
    masks = torch.randint(2, (N, K, H, W), generator=g, dtype=torch.uint8)
    for n in range(N):
        masks[n, : counts[n]] = reference_masks(rows, proto, n, counts[n])[0]
    masks[1, 0] = torch.randint(2, (H, W), generator=g, dtype=torch.uint8)  # salt and pepper: many ties at 0.5
    rows[1, 0, :4] = torch.tensor([-1.0, -1.0, W + 1.0, H + 1.0])  # its box: the whole input
    return masks.to(DEVICE), counts, rows


def assert_original(buffers, masks, counts, sizes) -> int:
    mismatches = 0
    for n, (buffer, size) in enumerate(zip(buffers, sizes, strict=True)):
        c = counts[n]
        value = scale_masks(masks[n : n + 1, :c].cpu().float(), size)[0]
        mismatches += compare(buffer[:c], value > 0.5, value, 0.5, f"image {n} {size}")
        assert bool((buffer[c:] == POISON).all()), f"image {n}: rows from {c} on were written"
    return mismatches


@pytest.mark.parametrize("boxes", [False, True], ids=["every-tile", "tiles-under-boxes"])
@pytest.mark.parametrize("out_dtype", [torch.uint8, torch.bool], ids=["uint8", "bool"])
@pytest.mark.parametrize("sizes", [ORIGINALS[:2], ORIGINALS[2:4], [ORIGINALS[4]] * 2], ids=["a", "b", "c"])
def test_masks_to_original_matches_scale_masks(sizes, out_dtype, boxes):
    """With the rows given, tiles that no tap of a box reaches are written as zeros unread: the same masks."""
    masks, counts, rows = assemble_reference_input(seed=6)
    params = torch.tensor([Letterbox.fit(s, (H, W)).box_params() for s in sizes], device=DEVICE)
    count = torch.tensor(counts, dtype=torch.int32, device=DEVICE)
    pairs = [poisoned((K, *s), out_dtype) for s in sizes]
    masks_in = masks if out_dtype == torch.uint8 else masks.bool()
    masks_to_original([o for _, o in pairs], masks_in, count, params, rows=rows if boxes else None)
    assert_original([b for b, _ in pairs], masks, counts, sizes)


@pytest.fixture
def gpu_tiles(monkeypatch):
    """masks_to_original at the GPU's tiles of 8 x 128 under the interpreter too, whose own tile covers these
    small images whole and so would skip no tile."""
    from yolojet.kernels import masks as masks_module

    monkeypatch.setattr(
        masks_module, "_INTERPRETER_ORIG_BLOCKS", (masks_module._ORIG_BLOCK_Y, masks_module._ORIG_BLOCK_X)
    )


@pytest.mark.usefixtures("gpu_tiles")
def test_tiles_outside_every_box_are_written_without_reading_the_mask():
    """Masks of ones everywhere (not cropped, so only the box test can zero them) with one small box: rows of
    the original image far from the box come out 0, read or not, and rows inside it 1."""
    size = ORIGINALS[0]  # 50 x 100: letterboxed at gain 0.8 with 12 rows of padding above
    masks = torch.ones(N, K, H, W, dtype=torch.uint8, device=DEVICE)
    rows = make_rows(seed=12)
    rows[:, :, :4] = torch.tensor([10.0, 20.0, 30.0, 40.0], device=DEVICE)  # input rows 20..39: original 10..34
    params = torch.tensor([Letterbox.fit(size, (H, W)).box_params()] * N, device=DEVICE)
    count = torch.tensor([3, 1], dtype=torch.int32, device=DEVICE)
    buffer, out = poisoned((N, K, *size), torch.uint8)
    masks_to_original(out, masks, count, params, rows=rows)
    for n, c in enumerate([3, 1]):
        got = buffer[n, :c].cpu()
        assert bool(((got == 0) | (got == 1)).all()) and bool((buffer[n, c:] == POISON).all())
        assert bool((got[:, 11:35] == 1).all()), "rows under the box"
        # A tile is 8 rows: rows more than a tile (and a tap) from the box belong to tiles the box misses.
        assert int(got[:, :1].sum()) == 0 and int(got[:, 45:].sum()) == 0, "rows far from the box"


@pytest.mark.usefixtures("gpu_tiles")
@pytest.mark.parametrize("size", [ORIGINALS[1], ORIGINALS[4], (131, 170)], ids=["tall", "small", "large"])
def test_skipping_tiles_never_changes_a_mask(size):
    """Masks that are exactly their boxes (ones inside, the crop assemble_masks applies), integer and half-pixel
    box edges: the output with the box test equals the output reading every tile, edges included."""
    g = torch.Generator().manual_seed(size[0])
    rows = make_rows(seed=size[1])
    corners = torch.randint(-4, max(H, W) + 4, (N, K, 2, 2), generator=g).float().sort(dim=2).values
    corners[:, ::2] += 0.5 * torch.randint(2, (N, K // 2, 2, 2), generator=g)
    rows[:, :, [0, 2]] = corners[..., 1].to(DEVICE)
    rows[:, :, [1, 3]] = corners[..., 0].to(DEVICE)
    x = torch.arange(W, device=DEVICE).float()
    y = torch.arange(H, device=DEVICE).float()[:, None]
    b = rows[..., :4, None, None]
    masks = ((x >= b[:, :, 0]) & (x < b[:, :, 2]) & (y >= b[:, :, 1]) & (y < b[:, :, 3])).to(torch.uint8)
    params = torch.tensor([Letterbox.fit(size, (H, W)).box_params()] * N, device=DEVICE)
    count = torch.tensor([K, K - 3], dtype=torch.int32, device=DEVICE)
    outs = []
    for with_rows in (None, rows):
        buffer, out = poisoned((N, K, *size), torch.uint8)
        masks_to_original(out, masks, count, params, rows=with_rows)
        outs.append(buffer.cpu())
    assert int(outs[0][:, :, :, :].sum()) > 0
    assert torch.equal(outs[0], outs[1])


def test_masks_to_original_one_tensor_and_counts_between_calls():
    sizes = [ORIGINALS[0]] * 2
    masks, _, _ = assemble_reference_input(seed=8)
    params = torch.tensor([Letterbox.fit(s, (H, W)).box_params() for s in sizes], device=DEVICE)
    buffer, out = poisoned((N, K, *sizes[0]), torch.uint8)
    count = torch.tensor([4, 17], dtype=torch.int32, device=DEVICE)
    masks_to_original(out, masks, count, params)
    assert_original(buffer, masks, [4, 17], sizes)
    first = buffer.clone()
    count.copy_(torch.tensor([11, 2], dtype=torch.int32))
    masks_to_original(out, masks, count, params)
    assert torch.equal(buffer[1, 2:17], first[1, 2:17]), "image 1: rows past the new count were rewritten"
    buffer[1, 2:17] = POISON
    assert_original(buffer, masks, [11, 2], sizes)


@pytest.mark.parametrize("proto_dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_end_to_end_matches_masks_upsampled(proto_dtype):
    """assemble_masks + masks_to_original against the torch pipeline, per image of a different size; the
    pipeline drops empty masks, which the engine does from the same input-resolution masks."""
    rows, proto = make_rows(seed=10), make_proto(seed=11, dtype=proto_dtype)
    counts, sizes = [20, 13], ORIGINALS[:2]
    count = torch.tensor(counts, dtype=torch.int32, device=DEVICE)
    params = torch.tensor([Letterbox.fit(s, (H, W)).box_params() for s in sizes], device=DEVICE)
    masks = torch.full((N, K, H, W), POISON, dtype=torch.uint8, device=DEVICE)
    assemble_masks(masks, rows, count, proto, input_hw=(H, W))
    pairs = [poisoned((K, *s), torch.uint8) for s in sizes]
    masks_to_original([o for _, o in pairs], masks, count, params, rows=rows)
    for n, ((buffer, _), size) in enumerate(zip(pairs, sizes, strict=True)):
        c = counts[n]
        keep, expected = masks_upsampled(
            proto[n].permute(2, 0, 1).cpu(),
            rows[n, :c, 6:].cpu(),
            rows[n, :c, :4].cpu(),
            (H, W),
            Letterbox.fit(size, (H, W)),
        )
        nonempty = masks[n, :c].flatten(1).amax(1).cpu() > 0
        assert torch.equal(nonempty, keep), f"image {n}: empty masks differ"
        differ = int((buffer[:c][keep].cpu().bool() != expected).sum())
        assert differ <= MAX_BAND_FRACTION * expected.numel(), f"image {n}: {differ} pixels differ"
        assert bool((buffer[c:] == POISON).all())


def _u8(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.uint8, device=DEVICE)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda r, c, p, o: assemble_masks(o, r, c, p.to(torch.bfloat16), input_hw=(H, W)), "proto: dtype"),
        (lambda r, c, p, o: assemble_masks(o, r, c, p[0], input_hw=(H, W)), "proto: shape"),
        (lambda r, c, p, o: assemble_masks(o, r, c, p.permute(0, 3, 1, 2), input_hw=(H, W)), "proto: last-dim"),
        (lambda r, c, p, o: assemble_masks(o, r[..., :-1], c, p, input_hw=(H, W)), "rows: shape"),
        (lambda r, c, p, o: assemble_masks(o, r.half(), c, p, input_hw=(H, W)), "rows: dtype"),
        (lambda r, c, p, o: assemble_masks(o, r, c.long(), p, input_hw=(H, W)), "count: dtype"),
        (lambda r, c, p, o: assemble_masks(o, r, c[:1], p, input_hw=(H, W)), "count: shape"),
        (lambda r, c, p, o: assemble_masks(o[:, :, :-1], r, c, p, input_hw=(H, W)), "out: shape"),
        (lambda r, c, p, o: assemble_masks(o.float(), r, c, p, input_hw=(H, W)), "out: dtype"),
        (lambda r, c, p, o: assemble_masks(o, r, c, p, input_hw=(0, W)), "input_hw"),
        (lambda r, c, p, o: assemble_masks(o, r, c, p, input_hw=(H,)), "input_hw"),
        (lambda r, c, p, o: masks_to_original([_u8(K, 9, 9)] * N, o.float(), c, _params()), "masks: dtype"),
        (lambda r, c, p, o: masks_to_original([_u8(K, 9, 9)] * N, o, c[:1], _params()), "count: shape"),
        (lambda r, c, p, o: masks_to_original([_u8(K, 9, 9)] * N, o, c, _params()[:, :5]), "params: shape"),
        (lambda r, c, p, o: masks_to_original([_u8(K, 9, 9)] * N, o, c, _params().T.contiguous().T), "contiguous"),
        (lambda r, c, p, o: masks_to_original([_u8(K, 9, 9)], o, c, _params()), "1 tensors for a batch of 2"),
        (lambda r, c, p, o: masks_to_original([_u8(K - 1, 9, 9)] * N, o, c, _params()), r"out\[0\]: shape"),
        (lambda r, c, p, o: masks_to_original([_u8(K, 9, 9).float()] * N, o, c, _params()), r"out\[0\]: dtype"),
        (lambda r, c, p, o: masks_to_original([_u8(K, 0, 9)] * N, o, c, _params()), "empty image"),
        (lambda r, c, p, o: masks_to_original(_u8(N, K, 9), o, c, _params()), "out: shape"),
        (lambda r, c, p, o: masks_to_original([_u8(K, 9, 9)] * N, o, c, _params(), rows=r[:, :2]), "rows: shape"),
    ],
)
def test_launchers_reject_bad_arguments(call, message):
    rows, proto = make_rows(seed=0), make_proto(seed=0, dtype=torch.float16)
    count = torch.zeros(N, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=message):
        call(rows, count, proto, _u8(N, K, H, W))


def _params() -> torch.Tensor:
    return torch.tensor([Letterbox.fit((9, 9), (H, W)).box_params()] * N, device=DEVICE)
