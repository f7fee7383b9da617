"""Head decode kernel vs the reference executor's decode op, for every head flavour."""

from __future__ import annotations

import pytest
import torch

from yolojet.ir import Node
from yolojet.kernels.decode import DecodeSpec, decode_heads
from yolojet.kernels.nms import BestClassTargets
from yolojet.reference.executor import OPS

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

HEADS = {
    "detect-dfl": dict(task="detect", reg_max=16, box_format="xywh", extra_channels=0),
    "detect-26": dict(task="detect", reg_max=1, box_format="xyxy", extra_channels=0),
    "segment": dict(task="segment", reg_max=16, box_format="xywh", extra_channels=8),
    "obb-sigmoid": dict(task="obb", reg_max=16, box_format="xywh", extra_channels=1, angle="sigmoid"),
    "obb-26": dict(task="obb", reg_max=1, box_format="xywh", extra_channels=1, angle="raw"),
    "pose-v8": dict(task="pose", reg_max=16, box_format="xywh", extra_channels=51, kpt_shape=[17, 3], kpt_offset="v8"),
    "pose-26-xy": dict(
        task="pose", reg_max=1, box_format="xyxy", extra_channels=10, kpt_shape=[5, 2], kpt_offset="v26"
    ),
}


def nhwc_slice(t: torch.Tensor, pad: int, widen: bool = False) -> torch.Tensor:
    """The NCHW tensor as an NHWC channel slice of a wider buffer (what the engine hands the kernel); with
    `widen`, the slice goes on to the next multiple of 16 channels, past the tensor's holding 1000 (a widened map's
    padding; finite, so that a stored padding value shows in the guard elements around the output)."""
    n, c, h, w = t.shape
    width = -(-c // 16) * 16 if widen else c
    wide = torch.randn(n, h, w, width + 2 * pad, device=DEVICE)
    wide[..., pad : pad + c] = t.permute(0, 2, 3, 1)
    wide[..., pad + c : pad + width] = 1000.0
    return wide[..., pad : pad + width]


# Odd, non-square levels; P2/P6-style four levels (one launch); five levels (two launches); a level wider than one
# program's block of anchors.
LEVEL_SIZES = {
    "three": [(6, 5), (3, 3), (2, 2)],
    "four": [(9, 8), (5, 4), (3, 2), (1, 1)],
    "five": [(9, 9), (6, 5), (3, 3), (2, 2), (1, 1)],
}


@pytest.mark.parametrize("head", sorted(HEADS))
@pytest.mark.parametrize("batch", [1, 2])
def test_decode_matches_reference(head, batch):
    check_decode(head, batch, LEVEL_SIZES["three"])


@pytest.mark.parametrize("levels", ["four", "five"])
@pytest.mark.parametrize("head", ["detect-dfl", "pose-v8"])
def test_decode_many_levels_matches_reference(head, levels):
    check_decode(head, 2, LEVEL_SIZES[levels])


@pytest.mark.parametrize("head", ["detect-dfl", "segment", "pose-v8"])
def test_decode_reads_widened_maps_but_never_their_padding(head):
    check_decode(head, 2, LEVEL_SIZES["three"], widen=True)


def check_decode(head: str, batch: int, sizes: list[tuple[int, int]], widen: bool = False) -> None:
    strides = [8 * 2**i for i in range(len(sizes))]
    attrs = dict(HEADS[head], levels=len(sizes), nc=7, strides=strides)
    g = torch.Generator().manual_seed(hash(head) % 1000 + batch + len(sizes))
    extra = attrs["extra_channels"]
    boxes = [torch.randn(batch, 4 * attrs["reg_max"], h, w, generator=g) * 3 for h, w in sizes]
    scores = [torch.randn(batch, 7, h, w, generator=g) * 3 for h, w in sizes]
    extras = [torch.randn(batch, extra, h, w, generator=g) for h, w in sizes] if extra else []
    node = Node("decode", "decode", [], ["out"], attrs)
    (expected,) = OPS["decode"](node, boxes + scores + extras, {})

    # `out` inside a NaN buffer with a spare image and channel rows and anchors around it: a store outside
    # `out` (padding channels stored, say) shows as a guard element that is no longer NaN.
    n, c, a = expected.shape
    guarded = torch.full((n + 1, c + 2, a + 5), float("nan"), device=DEVICE)
    out = guarded[:n, 1 : c + 1, :a]
    decode_heads(
        out,
        [nhwc_slice(b.to(DEVICE), 3) for b in boxes],
        [nhwc_slice(s.to(DEVICE), 1, widen) for s in scores],
        [nhwc_slice(e.to(DEVICE), 2, widen) for e in extras] or None,
        DecodeSpec.from_attrs(attrs),
    )
    out = out.cpu().clone()
    guarded[:n, 1 : c + 1, :a] = 0.0
    assert int(guarded.isnan().sum()) == guarded.numel() - out.numel(), "decode wrote outside out"
    assert not out.isnan().any(), f"{int(out.isnan().sum())} elements never written"
    error = (out - expected).abs().max() / expected.abs().max()
    worst = tuple(int(i) for i in torch.unravel_index((out - expected).abs().argmax(), out.shape))
    assert error <= 1e-5, f"relative error {float(error):.2e}, worst at {worst}"


def test_decode_rejects_mismatched_levels():
    spec = DecodeSpec("detect", nc=2, reg_max=1, strides=(8,))
    box = torch.zeros(1, 2, 2, 4, device=DEVICE)
    with pytest.raises(ValueError, match="out must be float32"):
        decode_heads(torch.zeros(1, 6, 5, device=DEVICE), [box], [torch.zeros(1, 2, 2, 2, device=DEVICE)], None, spec)
    with pytest.raises(ValueError, match="score map"):
        decode_heads(torch.zeros(1, 6, 4, device=DEVICE), [box], [torch.zeros(1, 2, 3, 2, device=DEVICE)], None, spec)


def test_decode_rejects_maps_and_outputs_that_do_not_fit_the_head():
    pose = DecodeSpec("pose", nc=1, reg_max=1, strides=(8,), extra=51)
    box, score = torch.zeros(1, 2, 2, 4, device=DEVICE), torch.zeros(1, 2, 2, 1, device=DEVICE)

    def decode(out_channels: int, scores: torch.Tensor, extras: list[torch.Tensor] | None, spec=pose) -> None:
        decode_heads(torch.zeros(1, out_channels, 4, device=DEVICE), [box], [scores], extras, spec)

    keypoints = torch.zeros(1, 2, 2, 64, device=DEVICE)  # 51 widened to 64: accepted
    decode(56, score, [keypoints[..., :51]])
    decode(56, score, [keypoints])
    with pytest.raises(ValueError, match="out must be float32"):
        decode(4 + 1 + 17, score, [keypoints])  # out sized for fewer keypoint values than the head has
    with pytest.raises(ValueError, match=r"extra map .* expected 51 or 64 channels"):
        decode(56, score, [keypoints[..., :60]])  # neither the head's width nor its widened one
    with pytest.raises(ValueError, match=r"score map .* expected 1 or 16 channels"):
        decode(56, torch.zeros(1, 2, 2, 8, device=DEVICE), [keypoints])
    with pytest.raises(ValueError, match="0 extra maps"):
        decode(56, score, [])
    with pytest.raises(ValueError, match="1 extra maps"):
        decode(5, score, [keypoints], DecodeSpec("detect", nc=1, reg_max=1, strides=(8,)))
    with pytest.raises(ValueError, match="not whole keypoints"):
        decode(54, score, [keypoints[..., :50]], DecodeSpec("pose", nc=1, reg_max=1, strides=(8,), extra=50))


@pytest.mark.parametrize(
    ("head", "nc", "sizes", "classes", "widen"),
    [
        ("detect-dfl", 40, LEVEL_SIZES["three"], None, True),  # two chunks of classes, widened score maps
        ("segment", 7, LEVEL_SIZES["three"], [0, 3, 6], False),
        ("pose-v8", 1, LEVEL_SIZES["three"], None, True),  # one class, keypoints in a widened map
        ("obb-sigmoid", 1, LEVEL_SIZES["five"], None, False),  # rotated NMS's single class; two launches
    ],
)
def test_decode_writes_the_best_class_pass(head, nc, sizes, classes, widen):
    """With BestClassTargets the decode also writes what NMS's best-class pass would: each anchor's best score
    (−inf unless above conf and of a kept class) and its first best class, against torch's max over the decoded
    scores. Ties between classes of different chunks (a class past 32 repeating an earlier one's best score, in the
    same lane of a chunk or another) keep the earlier class; anchors past the images' rows and every other element
    stay as they were. With store_scores=False the same pass, boxes and extras are written, and no score."""
    strides = [8 * 2**i for i in range(len(sizes))]
    attrs = dict(HEADS[head], levels=len(sizes), nc=nc, strides=strides)
    batch, conf = 2, 0.4
    g = torch.Generator().manual_seed(11 + nc)
    extra = attrs["extra_channels"]
    boxes = [torch.randn(batch, 4 * attrs["reg_max"], h, w, generator=g) for h, w in sizes]
    scores = [torch.randn(batch, nc, h, w, generator=g) * 2 for h, w in sizes]
    if nc > 33:
        for s in scores:
            # Class 33 wins everywhere, tied by class 1 (its lane in the first chunk) at half the cells and by class
            # 10 (another lane) at the other half: the earlier class wins either way.
            s[:, 33] = s.max(1).values + 0.5
            s[:, 1, ::2] = s[:, 33, ::2]
            s[:, 10, 1::2] = s[:, 33, 1::2]
    extras = [torch.randn(batch, extra, h, w, generator=g) for h, w in sizes] if extra else []
    anchors = sum(h * w for h, w in sizes)
    out = torch.full((batch, 4 + nc + extra, anchors), float("nan"), device=DEVICE)
    best_score = torch.full((batch + 1, anchors), 7.0, device=DEVICE)  # a spare row: must stay as it is
    best_class = torch.full((batch + 1, anchors), -3, dtype=torch.int32, device=DEVICE)
    mask = None
    if classes is not None:
        mask = torch.zeros(nc, dtype=torch.bool, device=DEVICE)
        mask[classes] = True
    thresholds = torch.tensor([conf, 0.7], device=DEVICE)
    maps = (
        [nhwc_slice(b.to(DEVICE), 3) for b in boxes],
        [nhwc_slice(s.to(DEVICE), 1, widen) for s in scores],
        [nhwc_slice(e.to(DEVICE), 2) for e in extras] or None,
    )
    spec = DecodeSpec.from_attrs(attrs)
    decode_heads(out, *maps, spec, best=BestClassTargets(best_score[:batch], best_class[:batch], thresholds, mask))
    unscored = torch.full_like(out, float("nan"))
    again = (torch.full_like(best_score[:batch], 7.0), torch.full_like(best_class[:batch], -3))
    decode_heads(unscored, *maps, spec, best=BestClassTargets(*again, thresholds, mask, store_scores=False))
    assert bool(unscored[:, 4 : 4 + nc].isnan().all()), "no score may be stored"
    assert torch.equal(unscored[:, :4], out[:, :4]) and torch.equal(unscored[:, 4 + nc :], out[:, 4 + nc :])
    assert torch.equal(again[0], best_score[:batch]) and torch.equal(again[1], best_class[:batch])
    # Level 1 folded: its score conv writes its rows of the pass, so its score map (NaN here) is never read and its
    # rows stay as they were; the other levels' rows are as before.
    poisoned = [torch.full_like(s, float("nan")) if i == 1 else s for i, s in enumerate(maps[1])]
    left = (torch.full_like(best_score[:batch], 7.0), torch.full_like(best_class[:batch], -3))
    folded = BestClassTargets(*left, thresholds, mask, store_scores=False)
    decode_heads(unscored, maps[0], poisoned, maps[2], spec, best=folded, folded_scores=frozenset({1}))
    first_anchor = sizes[0][0] * sizes[0][1]
    level = slice(first_anchor, first_anchor + sizes[1][0] * sizes[1][1])
    assert bool((left[0][:, level] == 7.0).all()) and bool((left[1][:, level] == -3).all())
    for got, want in zip(left, (best_score[:batch], best_class[:batch]), strict=True):
        assert torch.equal(got[:, : level.start], want[:, : level.start])
        assert torch.equal(got[:, level.stop :], want[:, level.stop :])
    with pytest.raises(ValueError, match="store no scores"):
        decode_heads(
            unscored, *maps, spec, best=BestClassTargets(*left, thresholds, mask), folded_scores=frozenset({1})
        )
    # Level 1's boxes folded too (its box conv decodes them, kernels/conv/boxes.py), and a segment head's mask
    # coefficients (kernels/conv/extras.py): those maps (NaN here) are never read and their rows stay as they were;
    # every other element is as before. An OBB head's boxes and angles cannot fold.
    no_boxes = [torch.full_like(b, float("nan")) if i == 1 else b for i, b in enumerate(maps[0])]
    no_extras = [torch.full_like(e, float("nan")) if i == 1 else e for i, e in enumerate(maps[2] or [])] or None
    extras_folded = frozenset({1}) if extra else frozenset()
    # A finite sentinel everywhere (a decode reading the NaN maps would store NaN): the unfolded levels' rows must be
    # written again, level 1's folded rows and every score row left as they are.
    boxed = torch.full_like(out, 123.0)
    both = BestClassTargets(
        torch.full_like(left[0], 9.0), torch.full_like(left[1], -5), thresholds, mask, store_scores=False
    )
    if head.startswith("obb"):
        for folds in (dict(folded_boxes=frozenset({1})), dict(folded_extras=frozenset({1}))):
            with pytest.raises(ValueError, match="OBB head's boxes need its angles"):
                decode_heads(boxed, no_boxes, poisoned, maps[2], spec, best=both, **folds)
    else:
        decode_heads(boxed, no_boxes, poisoned, no_extras, spec, best=both, folded_scores=frozenset({1}),
                     folded_boxes=frozenset({1}), folded_extras=extras_folded)  # fmt: skip
        assert bool((boxed[:, :4, level] == 123.0).all()) and bool((boxed[:, 4 + nc :, level] == 123.0).all())
        # Another specialization of the kernel (the levels' bits differ), so compiled for a GPU its arithmetic may
        # contract otherwise: equal to float32 rounding.
        close = dict(rtol=1e-6, atol=1e-4)
        torch.testing.assert_close(boxed[:, :4, : level.start], out[:, :4, : level.start], **close)
        torch.testing.assert_close(boxed[:, :4, level.stop :], out[:, :4, level.stop :], **close)
        assert bool((boxed[:, 4 : 4 + nc] == 123.0).all())
        assert torch.equal(boxed[:, 4 + nc :, : level.start], out[:, 4 + nc :, : level.start])
        assert torch.equal(boxed[:, 4 + nc :, level.stop :], out[:, 4 + nc :, level.stop :])
        assert bool((both.best_score[:, level] == 9.0).all()) and bool((both.best_class[:, level] == -5).all())
        for got, want in zip((both.best_score, both.best_class), (best_score[:batch], best_class[:batch]), strict=True):
            assert torch.equal(got[:, : level.start], want[:, : level.start])
            assert torch.equal(got[:, level.stop :], want[:, level.stop :])
    decoded = out[:, 4 : 4 + nc].cpu()
    top, first = decoded.max(1)
    keep = top > conf
    if mask is not None:
        keep &= mask.cpu()[first]
    assert torch.equal(best_class[:batch].cpu(), first.int())
    assert torch.equal(best_score[:batch].cpu(), torch.where(keep, top, float("-inf")))
    assert bool((best_score[batch] == 7.0).all()) and bool((best_class[batch] == -3).all())
    if nc > 33:
        assert set(first.unique().tolist()) == {1, 10}, "a tie across chunks must keep the earlier class"
    if classes is not None:
        assert 0 < int(keep.sum()) < int((top > conf).sum()), "the class filter must drop some candidates, not all"


@pytest.mark.parametrize("head", ["detect-dfl", "segment", "pose-v8"])
def test_a_head_whose_every_level_is_folded_launches_no_decode(head, monkeypatch):
    """Every level's scores, boxes and extras written by their convs: the decode has nothing left and launches no
    kernel; it launches where one level's boxes or extras are its to decode."""
    from yolojet.kernels import decode as decode_module

    launches = []
    kernel = decode_module._decode_kernel

    class Counting:
        def __getitem__(self, grid):
            launches.append(grid)
            return kernel[grid]

    monkeypatch.setattr(decode_module, "_decode_kernel", Counting())
    sizes = LEVEL_SIZES["three"]
    attrs = dict(HEADS[head], levels=3, nc=3, strides=[8, 16, 32])
    spec = DecodeSpec.from_attrs(attrs)
    extra = attrs["extra_channels"]
    maps = [
        [torch.randn(1, h, w, channels, device=DEVICE) for h, w in sizes]
        for channels in (4 * attrs["reg_max"], 3, extra)
    ]
    anchors = sum(h * w for h, w in sizes)
    out = torch.full((1, 4 + 3 + extra, anchors), float("nan"), device=DEVICE)
    best = BestClassTargets(
        torch.zeros(1, anchors, device=DEVICE),
        torch.zeros(1, anchors, dtype=torch.int32, device=DEVICE),
        torch.tensor([0.25, 0.7], device=DEVICE),
        None,
        store_scores=False,
    )
    every, some = frozenset(range(3)), frozenset({0, 2})
    extras_ways = (every, some) if extra else (frozenset(),)
    for boxes_folded in (every, some):
        for extras_folded in extras_ways:
            before = len(launches)
            decode_heads(out, maps[0], maps[1], maps[2] if extra else None, spec, best=best, folded_scores=every,
                         folded_boxes=boxes_folded, folded_extras=extras_folded)  # fmt: skip
            everything = boxes_folded == every and extras_folded == (every if extra else frozenset())
            assert len(launches) - before == (0 if everything else 1), (boxes_folded, extras_folded)
    assert bool(out[:, 4 : 4 + 3].isnan().all())


def test_decode_refuses_best_class_targets_that_do_not_fit():
    spec = DecodeSpec("detect", nc=2, reg_max=1, strides=(8,))
    out = torch.zeros(1, 6, 4, device=DEVICE)
    box, score = torch.zeros(1, 2, 2, 4, device=DEVICE), torch.zeros(1, 2, 2, 2, device=DEVICE)
    thresholds = torch.tensor([0.25, 0.7], device=DEVICE)
    wrong_rows = BestClassTargets(
        torch.zeros(2, 4, device=DEVICE), torch.zeros(2, 4, dtype=torch.int32, device=DEVICE), thresholds, None
    )
    with pytest.raises(ValueError, match="decode best_score"):
        decode_heads(out, [box], [score], None, spec, best=wrong_rows)
    scores_twice = torch.zeros(1, 4, device=DEVICE), torch.zeros(1, 4, device=DEVICE)
    float_classes = BestClassTargets(*scores_twice, thresholds, None)
    with pytest.raises(ValueError, match="decode best_class"):
        decode_heads(out, [box], [score], None, spec, best=float_classes)
    unscored = BestClassTargets(
        torch.zeros(1, 4, device=DEVICE), torch.zeros(1, 4, dtype=torch.int32, device=DEVICE), thresholds, None,
        store_scores=False,
    )  # fmt: skip
    with pytest.raises(ValueError, match="levels \\[0\\] of a detect head without extras folded"):
        decode_heads(out, [box], [score], None, spec, best=unscored, folded_extras=frozenset({0}))
