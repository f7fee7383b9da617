"""Rotated NMS and rotated-box scaling kernels vs the torch OBB post-processing (yolojet/reference/obb.py
`rotated_nms`, `scale_rboxes`), itself ultralytics' non_max_suppression(rotated=True), which is also checked
directly.

Every run starts from a NaN-poisoned `out`, a poisoned count and garbage scratch: rows below the count must
equal the reference's rows exactly (they are copies of the inputs), rows from the count on must still be NaN.
"""

from __future__ import annotations

import math

import pytest
import torch
from kernel_checks import to_device_keeping_strides
from ultralytics.utils.nms import non_max_suppression as ultralytics_nms

from yolojet.geometry import Letterbox
from yolojet.kernels import rotated_nms as rotated_nms_module
from yolojet.kernels.nms import NmsScratch
from yolojet.kernels.rotated_nms import RotatedNmsScratch, rotated_non_max_suppression, scale_rotated_boxes
from yolojet.reference.obb import batch_probiou, rotated_nms, scale_rboxes

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Fast-NMS and the rank sort are O(A²): under the interpreter keep A small; on a GPU use a 1024² OBB model's count.
LARGE_A = 21504 if torch.cuda.is_available() else 1500
CAPACITY = 300
# Masked-off lanes may divide 0 by 0 under the interpreter; the result is never used.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


def clustered(batch: int, nc: int, anchors: int, seed: int) -> torch.Tensor:
    """(batch, 4 + nc + 1, anchors) OBB head output: jittered rotated boxes around 20 centres (elongated sizes,
    cluster angles over [−π/4, 3π/4), jitter wrapped back into that range), so suppression happens, and
    best-class scores spread over [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    centre = torch.rand(batch, 20, 2, generator=g) * 560 + 40
    size = torch.rand(batch, 20, 2, generator=g) * torch.tensor([90.0, 40.0]) + torch.tensor([30.0, 10.0])
    theta = torch.rand(batch, 20, generator=g) * math.pi - math.pi / 4
    pick = torch.randint(20, (batch, anchors), generator=g)
    pick2 = pick[..., None].expand(-1, -1, 2)
    xy = centre.gather(1, pick2) + torch.randn(batch, anchors, 2, generator=g) * 6
    wh = size.gather(1, pick2) * (0.8 + 0.4 * torch.rand(batch, anchors, 2, generator=g))
    angle = theta.gather(1, pick) + torch.randn(batch, anchors, generator=g) * 0.15
    angle = torch.remainder(angle + math.pi / 4, math.pi) - math.pi / 4
    scores = torch.rand(batch, nc, anchors, generator=g) * torch.rand(batch, 1, anchors, generator=g) ** 2
    return torch.cat([xy.mT, wh.mT, scores, angle[:, None]], 1).contiguous()


def head(boxes: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """(1, 4 + nc + 1, A) from (A, 5) xywhr boxes and (A, nc) scores."""
    return torch.cat([boxes[:, :4], scores, boxes[:, 4:]], 1).T[None].contiguous()


def poisoned_scratch(batch: int, anchors: int) -> RotatedNmsScratch:
    scratch = RotatedNmsScratch.allocate(batch, anchors, DEVICE)
    scratch.best_score.normal_()
    scratch.best_class.random_(-5, 1000)
    scratch.order.random_(-anchors, 2 * anchors)
    scratch.suppressed.random_(0, 256)
    return scratch


def class_mask_for(nc: int, classes: list[int] | None) -> torch.Tensor | None:
    if classes is None:
        return None
    mask = torch.zeros(nc, dtype=torch.bool, device=DEVICE)
    mask[classes] = True
    return mask


def run(
    preds: torch.Tensor,
    nc: int,
    conf: float,
    iou: float,
    *,
    agnostic: bool = False,
    classes: list[int] | None = None,
    max_det: int = 300,
    max_nms: int = 30000,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Our rotated NMS on poisoned buffers: (out, count) on the CPU."""
    batch, _, anchors = preds.shape
    out = torch.full((batch, CAPACITY, 7), float("nan"), device=DEVICE)
    count = torch.full((batch,), -7, dtype=torch.int32, device=DEVICE)
    rotated_non_max_suppression(
        out,
        count,
        preds.to(DEVICE),
        nc=nc,
        thresholds=torch.tensor([conf, iou], device=DEVICE),
        limits=torch.tensor([max_det, max_nms, int(agnostic)], dtype=torch.int32, device=DEVICE),
        class_mask=class_mask_for(nc, classes),
        scratch=poisoned_scratch(batch, anchors),
    )
    return out.cpu(), count.cpu()


def reference(
    preds: torch.Tensor, nc: int, conf: float, iou: float, max_det: int = 300, **options
) -> list[torch.Tensor]:
    """obb.rotated_nms on the run's device (its probiou arithmetic is the one the kernel follows there)."""
    found = rotated_nms(preds.to(DEVICE), nc, conf, iou, max_det, **options)
    return [rows.cpu() for rows in found]


def lexicographic(rows: torch.Tensor) -> torch.Tensor:
    """Rows sorted by all columns: equal sets of rows in any order come out identical."""
    for col in reversed(range(rows.shape[1])):  # stable sorts, last key first
        rows = rows[torch.sort(rows[:, col], stable=True).indices]
    return rows


def assert_matches(out: torch.Tensor, count: torch.Tensor, expected: list[torch.Tensor], ordered: bool = True):
    assert count.tolist() == [len(e) for e in expected]
    for b, ref in enumerate(expected):
        rows = out[b, : len(ref)]
        assert not rows.isnan().any(), f"image {b}: a row below the count was not written"
        assert out[b, len(ref) :].isnan().all(), f"image {b}: a row past the count was written"
        if not ordered:
            rows, ref = lexicographic(rows), lexicographic(ref)
        assert torch.equal(rows, ref), f"image {b}: rows differ at {(rows != ref).any(1).nonzero().flatten()[:8]}"


def candidates(preds: torch.Tensor, nc: int, conf: float, classes: list[int] | None = None) -> list[int]:
    best, cls = preds[:, 4 : 4 + nc].max(1)
    keep = best > conf
    if classes is not None:
        keep &= torch.isin(cls, torch.tensor(classes))
    return keep.sum(1).tolist()


@pytest.mark.parametrize(
    ("nc", "anchors", "conf", "iou", "agnostic", "classes", "max_det"),
    [
        (3, 600, 0.25, 0.45, False, None, 300),
        (3, LARGE_A, 0.001, 0.7, True, None, 7),
        (15, LARGE_A, 0.001, 0.45, False, None, 300),
        (15, 1200, 0.25, 0.7, True, [0, 5, 9, 14], 300),
        (15, 900, 0.25, 0.45, False, [1, 2, 3], 7),
        (3, 1000, 0.001, 0.7, False, [2], 300),
    ],
)
def test_rotated_nms_matches_torch_reference(nc, anchors, conf, iou, agnostic, classes, max_det):
    preds = clustered(2, nc, anchors, seed=nc + anchors)
    options = dict(agnostic=agnostic, classes=classes, max_det=max_det)
    out, count = run(preds, nc, conf, iou, **options)
    expected = reference(preds, nc, conf, iou, **options)
    # Real suppression: some candidates are dropped, and the limit cuts where it is meant to.
    kept_unlimited = [len(e) for e in reference(preds, nc, conf, iou, **{**options, "max_det": 10**6})]
    assert all(0 < k < c for k, c in zip(kept_unlimited, candidates(preds, nc, conf, classes), strict=True))
    if max_det == 7:
        assert all(k > max_det for k in kept_unlimited)
    assert_matches(out, count, expected)


@pytest.mark.parametrize(("agnostic", "classes"), [(False, None), (True, [0, 2])])
def test_rotated_nms_matches_ultralytics(agnostic, classes):
    """The kernel against ultralytics' own non_max_suppression(rotated=True), not only obb.py's copy of it."""
    preds = clustered(2, 3, 700, seed=11)
    out, count = run(preds, 3, 0.25, 0.45, agnostic=agnostic, classes=classes)
    theirs = ultralytics_nms(
        preds.clone(), 0.25, 0.45, classes=classes, agnostic=agnostic, nc=3, rotated=True, max_time_img=math.inf
    )
    assert_matches(out, count, theirs)


def test_rotated_nms_is_fast_nms_not_greedy():
    """A drops B, B would drop C, A does not touch C: greedy keeps A and C, Fast-NMS only A (B, once dropped,
    still drops C). Three boxes in a row along x, each overlapping its neighbour."""
    boxes = torch.tensor(
        [[100.0, 100.0, 40.0, 20.0, 0.3], [112.0, 100.0, 40.0, 20.0, 0.3], [124.0, 100.0, 40.0, 20.0, 0.3]]
    )
    probiou = batch_probiou(boxes, boxes)
    assert probiou[0, 1] > 0.5 and probiou[1, 2] > 0.5 and probiou[0, 2] < 0.5
    preds = head(boxes, torch.tensor([[0.9], [0.8], [0.7]]))
    out, count = run(preds, 1, 0.25, 0.5)
    assert count.tolist() == [1]
    assert_matches(out, count, reference(preds, 1, 0.25, 0.5))


def test_rotated_nms_tied_scores():
    """Equal scores: on disjoint boxes every order keeps the same set; on exact duplicates one copy survives, the
    same row whichever; and tied class scores give the first class. Compared as sets of rows."""
    g = torch.Generator().manual_seed(1)
    cell = torch.arange(256)
    centres = torch.stack([cell % 16 * 40.0 + 20, cell // 16 * 40.0 + 20], 1)
    angle = torch.rand(256, 1, generator=g) * math.pi - math.pi / 4
    boxes = torch.cat([centres, torch.tensor([[22.0, 12.0]]).expand(256, -1), angle], 1)
    scores = torch.rand(256, 3, generator=g) * 0.2
    winner = torch.randint(3, (256,), generator=g)
    scores[cell, winner] = torch.tensor([0.3, 0.6, 0.9])[torch.randint(3, (256,), generator=g)]
    scores[::5, 0] = scores[::5, 2] = scores[::5].amax(1)
    boxes = torch.cat([boxes, boxes[:64]])  # duplicates of the first 64, tied with them
    scores = torch.cat([scores, scores[:64]])
    preds = head(boxes, scores)
    for agnostic in (False, True):
        out, count = run(preds, 3, 0.25, 0.45, agnostic=agnostic)
        expected = reference(preds, 3, 0.25, 0.45, agnostic=agnostic)
        assert len(expected[0]) == 256
        assert_matches(out, count, expected, ordered=False)


def test_rotated_nms_tie_order():
    """Where the reference's order is unspecified, ours ranks the lower anchor first: against a Fast-NMS with a
    stable sort, built from batch_probiou. 64 pairs of tied, overlapping but different boxes, anchors shuffled so
    that either copy of a pair may come first; no probiou within 1e-3 of the threshold."""
    g = torch.Generator().manual_seed(7)
    a = torch.cat([torch.rand(64, 2, generator=g) * 600 + 20, torch.rand(64, 2, generator=g) * 20 + 10], 1)
    a = torch.cat([a, torch.rand(64, 1, generator=g) * math.pi - math.pi / 4], 1)
    b = a + torch.tensor([2.0, 1.0, 0.0, 0.0, 0.1])
    shuffle = torch.randperm(128, generator=g)
    boxes = torch.cat([a, b])[shuffle]
    scores = ((torch.randperm(64, generator=g) + 65) / 129).repeat(2)[shuffle, None]
    order = torch.sort(scores[:, 0], descending=True, stable=True).indices
    overlaps = batch_probiou(boxes[order], boxes[order]).triu_(diagonal=1)
    assert ((overlaps - 0.5).abs() > 1e-3).all()
    kept = order[(overlaps > 0.5).sum(0) <= 0]
    first_copy = shuffle[kept] < 64
    assert len(kept) == 64 and first_copy.any() and not first_copy.all()
    expected = torch.cat([boxes[kept, :4], scores[kept], torch.zeros(len(kept), 1), boxes[kept, 4:]], 1)
    out, count = run(head(boxes, scores), 1, 0.25, 0.5)
    assert_matches(out, count, [expected])


def test_rotated_nms_identical_boxes_class_offset():
    """400 copies of one box over 3 classes: one survivor per class, or one in all when agnostic."""
    g = torch.Generator().manual_seed(2)
    boxes = torch.tensor([[100.0, 120.0, 50.0, 20.0, 0.7]]).expand(400, -1)
    preds = head(boxes, torch.rand(400, 3, generator=g))
    for agnostic, survivors in ((False, 3), (True, 1)):
        out, count = run(preds, 3, 0.25, 0.45, agnostic=agnostic)
        assert count.item() == survivors
        assert_matches(out, count, reference(preds, 3, 0.25, 0.45, agnostic=agnostic))


def test_rotated_nms_zero_candidates():
    """No candidate in image 0 (its count 0, its rows untouched) next to an ordinary image 1."""
    preds = clustered(2, 3, 500, seed=3)
    preds[0, 4:7] *= 0.2
    out, count = run(preds, 3, 0.25, 0.45)
    expected = reference(preds, 3, 0.25, 0.45)
    assert len(expected[0]) == 0 and len(expected[1]) > 0
    assert_matches(out, count, expected)
    assert out[0].isnan().all()


def test_rotated_nms_max_det_clamped_to_capacity():
    """limits' max_det beyond the rows of `out`: the first `capacity` kept rows, nothing written past them."""
    preds = clustered(2, 3, 500, seed=14)
    wide = torch.full((2, 25, 7), float("nan"), device=DEVICE)
    out = wide[:, :20]
    count = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    rotated_non_max_suppression(
        out,
        count,
        preds.to(DEVICE),
        nc=3,
        thresholds=torch.tensor([0.25, 0.45], device=DEVICE),
        limits=torch.tensor([300, 30000, 0], dtype=torch.int32, device=DEVICE),
        class_mask=None,
        scratch=poisoned_scratch(2, 500),
    )
    expected = reference(preds, 3, 0.25, 0.45, max_det=20)
    assert count.tolist() == [20, 20] and all(len(e) == 20 for e in expected)
    assert torch.equal(out.cpu(), torch.stack(expected))
    assert wide[:, 20:].isnan().all()


def test_rotated_nms_max_nms_truncation():
    """More candidates than max_nms: only the max_nms best enter suppression (distinct scores: no tie at the cut)."""
    preds = clustered(2, 3, 600, seed=4)
    g = torch.Generator().manual_seed(4)
    for b in range(2):
        best = preds[b, 4:7].argmax(0)
        preds[b, 4 + best, torch.arange(600)] = (torch.randperm(600, generator=g) + 1) / 601
    out, count = run(preds, 3, 0.001, 0.45, max_nms=50)
    expected = reference(preds, 3, 0.001, 0.45, max_nms=50)
    assert expected[0].shape[0] != reference(preds, 3, 0.001, 0.45)[0].shape[0]
    assert_matches(out, count, expected)


def test_rotated_nms_degenerate_boxes():
    """Zero-width and zero-height boxes at angle 0 (a zero covariance determinant, where batch_probiou's eps and
    clamps decide: two copies of such a line overlap fully), some duplicated. At other angles the determinant of
    a line is rounding noise whose sign follows the last bit of cos and sin, which no two libms share."""
    preds = clustered(2, 3, 700, seed=5)
    preds[:, 2, ::3] = 0.0
    preds[:, 3, 1::3] = 0.0
    preds[:, 7, ::3] = 0.0
    preds[:, 7, 1::3] = 0.0
    copies = torch.arange(300, 360)
    preds[:, :4, copies] = preds[:, :4, copies - 300]
    preds[:, 7, copies] = preds[:, 7, copies - 300]
    out, count = run(preds, 3, 0.25, 0.45)
    expected = reference(preds, 3, 0.25, 0.45)
    lines = [set(e[(e[:, 2] == 0) & (e[:, 6] == 0), 0].tolist()) for e in expected]
    assert all(len(found) > 3 for found in lines)
    assert_matches(out, count, expected)


@pytest.mark.parametrize("agnostic", [False, True])
def test_rotated_nms_threshold_is_strict(agnostic):
    """Copies of one box: probiou(box, box) = 1 − sqrt(1 − exp(−eps) + eps) (bd clamps to eps), computed alike by
    torch and the kernel (exp(−eps) correctly rounded; numpy's float32 exp is an ulp off there, which is why the
    interpreter path rounds float64 results); with iou_thres equal to it no copy drops another (the test is
    probiou > iou), one below it and all but one drop."""
    g = torch.Generator().manual_seed(13)
    boxes = torch.tensor([[200.0, 150.0, 60.0, 25.0, 0.4]]).expand(50, -1)
    iou = float(batch_probiou(boxes[:1].to(DEVICE), boxes[:1].to(DEVICE))[0, 0])
    preds = head(boxes, torch.rand(50, 2, generator=g))
    out, count = run(preds, 2, 0.25, iou, agnostic=agnostic)
    expected = reference(preds, 2, 0.25, iou, agnostic=agnostic)
    assert len(expected[0]) == candidates(preds, 2, 0.25)[0]
    assert_matches(out, count, expected)
    out, count = run(preds, 2, 0.25, torch.nextafter(torch.tensor(iou), torch.tensor(0.0)).item(), agnostic=agnostic)
    assert count.tolist() == [1 if agnostic else 2]


def test_rotated_nms_gpu_tiles(monkeypatch):
    """The GPU's small fast-NMS tiles (many candidate blocks, many earlier-candidate steps) under the interpreter."""
    monkeypatch.setattr(rotated_nms_module, "_INTERPRETER_FAST_TILES", rotated_nms_module._FAST_TILES)
    preds = clustered(2, 3, 400, seed=9)
    assert min(candidates(preds, 3, 0.001)) > 5 * rotated_nms_module._FAST_TILES[0]
    out, count = run(preds, 3, 0.001, 0.45)
    assert_matches(out, count, reference(preds, 3, 0.001, 0.45))


def test_rotated_nms_follows_device_settings_between_runs():
    """The same buffers, settings changed in place between calls: what a captured graph relies on."""
    nc = 15
    preds = clustered(2, nc, 800, seed=6).to(DEVICE)
    out = torch.full((2, CAPACITY, 7), float("nan"), device=DEVICE)
    count = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    thresholds = torch.tensor([0.25, 0.45], device=DEVICE)
    limits = torch.tensor([300, 30000, 0], dtype=torch.int32, device=DEVICE)
    class_mask = torch.ones(nc, dtype=torch.uint8, device=DEVICE)
    scratch = poisoned_scratch(2, 800)
    settings = [
        ((0.25, 0.45), (300, 30000, 0), None),
        ((0.001, 0.7), (7, 200, 1), [3, 4, 12]),
        ((0.1, 0.3), (50, 30000, 0), [0, 1, 2, 3, 4, 5, 6]),
    ]
    counts = []
    for (conf, iou), (max_det, max_nms, agnostic), classes in settings:
        thresholds.copy_(torch.tensor([conf, iou]))
        limits.copy_(torch.tensor([max_det, max_nms, agnostic]))
        class_mask.fill_(classes is None)
        if classes is not None:
            class_mask[classes] = 1
        out.fill_(float("nan"))
        rotated_non_max_suppression(
            out, count, preds, nc=nc, thresholds=thresholds, limits=limits, class_mask=class_mask, scratch=scratch
        )
        options = dict(max_det=max_det, max_nms=max_nms, agnostic=bool(agnostic), classes=classes)
        assert_matches(out.cpu(), count.cpu(), reference(preds, nc, conf, iou, **options))
        counts.append(count.tolist())
    assert len({tuple(c) for c in counts}) == len(settings)


def test_rotated_nms_rejects_bad_arguments():
    preds = torch.zeros(2, 8, 50, device=DEVICE)
    good = dict(
        out=torch.zeros(2, 10, 7, device=DEVICE),
        count=torch.zeros(2, dtype=torch.int32, device=DEVICE),
        preds=preds,
        nc=3,
        thresholds=torch.tensor([0.25, 0.45], device=DEVICE),
        limits=torch.tensor([10, 100, 0], dtype=torch.int32, device=DEVICE),
        class_mask=None,
        scratch=RotatedNmsScratch.allocate(2, 50, DEVICE),
    )
    rotated_non_max_suppression(**good)
    bad = {
        "preds": preds.double(),
        "nc": 2,
        "out": torch.zeros(2, 10, 6, device=DEVICE),
        "count": torch.zeros(2, device=DEVICE),
        "thresholds": torch.tensor([0.25, 0.45], dtype=torch.float64, device=DEVICE),
        "limits": torch.tensor([10, 100], dtype=torch.int32, device=DEVICE),
        "class_mask": torch.ones(4, dtype=torch.bool, device=DEVICE),
        "scratch": RotatedNmsScratch.allocate(2, 49, DEVICE),
    }
    for name, value in bad.items():
        with pytest.raises(ValueError):
            rotated_non_max_suppression(**{**good, name: value})
    with pytest.raises(ValueError, match="class_mask: dtype"):
        rotated_non_max_suppression(**{**good, "class_mask": torch.ones(3, dtype=torch.int32, device=DEVICE)})
    with pytest.raises(ValueError, match="RotatedNmsScratch"):
        rotated_non_max_suppression(**{**good, "scratch": NmsScratch.allocate(2, 50, DEVICE)})
    with pytest.raises(ValueError, match="preds shape"):
        rotated_non_max_suppression(**{**good, "preds": torch.zeros(2, 9, 50, device=DEVICE)})


# (original h, w), (model input h, w): square and rectangular inputs, portrait/landscape frames, up- and downscaling
SHAPES = [
    [(1080, 810), (640, 640)],
    [(720, 1280), (1024, 1024)],
    [(480, 640), (384, 640)],
    [(100, 37), (320, 256)],
    [(333, 333), (640, 480)],
]


def test_scale_rotated_boxes_matches_scale_rboxes():
    g = torch.Generator().manual_seed(3)
    k_rows = 300
    counts = [0, 7, 200, 131, 300]  # empty, short, and counts crossing the kernel's 128-row blocks
    boxes = [Letterbox.fit(orig, target) for orig, target in SHAPES]
    rows = torch.empty(len(SHAPES), k_rows, 7)
    for i, (_, (h, w)) in enumerate(SHAPES):
        rows[i, :, 0] = torch.rand(k_rows, generator=g) * (w + 60) - 30  # into the padding and past the edges
        rows[i, :, 1] = torch.rand(k_rows, generator=g) * (h + 60) - 30
        rows[i, :, 2:4] = torch.rand(k_rows, 2, generator=g) * 200 + 1
        rows[i, :, 4] = torch.rand(k_rows, generator=g)
        rows[i, :, 5] = torch.randint(15, (k_rows,), generator=g).float()
        rows[i, :, 6] = torch.rand(k_rows, generator=g) * math.pi - math.pi / 4
    params = torch.tensor([b.box_params() for b in boxes], dtype=torch.float32)
    original = rows.clone()
    ours = rows.to(DEVICE)
    scale_rotated_boxes(ours, torch.tensor(counts, dtype=torch.int32, device=DEVICE), params.to(DEVICE))
    ours = ours.cpu()
    for i, ((orig, target), k, box) in enumerate(zip(SHAPES, counts, boxes, strict=True)):
        expected = scale_rboxes(original[i, :k], box)
        torch.testing.assert_close(ours[i, :k], expected, rtol=1e-6, atol=1e-4, msg=f"{orig} in {target}")
        assert torch.equal(ours[i, :k, 4:], expected[:, 4:]), "angle, conf and cls are moved, not computed"
        assert torch.equal(ours[i, k:], original[i, k:]), f"{orig}: rows past the count changed"
    outside = [(ours[i, :k, 0] < 0).any() for i, k in enumerate(counts) if k]
    assert any(outside), "centres mapped outside the image are not clipped"


def test_scale_rotated_boxes_after_nms_on_a_column_slice():
    """In place on rotated NMS output, on a view with padded rows (row stride 9): obb_postprocess's rows."""
    preds = clustered(2, 3, 500, seed=12)
    boxes = [Letterbox.fit((720, 1280), (640, 640)), Letterbox.fit((600, 400), (640, 640))]
    wide = torch.full((2, CAPACITY, 9), float("nan"), device=DEVICE)
    out = wide[..., 1:8]
    count = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    rotated_non_max_suppression(
        out,
        count,
        preds.to(DEVICE),
        nc=3,
        thresholds=torch.tensor([0.25, 0.45], device=DEVICE),
        limits=torch.tensor([300, 30000, 0], dtype=torch.int32, device=DEVICE),
        class_mask=None,
        scratch=poisoned_scratch(2, 500),
    )
    params = torch.tensor([b.box_params() for b in boxes], device=DEVICE)
    scale_rotated_boxes(out, count, params)
    found = reference(preds, 3, 0.25, 0.45, max_det=300)
    wide, count = wide.cpu(), count.cpu()
    for b, (rows, box) in enumerate(zip(found, boxes, strict=True)):
        k = int(count[b])
        assert k == len(rows) > 0
        torch.testing.assert_close(wide[b, :k, 1:8], scale_rboxes(rows, box), rtol=1e-6, atol=1e-4)
        assert wide[b, :, [0, 8]].isnan().all() and wide[b, k:].isnan().all()


@pytest.mark.parametrize(
    ("rows", "count", "params", "message"),
    [
        (torch.rand(2, 5, 7, dtype=torch.float64), torch.ones(2, dtype=torch.int32), torch.rand(2, 6), "rows: dtype"),
        (torch.rand(2, 5, 6), torch.ones(2, dtype=torch.int32), torch.rand(2, 6), "rows: shape"),
        (torch.rand(2, 7, 5).mT, torch.ones(2, dtype=torch.int32), torch.rand(2, 6), "rows: last-dimension stride"),
        (torch.rand(2, 5, 7), torch.ones(2, dtype=torch.int64), torch.rand(2, 6), "count: dtype"),
        (torch.rand(2, 5, 7), torch.ones(3, dtype=torch.int32), torch.rand(2, 6), "count: shape"),
        (torch.rand(2, 5, 7), torch.ones(2, dtype=torch.int32), torch.rand(2, 5), "params: shape"),
        (torch.rand(2, 5, 7), torch.ones(2, dtype=torch.int32), torch.rand(2, 6, dtype=torch.float64), "params: dtype"),
        (torch.rand(2, 5, 7), torch.ones(2, dtype=torch.int32), torch.rand(2, 8)[:, :6], "contiguous"),
    ],
)
def test_scale_rotated_boxes_rejects_bad_arguments(rows, count, params, message):
    with pytest.raises(ValueError, match=message):
        scale_rotated_boxes(*(to_device_keeping_strides(t, DEVICE) for t in (rows, count, params)))
