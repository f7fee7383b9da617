"""NMS kernels vs ultralytics' non_max_suppression (with torchvision's nms), on clustered and adversarial boxes.

Every run starts from a NaN-poisoned `out` and garbage scratch: rows below the count must equal ultralytics'
rows, rows from the count on must still be NaN.
"""

from __future__ import annotations

import math

import pytest
import torch
import torchvision  # noqa: F401  ultralytics takes torchvision's nms, the default predict path, once it is imported
from ultralytics.utils.nms import non_max_suppression as ultralytics_nms

from yolojet.kernels.boxes import scale_boxes
from yolojet.kernels.nms import NmsScratch, non_max_suppression, rank_group

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The rank sort is O(A²): under the interpreter keep A small, on a GPU use a 640² model's anchor count.
LARGE_A = 8400 if torch.cuda.is_available() else 1500
CAPACITY = 300
# Masked-off lanes divide 0 by 0 under the interpreter; the result is never used.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")


def clustered(batch: int, nc: int, anchors: int, extra: int, seed: int) -> torch.Tensor:
    """(batch, 4 + nc + extra, anchors) head output: jittered boxes around 20 centres, so suppression happens,
    and best-class scores spread over [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    centre = torch.rand(batch, 20, 2, generator=g) * 560 + 40
    size = torch.rand(batch, 20, 2, generator=g) * 90 + 30
    pick = torch.randint(20, (batch, anchors, 1), generator=g).expand(-1, -1, 2)
    xy = centre.gather(1, pick) + torch.randn(batch, anchors, 2, generator=g) * 8
    wh = size.gather(1, pick) * (0.8 + 0.4 * torch.rand(batch, anchors, 2, generator=g))
    scores = torch.rand(batch, nc, anchors, generator=g) * torch.rand(batch, 1, anchors, generator=g) ** 2
    extras = torch.randn(batch, extra, anchors, generator=g)
    return torch.cat([xy.mT, wh.mT, scores, extras], 1).contiguous()


def boxes_and_scores(boxes: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """(1, 4 + nc, A) from (A, 4) xywh boxes and (A, nc) scores."""
    return torch.cat([boxes, scores], 1).T[None].contiguous()


def poisoned_scratch(batch: int, anchors: int) -> NmsScratch:
    scratch = NmsScratch.allocate(batch, anchors, DEVICE)
    scratch.best_score.normal_()
    scratch.best_class.random_(-5, 1000)
    scratch.order.random_(-anchors, 2 * anchors)
    return scratch


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
    best_ready: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Our NMS on poisoned buffers: (out, count) on the CPU. With `best_ready`, the best-class pass is written into
    the scratch first, as the head's decode or score convs write it (BestClassTargets), and preds' score rows are
    poisoned: NMS must read the pass alone."""
    batch, channels, anchors = preds.shape
    out = torch.full((batch, CAPACITY, 2 + channels - nc), float("nan"), device=DEVICE)
    count = torch.full((batch,), -7, dtype=torch.int32, device=DEVICE)
    class_mask = None
    if classes is not None:
        class_mask = torch.zeros(nc, dtype=torch.bool, device=DEVICE)
        class_mask[classes] = True
    scratch = poisoned_scratch(batch, anchors)
    if best_ready:
        top, first = preds[:, 4 : 4 + nc].max(1)
        keep = top > conf if class_mask is None else (top > conf) & class_mask.cpu()[first]
        scratch.best_score.copy_(torch.where(keep, top, float("-inf")))
        scratch.best_class.copy_(first)
        preds = preds.clone()
        preds[:, 4 : 4 + nc] = float("nan")
    non_max_suppression(
        out,
        count,
        preds.to(DEVICE),
        nc=nc,
        thresholds=torch.tensor([conf, iou], device=DEVICE),
        limits=torch.tensor([max_det, max_nms, int(agnostic)], dtype=torch.int32, device=DEVICE),
        class_mask=class_mask,
        scratch=scratch,
        best_ready=best_ready,
    )
    return out.cpu(), count.cpu()


def reference(preds: torch.Tensor, nc: int, conf: float, iou: float, **options) -> list[torch.Tensor]:
    return ultralytics_nms(preds.clone(), conf, iou, nc=nc, max_time_img=math.inf, **options)


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
        torch.testing.assert_close(rows[:, :5], ref[:, :5], atol=1e-4, rtol=0)
        assert torch.equal(rows[:, 5], ref[:, 5]), f"image {b}: classes differ"
        torch.testing.assert_close(rows[:, 6:], ref[:, 6:], atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    ("nc", "anchors", "extra", "conf", "iou", "agnostic", "classes", "max_det"),
    [
        (3, 600, 0, 0.25, 0.45, False, None, 300),
        (3, LARGE_A, 5, 0.001, 0.7, True, None, 7),
        (80, LARGE_A, 5, 0.001, 0.7, False, None, 300),
        (80, 1200, 0, 0.25, 0.45, True, [0, 5, 17, 79], 300),
        (80, 900, 5, 0.25, 0.7, False, [1, 2, 3], 7),
        (3, 1000, 0, 0.001, 0.45, False, [2], 300),
        # A single class (pose's 51 keypoint values as extras): its scores are read straight from preds.
        (1, 900, 51, 0.25, 0.7, False, None, 300),
        (1, LARGE_A, 0, 0.001, 0.45, True, [0], 7),
    ],
)
def test_nms_matches_ultralytics(nc, anchors, extra, conf, iou, agnostic, classes, max_det):
    preds = clustered(2, nc, anchors, extra, seed=nc + anchors + extra)
    options = dict(agnostic=agnostic, classes=classes, max_det=max_det)
    out, count = run(preds, nc, conf, iou, **options)
    expected = reference(preds, nc, conf, iou, **options)
    assert any(0 < len(e) < (preds[b, 4 : 4 + nc].amax(0) > conf).sum() for b, e in enumerate(expected))
    assert_matches(out, count, expected)


@pytest.mark.parametrize(("nc", "extra", "classes"), [(1, 51, None), (1, 0, [0]), (80, 5, [1, 2, 3])])
def test_nms_reads_the_best_class_pass_written_before_it(nc, extra, classes):
    """With `best_ready` NMS reads the best scores and classes the head wrote (the engine's predict path, for one
    class as for many), never preds' score rows, and keeps ultralytics' rows."""
    preds = clustered(2, nc, 700, extra, seed=3 + nc)
    out, count = run(preds, nc, 0.25, 0.6, classes=classes, best_ready=True)
    expected = reference(preds, nc, 0.25, 0.6, classes=classes)
    assert all(len(e) > 0 for e in expected)
    assert_matches(out, count, expected)


@pytest.mark.parametrize("conf", [0.25, 0.001])
def test_nms_large_batch_groups_of_blocks(conf):
    """From 8 images on, a rank program covers a group of anchor blocks (rank_group): a batch of 9 whose anchors end
    inside a group, with images without a candidate, sparse ones and dense ones."""
    assert rank_group(9) > 1
    preds = clustered(9, 5, 700, 2, seed=9)
    preds[[1, 4], 4:9] = 0.0  # no candidate at all
    preds[2, 4:9, :690] = 0.0  # candidates only in the last, partial group
    out, count = run(preds, 5, conf, 0.6)
    expected = reference(preds, 5, conf, 0.6)
    assert [len(expected[b]) for b in (1, 4)] == [0, 0] and len(expected[2]) > 0
    assert_matches(out, count, expected)


def test_nms_tied_scores_without_overlap():
    """Equal scores on disjoint boxes and equal class scores within a box: every order keeps the same set,
    and the class is the first of the tied maxima."""
    g = torch.Generator().manual_seed(1)
    cell = torch.arange(256)
    centres = torch.stack([cell % 16 * 40.0 + 20, cell // 16 * 40.0 + 20], 1)
    boxes = torch.cat([centres, torch.tensor([[30.0, 25.0]]).expand(256, -1)], 1)
    scores = torch.rand(256, 3, generator=g) * 0.2
    winner = torch.randint(3, (256,), generator=g)
    scores[cell, winner] = torch.tensor([0.3, 0.6, 0.9])[torch.randint(3, (256,), generator=g)]
    scores[::5, 0] = scores[::5, 2] = scores[::5].amax(1)
    preds = boxes_and_scores(boxes, scores)
    out, count = run(preds, 3, 0.25, 0.45)
    assert_matches(out, count, reference(preds, 3, 0.25, 0.45), ordered=False)


def test_nms_best_class_ties_across_chunks_of_classes():
    """80 classes, folded in chunks of 32: a best score that a class of a later chunk shares with an earlier class, in
    the same lane of its chunk (33 and 1) or another (33 and 6), goes to the earlier class, as torch's max gives it."""
    preds = clustered(1, 80, 600, 0, seed=9)
    scores = preds[0, 4:]
    top = scores.max(0).values + 0.3
    scores[33] = top
    scores[1, ::2] = top[::2]
    scores[6, 1::2] = top[1::2]
    out, count = run(preds, 80, 0.25, 0.45)
    assert_matches(out, count, reference(preds, 80, 0.25, 0.45))
    assert set(out[0, : int(count[0]), 5].tolist()) == {1.0, 6.0}


def test_nms_boundaries():
    """An IoU exactly at the threshold does not suppress (the test is IoU > iou_thres), and of two equal scores
    the lower anchor index comes first, as in torchvision's stable sort; an extra channel carries the anchor index.

    Anchors 0…63: disjoint 10×10 boxes; 64…127: their lower halves (IoU exactly 1/2); 128…191: copies of 0…63
    with the same scores, which the originals must suppress.
    """
    g = torch.Generator().manual_seed(7)
    ones = torch.ones(64)
    centre = torch.arange(64.0) * 30 + 20
    full = torch.stack([centre, centre, 10 * ones, 10 * ones], 1)
    half = torch.stack([centre, centre + 2.5, 10 * ones, 5 * ones], 1)
    best = (torch.randperm(64, generator=g) + 65) / 129
    scores = torch.zeros(192, 2)
    cls = torch.arange(192) % 64 % 2
    scores[torch.arange(192), cls] = torch.cat([best, best / 2, best])
    preds = torch.cat([boxes_and_scores(torch.cat([full, half, full]), scores), torch.arange(192.0)[None, None]], 1)
    out, count = run(preds, 2, 0.25, 0.5)
    expected = reference(preds, 2, 0.25, 0.5)
    assert len(expected[0]) == 128 and expected[0][:, 6].max() < 128
    assert_matches(out, count, expected)


@pytest.mark.parametrize("agnostic", [False, True])
def test_nms_identical_boxes(agnostic):
    g = torch.Generator().manual_seed(2)
    boxes = torch.tensor([[100.0, 120.0, 50.0, 40.0]]).expand(400, -1)
    preds = boxes_and_scores(boxes, torch.rand(400, 3, generator=g))
    out, count = run(preds, 3, 0.25, 0.45, agnostic=agnostic)
    assert count.item() == (1 if agnostic else 3)
    assert_matches(out, count, reference(preds, 3, 0.25, 0.45, agnostic=agnostic))


def test_nms_zero_candidates():
    preds = clustered(2, 3, 500, 5, seed=3)
    preds[:, 4:7] *= 0.2
    out, count = run(preds, 3, 0.25, 0.45)
    assert count.tolist() == [0, 0]
    assert out.isnan().all()


def test_nms_single_class_filtered_out_or_at_the_threshold():
    preds = clustered(2, 1, 700, 3, seed=8)
    out, count = run(preds, 1, 0.25, 0.45, classes=[])
    assert count.tolist() == [0, 0] and out.isnan().all()
    preds[:, 4] = preds[:, 4].clamp(max=0.25)  # a score equal to conf is not above it
    out, count = run(preds, 1, 0.25, 0.45)
    assert count.tolist() == [0, 0] and out.isnan().all()


def test_nms_single_class_from_a_strided_view_with_tied_scores():
    """The single class's scores read from a view whose images are further apart than its rows (as a batch slice
    of a wider tensor), scores tied in steps of 1/20: equal scores keep anchor order, as torchvision's stable sort."""
    wide = clustered(2, 1, 900, 7, seed=9)
    wide[:, 4] = (wide[:, 4] * 20).round() / 20
    preds = wide[:, :8]  # 4 box values, the class, 3 extras; images 12·900 apart
    out, count = run(preds, 1, 0.25, 0.45)
    assert_matches(out, count, reference(preds, 1, 0.25, 0.45), ordered=False)


def test_nms_single_class_max_nms_truncation():
    preds = clustered(2, 1, 600, 2, seed=10)
    g = torch.Generator().manual_seed(10)
    preds[:, 4] = (
        torch.stack([torch.randperm(600, generator=g) for _ in range(2)]) + 1
    ) / 601  # distinct: no tie at the cut
    out, count = run(preds, 1, 0.001, 0.45, max_nms=50)
    expected = reference(preds, 1, 0.001, 0.45, max_nms=50)
    assert expected[0].shape[0] != reference(preds, 1, 0.001, 0.45)[0].shape[0]
    assert_matches(out, count, expected)


def test_nms_max_nms_truncation():
    """More candidates than max_nms: only the max_nms best enter suppression (distinct scores: no tie at the cut)."""
    preds = clustered(2, 3, 600, 0, seed=4)
    g = torch.Generator().manual_seed(4)
    for b in range(2):
        best = preds[b, 4:7].argmax(0)
        preds[b, 4 + best, torch.arange(600)] = (torch.randperm(600, generator=g) + 1) / 601
    out, count = run(preds, 3, 0.001, 0.45, max_nms=50)
    expected = reference(preds, 3, 0.001, 0.45, max_nms=50)
    assert expected[0].shape[0] != reference(preds, 3, 0.001, 0.45)[0].shape[0]
    assert_matches(out, count, expected)


def test_nms_zero_area_boxes():
    """Empty boxes (IoU 0/0 = NaN against each other: never suppressed) among ordinary ones, some duplicated."""
    preds = clustered(2, 3, 900, 5, seed=5)
    preds[:, 2, ::3] = 0.0
    preds[:, 3, 1::3] = 0.0
    preds[:, :4, 300:330] = preds[:, :4, 0:30]
    out, count = run(preds, 3, 0.25, 0.45)
    assert_matches(out, count, reference(preds, 3, 0.25, 0.45))


def test_nms_follows_device_settings_between_runs():
    """The same buffers, settings changed in place between calls: what a captured graph relies on."""
    preds = clustered(2, 80, 800, 5, seed=6).to(DEVICE)
    out = torch.full((2, CAPACITY, 11), float("nan"), device=DEVICE)
    count = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    thresholds = torch.tensor([0.25, 0.45], device=DEVICE)
    limits = torch.tensor([300, 30000, 0], dtype=torch.int32, device=DEVICE)
    class_mask = torch.ones(80, dtype=torch.uint8, device=DEVICE)
    scratch = poisoned_scratch(2, 800)
    settings = [((0.25, 0.45), (300, 30000, 0), None), ((0.001, 0.7), (7, 200, 1), [3, 4, 60])]
    for (conf, iou), (max_det, max_nms, agnostic), classes in settings:
        thresholds.copy_(torch.tensor([conf, iou]))
        limits.copy_(torch.tensor([max_det, max_nms, agnostic]))
        class_mask.fill_(classes is None)
        if classes is not None:
            class_mask[classes] = 1
        out.fill_(float("nan"))
        non_max_suppression(
            out, count, preds, nc=80, thresholds=thresholds, limits=limits, class_mask=class_mask, scratch=scratch
        )
        options = dict(max_det=max_det, max_nms=max_nms, agnostic=bool(agnostic), classes=classes)
        assert_matches(out.cpu(), count.cpu(), reference(preds.cpu(), 80, conf, iou, **options))


@pytest.mark.parametrize("nc", [80, 1])
def test_nms_maps_the_kept_boxes_where_given_box_params(nc):
    """With box_params the greedy pass maps its kept boxes to original pixels and clips them itself: the same rows
    as NMS followed by scale_boxes, bit for bit, boxes past an image's edge among them; the other columns and the rows
    past the count untouched."""
    preds = clustered(3, nc, 900, 2, seed=9).to(DEVICE)
    params = torch.tensor(
        [
            [0.0, 80.0, 1.0, 1.0, 640.0, 480.0],
            [12.5, 0.0, 0.5, 0.5, 1230.0, 1280.0],
            [3.0, 7.0, 2.0, 1.5, 200.0, 250.0],
        ],
        device=DEVICE,
    )

    def nms(out: torch.Tensor, count: torch.Tensor, box_params: torch.Tensor | None) -> None:
        non_max_suppression(
            out,
            count,
            preds,
            nc=nc,
            thresholds=torch.tensor([0.05, 0.5], device=DEVICE),
            limits=torch.tensor([300, 30000, 0], dtype=torch.int32, device=DEVICE),
            class_mask=None,
            scratch=poisoned_scratch(3, 900),
            box_params=box_params,
        )

    found = []
    for mapped_in_nms in (True, False):
        out = torch.full((3, CAPACITY, 8), float("nan"), device=DEVICE)
        count = torch.full((3,), -7, dtype=torch.int32, device=DEVICE)
        nms(out, count, params if mapped_in_nms else None)
        if not mapped_in_nms:
            scale_boxes(out, count, params)
        found.append((out.cpu(), count.cpu()))
    (mapped, count), (expected, expected_count) = found
    assert torch.equal(count, expected_count) and int(count.min()) > 0
    assert torch.equal(mapped.isnan(), expected.isnan())
    assert torch.equal(mapped.nan_to_num(), expected.nan_to_num())
    assert bool((expected[2, : count[2], 2] == 200.0).any()), "no box was clipped at an image's edge"
    with pytest.raises(ValueError, match="box_params"):
        nms(out, count.to(DEVICE), params[:2])


def test_nms_rejects_bad_arguments():
    preds = torch.zeros(2, 9, 50, device=DEVICE)
    good = dict(
        out=torch.zeros(2, 10, 8, device=DEVICE),
        count=torch.zeros(2, dtype=torch.int32, device=DEVICE),
        preds=preds,
        nc=3,
        thresholds=torch.tensor([0.25, 0.45], device=DEVICE),
        limits=torch.tensor([10, 100, 0], dtype=torch.int32, device=DEVICE),
        class_mask=None,
        scratch=NmsScratch.allocate(2, 50, DEVICE),
    )
    bad = {
        "preds": preds.double(),
        "nc": 6,
        "out": torch.zeros(2, 10, 6, device=DEVICE),
        "count": torch.zeros(2, device=DEVICE),
        "thresholds": torch.tensor([0.25, 0.45], dtype=torch.float64, device=DEVICE),
        "limits": torch.tensor([10, 100], dtype=torch.int32, device=DEVICE),
        "class_mask": torch.ones(4, dtype=torch.bool, device=DEVICE),
        "scratch": NmsScratch.allocate(2, 49, DEVICE),
    }
    for name, value in bad.items():
        with pytest.raises(ValueError):
            non_max_suppression(**{**good, name: value})
    with pytest.raises(ValueError, match="class_mask: dtype"):
        non_max_suppression(**{**good, "class_mask": torch.ones(3, dtype=torch.int32, device=DEVICE)})
