"""select_one_to_one (YOLO26's one-to-one selection) against the reference executor's `topk` torch ops.

torch.topk's order among equal scores is unspecified, so what is compared depends on the scores:
- distinct by construction (sigmoids of a permutation of evenly spaced logits): the rows equal the reference's
  exactly;
- random, correlated, quantized or constant (ties, few or many): the selected scores equal the reference's as a
  sorted multiset, exactly, and every row is a valid pick: its box and extras are those of an anchor whose score
  for the row's class is the row's score, that anchor could have been kept (its best score is at least the k-th
  best anchor score), no (anchor, class) pair twice, scores descending.
Outputs start NaN-poisoned and scratch full of garbage; inputs are fresh random tensors. Under the interpreter the
shapes are small (a few hundred to 1,200 anchors); on a GPU also 640-pixel heads (8,400 anchors) at batch 1 and 64.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from yolojet.ir import Node
from yolojet.kernels.one_to_one import OneToOneScratch, select_one_to_one
from yolojet.reference.executor import OPS as REFERENCE_OPS

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MAX_DET = 300


def reference(preds: torch.Tensor, nc: int, max_det: int) -> torch.Tensor:
    node = Node("one2one", "topk", ["preds"], ["rows"], {"nc": nc, "max_det": max_det})
    return REFERENCE_OPS["topk"](node, [preds], {})[0]


def head(batch: int, anchors: int, nc: int, extra: int, scores: str, seed: int) -> torch.Tensor:
    """(batch, 4 + nc + extra, anchors) decoded head: distinct random boxes (they identify an anchor), random
    extras and class scores of the kind asked for."""
    g = torch.Generator().manual_seed(seed)
    boxes = torch.rand(batch, 4, anchors, generator=g) * 640
    extras = torch.randn(batch, extra, anchors, generator=g)
    shape = (batch, nc, anchors)
    if scores == "distinct":
        # Logits 8 / (nc·A) apart on [-4, 4]: their sigmoids lie at least 2e-7 apart, above float32's spacing
        # near 1 (6e-8), so no two scores of an image are equal.
        spaced = torch.linspace(-4, 4, nc * anchors)
        logits = torch.stack([spaced[torch.randperm(nc * anchors, generator=g)] for _ in range(batch)])
        probs = logits.view(shape).sigmoid()
    elif scores == "random":
        probs = (torch.randn(shape, generator=g) * 2).sigmoid()
    elif scores == "correlated":
        # Each anchor's classes share a base logit: the best anchors hold many of the best pairs.
        base = torch.randn(batch, 1, anchors, generator=g) * 2
        probs = (base + torch.randn(shape, generator=g) * 0.5).sigmoid()
    elif scores == "quantized":
        probs = ((torch.randn(shape, generator=g) * 2).sigmoid() * 16).round() / 16  # 17 values: ties everywhere
    elif scores == "constant":
        probs = torch.full(shape, 0.5)
    else:
        raise ValueError(scores)
    return torch.cat([boxes, probs, extras], 1).contiguous().to(DEVICE)


def garbage_scratch(batch: int, anchors: int, nc: int, extra: int, max_det: int) -> OneToOneScratch:
    scratch = OneToOneScratch.allocate(batch, anchors, nc, extra, max_det, DEVICE)
    for t in (scratch.best, scratch.pairs, scratch.rows):
        t.normal_()
    for t in (scratch.anchors, scratch.threshold, scratch.chosen, scratch.spill):
        t.random_(-(2**31), 2**31 - 1)
    return scratch


def select(preds: torch.Tensor, nc: int, max_det: int, scratch: OneToOneScratch | None = None) -> torch.Tensor:
    batch, channels, anchors = preds.shape
    extra = channels - 4 - nc
    out = torch.full((batch, min(max_det, anchors), 6 + extra), float("nan"), device=DEVICE)
    scratch = scratch or garbage_scratch(batch, anchors, nc, extra, max_det)
    select_one_to_one(out, preds, nc=nc, max_det=max_det, scratch=scratch)
    return out


def assert_valid_selection(out: torch.Tensor, preds: torch.Tensor, nc: int, max_det: int) -> None:
    """The tie-robust properties (the module docstring's second list) against the reference."""
    out, preds = out.cpu(), preds.cpu()
    expected = reference(preds, nc, max_det)
    assert out.shape == expected.shape
    nan_count = int(out.isnan().sum())
    assert nan_count == 0, f"{nan_count} of {out.numel()} outputs are NaN (unwritten?)"
    assert torch.equal(out[..., 4].sort(-1).values, expected[..., 4].sort(-1).values), "selected scores differ"
    assert bool((out[..., 4].diff(dim=-1) <= 0).all()), "scores not descending"
    k = out.shape[1]
    scores = preds[:, 4 : 4 + nc]
    best = scores.max(1).values
    for n in range(out.shape[0]):
        cls = out[n, :, 5].long()
        assert torch.equal(cls.float(), out[n, :, 5]) and bool(((cls >= 0) & (cls < nc)).all()), f"image {n}: classes"
        match = (preds[n, :4].T[None] == out[n, :, None, :4]).all(-1)  # (k, A): the anchor each row's box is
        assert bool((match.sum(1) == 1).all()), f"image {n}: a row's box is no anchor's"
        anchor = match.int().argmax(1)
        assert torch.equal(scores[n, cls, anchor], out[n, :, 4]), f"image {n}: a score is not its pair's"
        assert torch.equal(preds[n, 4 + nc :, anchor].T, out[n, :, 6:]), f"image {n}: extras of another anchor"
        assert bool((best[n, anchor] >= best[n].topk(k).values[-1]).all()), f"image {n}: an anchor not among the best"
        assert len(set((anchor * nc + cls).tolist())) == k, f"image {n}: an (anchor, class) pair twice"


# (batch, anchors, nc, extra, max_det): detect (80 classes), pose (1 class, 51 keypoint values), OBB (15 classes,
# an angle), segment (32 mask coefficients); max_det below the anchor count, and above it (every anchor kept).
SHAPES = {
    "detect": (3, 1200, 80, 0, MAX_DET),
    "detect-small": (1, 300, 80, 0, 100),
    "pose": (3, 600, 1, 51, MAX_DET),
    "pose-all-anchors": (2, 250, 1, 51, MAX_DET),
    "obb": (3, 400, 15, 1, MAX_DET),
    "segment-all-anchors": (2, 200, 80, 32, MAX_DET),
}


@pytest.mark.parametrize("shape", ["detect", "pose", "obb", "segment-all-anchors"])
def test_rows_equal_the_reference_for_distinct_scores(shape):
    batch, anchors, nc, extra, max_det = SHAPES[shape]
    preds = head(batch, anchors, nc, extra, "distinct", seed=anchors + nc)
    out = select(preds, nc, max_det)
    assert not out.isnan().any(), f"{int(out.isnan().sum())} outputs unwritten"
    assert torch.equal(out.cpu(), reference(preds.cpu(), nc, max_det))


@pytest.mark.parametrize(
    ("shape", "scores"),
    [
        ("detect", "random"),
        ("detect-small", "random"),
        ("pose-all-anchors", "random"),
        ("obb", "random"),
        ("segment-all-anchors", "correlated"),
        ("detect", "correlated"),
        ("detect", "quantized"),
        ("pose", "quantized"),
        ("obb", "constant"),
    ],
)
def test_selection_is_valid_and_scores_equal_the_reference(shape, scores):
    batch, anchors, nc, extra, max_det = SHAPES[shape]
    preds = head(batch, anchors, nc, extra, scores, seed=anchors * 7 + nc)
    assert_valid_selection(select(preds, nc, max_det), preds, nc, max_det)


@pytest.mark.parametrize(("anchors", "nc", "max_det"), [(300, 80, 1), (1, 2, MAX_DET), (17, 1, 5)])
def test_tiny_selections(anchors, nc, max_det):
    preds = head(2, anchors, nc, 3, "random", seed=anchors)
    assert_valid_selection(select(preds, nc, max_det), preds, nc, max_det)


def test_reruns_on_the_same_buffers_follow_new_inputs_and_repeat_exactly():
    """What a captured graph does: the same out and scratch, new scores written into the same preds."""
    batch, anchors, nc, extra, max_det = SHAPES["obb"]
    preds = head(batch, anchors, nc, extra, "quantized", seed=1)
    scratch = garbage_scratch(batch, anchors, nc, extra, max_det)
    first = select(preds, nc, max_det, scratch)
    assert torch.equal(select(preds, nc, max_det, scratch), first), "ties broken differently on a rerun"
    preds.copy_(head(batch, anchors, nc, extra, "distinct", seed=2))
    assert torch.equal(select(preds, nc, max_det, scratch).cpu(), reference(preds.cpu(), nc, max_det))


def _args(**overrides):
    batch, anchors, nc, extra = 2, 64, 3, 2
    args = {
        "out": torch.zeros(batch, 64, 6 + extra),
        "preds": torch.rand(batch, 4 + nc + extra, anchors),
        "nc": nc,
        "max_det": MAX_DET,
        "scratch": OneToOneScratch.allocate(batch, anchors, nc, extra, MAX_DET, DEVICE),
    }
    args.update(overrides)
    return {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in args.items()}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"preds": torch.rand(2, 9, 64, dtype=torch.float16)}, "preds: dtype"),
        ({"preds": torch.rand(2, 64, 9).mT}, "preds: last-dimension stride"),
        ({"nc": 6}, "does not hold 4 boxes"),
        ({"max_det": 0}, "max_det 0"),
        ({"out": torch.zeros(2, 63, 8)}, r"out: shape \(2, 63, 8\), expected \(2, 64, 8\)"),
        ({"out": torch.zeros(2, 64, 7)}, "out: shape"),
        ({"scratch": OneToOneScratch.allocate(2, 64, 3, 2, 10, DEVICE)}, r"scratch\.anchors: shape"),
        ({"scratch": OneToOneScratch.allocate(1, 64, 3, 2, MAX_DET, DEVICE)}, r"scratch\.best: shape"),
    ],
)
def test_rejects_bad_arguments(override, message):
    with pytest.raises(ValueError, match=message):
        select_one_to_one(**_args(**override))


def test_rejects_scratch_that_is_not_contiguous():
    scratch = OneToOneScratch.allocate(2, 64, 3, 2, MAX_DET, DEVICE)
    spill = torch.empty(2, 2 * scratch.spill.shape[1], dtype=torch.int32, device=DEVICE)[:, : scratch.spill.shape[1]]
    with pytest.raises(ValueError, match=r"scratch\.spill: strides"):
        select_one_to_one(**_args(scratch=OneToOneScratch(**{**scratch.__dict__, "spill": spill})))


# yolo26n-like heads at 640 pixels: 8,400 anchors.
GPU_SHAPES = [(8400, 80, 0), (8400, 1, 51), (8400, 15, 1), (8400, 80, 32)]


@pytest.mark.gpu(reason="8,400 anchors at batch 64 are hours under the interpreter")
@pytest.mark.parametrize("batch", [1, 64])
@pytest.mark.parametrize(("anchors", "nc", "extra"), GPU_SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("scores", ["distinct", "random", "correlated", "quantized"])
def test_full_size_heads_on_the_gpu(batch, anchors, nc, extra, scores):
    preds = head(batch, anchors, nc, extra, scores, seed=batch + nc)
    out = select(preds, nc, MAX_DET)
    if scores == "distinct":
        assert torch.equal(out.cpu(), reference(preds.cpu(), nc, MAX_DET))
    else:
        assert_valid_selection(out, preds, nc, MAX_DET)


@pytest.mark.gpu(reason="CUDA graphs and programmatic dependent launch need a GPU")
def test_captured_with_dependent_launch_equals_eager():
    from yolojet.kernels.pdl import pdl_available

    batch, anchors, nc, extra = 8, 8400, 80, 0
    preds = head(batch, anchors, nc, extra, "correlated", seed=5)
    eager = select(preds, nc, MAX_DET)
    out = torch.full_like(eager, float("nan"))
    scratch = garbage_scratch(batch, anchors, nc, extra, MAX_DET)
    pdl = pdl_available(preds.device)
    select_one_to_one(out, preds, nc=nc, max_det=MAX_DET, scratch=scratch, pdl=pdl)  # compiled before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        select_one_to_one(out, preds, nc=nc, max_det=MAX_DET, scratch=scratch, pdl=pdl)
    out.fill_(float("nan"))
    graph.replay()
    assert torch.equal(out, eager)
    preds.copy_(head(batch, anchors, nc, extra, "distinct", seed=6))
    graph.replay()
    assert torch.equal(out.cpu(), reference(preds.cpu(), nc, MAX_DET))
