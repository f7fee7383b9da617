"""YOLO26's one-to-one selection kernel vs ultralytics' own `Detect.postprocess` (its `get_topk_index`).

Every run starts from a NaN-poisoned `out` and garbage scratch. Rows must equal ultralytics' up to the order of
tied scores (torch's topk leaves it open; ours takes the lower anchor, then the lower class).
"""

from __future__ import annotations

import pytest
import torch
from support import topk_relative_error
from ultralytics.nn.modules.head import Detect

from yolojet.kernels.topk import OneToOneScratch, one_to_one_select

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The rank sort is O(A²): under the interpreter keep A small, on a GPU use a 640² model's anchor count.
LARGE_A = 8400 if torch.cuda.is_available() else 1200


def head_output(batch: int, nc: int, extra: int, anchors: int, seed: int, levels: int | None = None) -> torch.Tensor:
    """(batch, 4 + nc + extra, anchors) decoded output: boxes in pixels, sigmoid scores spread over (0, 1) (or
    rounded to `levels` values, for ties everywhere), extras of any sign."""
    g = torch.Generator().manual_seed(seed)
    boxes = torch.rand(batch, 4, anchors, generator=g) * 640
    scores = torch.sigmoid(torch.randn(batch, nc, anchors, generator=g) * 3)
    if levels is not None:
        scores = (scores * levels).round() / levels
    extras = torch.randn(batch, extra, anchors, generator=g)
    return torch.cat([boxes, scores, extras], 1).contiguous()


def ultralytics_select(preds: torch.Tensor, nc: int, max_det: int) -> torch.Tensor:
    head = Detect(nc=nc, ch=(8,))
    head.max_det = max_det
    return head.postprocess(preds.permute(0, 2, 1).cpu())


def select(preds: torch.Tensor, nc: int, max_det: int) -> torch.Tensor:
    batch, _, anchors = preds.shape
    k = min(max_det, anchors)
    out = torch.full((batch, k, preds.shape[1] - nc + 2), float("nan"), device=DEVICE)
    scratch = OneToOneScratch(batch, anchors, nc, k, DEVICE)
    scratch.ranking.order.random_(-anchors, 2 * anchors)
    scratch.ranking.best_score.normal_()
    scratch.pair_scores.normal_()
    scratch.pair_index.random_(-5, 10**6)
    one_to_one_select(out, preds.to(DEVICE), nc=nc, scratch=scratch)
    return out.cpu()


@pytest.mark.parametrize(
    ("batch", "nc", "extra", "anchors", "max_det"),
    [
        (2, 80, 0, LARGE_A, 300),  # detect
        (1, 80, 32, 400, 300),  # segment's mask coefficients
        (2, 1, 51, 336, 300),  # pose: one class, its scores read straight from preds
        (1, 15, 1, 500, 300),  # OBB's angle
        (2, 200, 0, 84, 300),  # fewer anchors than max_det: every anchor, in order
        (3, 150, 3, 500, 50),  # more classes than a gathering tile, a small max_det
    ],
)
def test_matches_ultralytics(batch, nc, extra, anchors, max_det):
    preds = head_output(batch, nc, extra, anchors, seed=nc + anchors)
    ours, theirs = select(preds, nc, max_det), ultralytics_select(preds, nc, max_det)
    assert not ours.isnan().any(), "a row was not written"
    assert topk_relative_error(ours, theirs) == 0.0
    assert torch.equal(ours[..., 4], theirs[..., 4]), "selected scores differ"


def test_ties_everywhere():
    """Scores on eleven levels: most pairs tie, the selection is cut inside a tie group, and many more pairs
    than rows reach the threshold. Still the same scores, and every row is a real (anchor, class) pair."""
    nc, extra = 12, 2
    preds = head_output(2, nc, extra, 600, seed=3, levels=10)
    ours, theirs = select(preds, nc, 300), ultralytics_select(preds, nc, 300)
    assert torch.equal(ours[..., 4], theirs[..., 4])
    for b in range(2):
        # Above the last score the two selections hold the same pairs; at it, either may take any tied pair.
        cut = float(theirs[b, -1, 4])
        assert sorted(map(tuple, ours[b][ours[b, :, 4] > cut].tolist())) == sorted(
            map(tuple, theirs[b][theirs[b, :, 4] > cut].tolist())
        )
        anchor_of = {tuple(preds[b, :4, a].tolist()): a for a in range(preds.shape[2])}
        pairs = set()
        for row in ours[b]:
            a, c = anchor_of[tuple(row[:4].tolist())], int(row[5])
            assert float(preds[b, 4 + c, a]) == float(row[4])
            assert torch.equal(row[6:], preds[b, 4 + nc :, a])
            pairs.add((a, c))
        assert len(pairs) == 300, "a pair was selected twice"


def test_nan_scores_leave_zero_rows():
    """An anchor whose scores are NaN is no candidate (as for NMS): with fewer scored anchors than rows, the
    scored ones come first and the rest are zeros, never stale memory."""
    nc = 4
    preds = head_output(1, nc, 0, 50, seed=5)
    preds[0, 4:, 10:] = float("nan")
    ours = select(preds, nc, 300)
    theirs = ultralytics_select(preds[..., :10].contiguous(), nc, 300)
    assert ours.shape == (1, 50, 6)
    assert topk_relative_error(ours[:, :10], theirs) == 0.0
    assert torch.equal(ours[0, 10:], torch.zeros(40, 6))


def _args(batch=1, nc=3, extra=0, anchors=20, k=5, scratch=None):
    preds = torch.rand(batch, 4 + nc + extra, anchors, device=DEVICE)
    out = torch.empty(batch, k, 6 + extra, device=DEVICE)
    return out, preds, scratch or OneToOneScratch(batch, anchors, nc, k, DEVICE)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: one_to_one_select(*_args()[:2], nc=9, scratch=_args()[2]), "does not hold 4 boxes"),
        (lambda: one_to_one_select(*_args(k=21)[:2], nc=3, scratch=_args()[2]), r"21 rows, expected 1\.\.20"),
        (lambda: one_to_one_select(*_args(k=6)[:2], nc=3, scratch=_args()[2]), "pair_scores"),
        (lambda: one_to_one_select(*_args(batch=2)[:2], nc=3, scratch=_args()[2]), "scratch"),
        (lambda: one_to_one_select(_args()[0][..., :5], _args()[1], nc=3, scratch=_args()[2]), "topk out"),
    ],
)
def test_rejects_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()
