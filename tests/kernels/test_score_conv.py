"""The class-score conv with NMS's best-class pass as its epilogue, against the conv and the pass done in float64."""

from __future__ import annotations

import pytest
import torch
from support import exact_head_conv, head_conv_operands

from yolojet.kernels.conv.scores import MOST_SCORE_CHANNELS, score_conv_best_class
from yolojet.kernels.nms import BestClassTargets

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(
    ("dtype", "c_in", "nc", "c_out", "classes", "conf", "activation"),
    [
        (torch.float16, 80, 80, 80, None, 0.95, "identity"),  # yolo11n's 80 classes, two K blocks
        # A widened map (7 classes, 16 outputs), a class filter, and an activation before the logistic.
        (torch.float32, 24, 7, 16, [0, 3, 6], 0.6, "silu"),
    ],
)
def test_score_conv_writes_the_best_class_pass(dtype, c_in, nc, c_out, classes, conf, activation):
    """Each anchor of the level's rows gets the best score of logistic(act(conv(x))) with the logits rounded to the
    map's dtype, as the conv's store would (−inf unless above conf and of a kept class), and its first best class;
    the anchors of other levels and the spare image's row stay as they were."""
    batch, height, width, offset, anchors = 2, 5, 7, 9, 60
    x, w, bias = head_conv_operands((batch, height, width), c_in, c_out, dtype, c_in + nc, 1.0, DEVICE)
    best_score = torch.full((batch + 1, anchors), 7.0, device=DEVICE)
    best_class = torch.full((batch + 1, anchors), -3, dtype=torch.int32, device=DEVICE)
    thresholds = torch.tensor([conf, 0.7], device=DEVICE)
    mask = None
    if classes is not None:
        mask = torch.zeros(nc, dtype=torch.bool, device=DEVICE)
        mask[classes] = True
    targets = BestClassTargets(best_score[:batch], best_class[:batch], thresholds, mask, store_scores=False)
    score_conv_best_class(x, w, bias, targets, anchor_offset=offset, nc=nc, activation=activation)

    exact = exact_head_conv(x, w, bias, activation)[..., :nc].reshape(batch, height * width, nc)
    scores = torch.sigmoid(exact.to(dtype).double())
    top, first = scores.max(-1)
    keep = top > conf
    if mask is not None:
        keep &= mask.cpu()[first]
    level = slice(offset, offset + height * width)
    got_score, got_class = best_score[:batch, level].cpu(), best_class[:batch, level].cpu()
    second = scores.topk(2, -1).values[..., 1]
    clear = (top - second > 1e-3) & ((top - conf).abs() > 1e-3)  # no near-tie, not at the threshold
    assert torch.equal(got_class[clear], first[clear].int())
    assert torch.equal(torch.isinf(got_score)[clear], ~keep[clear])
    kept = keep & clear
    if dtype == torch.float16:
        # The logit the kernel rounds is the exact one or, summed in another order, a neighbour in fp16: its score is
        # the logistic of one of the two fp16 values around the exact logit, unrounded it would be neither.
        logit = exact.gather(-1, first[..., None])[..., 0][kept]
        nearest = logit.half()
        other = torch.nextafter(nearest, torch.where(logit > nearest.double(), 1e4, -1e4).half())
        assert bool((nearest != other).all())
        miss = torch.minimum(*((got_score[kept].double() - torch.sigmoid(v.double())).abs() for v in (nearest, other)))
        assert float(miss.max()) < 1e-6
    else:
        torch.testing.assert_close(got_score[kept].double(), top[kept], rtol=0, atol=1e-5)
    assert 0 < int(keep.sum()) < keep.numel(), "some anchors must be candidates and some not"
    assert bool((best_score[:batch, :offset] == 7.0).all()) and bool((best_score[:batch, level.stop :] == 7.0).all())
    assert bool((best_class[batch] == -3).all()) and bool((best_score[batch] == 7.0).all())


def test_score_conv_breaks_ties_for_the_first_class():
    """Two classes with identical weights and bias tie everywhere: the first is the best class, as torch's max."""
    c_in, nc = 16, 20
    x = torch.randn(1, 4, 4, c_in, device=DEVICE) * 0.05
    weight = torch.randn(nc, 1, 1, c_in, device=DEVICE)
    weight[3] = weight[12]
    bias = torch.zeros(nc, device=DEVICE)
    bias[3] = bias[12] = 5.0  # above every other class
    best_score = torch.empty(1, 16, device=DEVICE)
    best_class = torch.empty(1, 16, dtype=torch.int32, device=DEVICE)
    thresholds = torch.tensor([0.0, 0.7], device=DEVICE)
    targets = BestClassTargets(best_score, best_class, thresholds, None, store_scores=False)
    score_conv_best_class(x, weight, bias, targets, anchor_offset=0, nc=nc)
    assert bool((best_class == 3).all())


def test_score_conv_refuses_what_does_not_fit():
    x = torch.zeros(1, 2, 2, 16, device=DEVICE)
    best = BestClassTargets(
        torch.zeros(1, 4, device=DEVICE),
        torch.zeros(1, 4, dtype=torch.int32, device=DEVICE),
        torch.tensor([0.1, 0.7], device=DEVICE),
        None,
        store_scores=False,
    )
    bias = torch.zeros(8, device=DEVICE)
    with pytest.raises(ValueError, match=r"anchors 1\.\.5 past the 4"):
        score_conv_best_class(x, torch.zeros(8, 1, 1, 16, device=DEVICE), bias, best, anchor_offset=1, nc=8)
    with pytest.raises(ValueError, match="weight must be a contiguous"):
        score_conv_best_class(x, torch.zeros(8, 3, 3, 16, device=DEVICE), bias, best, anchor_offset=0, nc=8)
    with pytest.raises(ValueError, match="9 classes of 8 outputs"):
        score_conv_best_class(x, torch.zeros(8, 1, 1, 16, device=DEVICE), bias, best, anchor_offset=0, nc=9)
    wide = MOST_SCORE_CHANNELS + 16
    with pytest.raises(ValueError, match=f"at most {MOST_SCORE_CHANNELS} outputs"):
        score_conv_best_class(
            x, torch.zeros(wide, 1, 1, 16, device=DEVICE), torch.zeros(wide, device=DEVICE), best, anchor_offset=0,
            nc=wide,
        )  # fmt: skip
