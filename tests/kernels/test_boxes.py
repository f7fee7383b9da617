"""select_rows and scale_boxes (the end-to-end head's confidence filter, boxes back to original pixels) against
the torch pipeline they stand in for, and scale_boxes also against ultralytics' own `scale_boxes`.

Every output starts NaN-poisoned (select_rows) or filled with sentinels that any write would change
(scale_boxes): rows below the count must equal the reference, rows from the count on must be untouched.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernel_checks import to_device_keeping_strides
from ultralytics.utils.ops import scale_boxes as ultralytics_scale_boxes

from yolojet.kernels.boxes import scale_boxes, select_rows
from yolojet.reference import pipeline as torch_pipeline
from yolojet.reference.pipeline import Letterbox, select_end2end

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
N, K, NC, CAPACITY = 3, 300, 7, 300
# Masked-off lanes may divide 0 by 0 under the interpreter; the result is never used.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


def ranked_rows(extra: int, seed: int) -> torch.Tensor:
    """(N, K, 6 + extra) rows as the one-to-one head gives them: sorted by descending score, random boxes, classes
    and extras. Some scores sit exactly on the 0.3 and 0.9 thresholds (which must not pass: the test is score >
    conf); at conf 0.3 the rows kept span the kernel's three 128-row blocks."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(N, K, 2, generator=g) * 600
    wh = torch.rand(N, K, 2, generator=g) * 80 + 1
    score = torch.rand(N, K, generator=g)
    score[:, 10:14] = 0.3
    score[:, 20:22] = 0.9
    score[:, 125:131] = 0.55  # a run of equal scores
    score = score.sort(dim=1, descending=True).values
    cls = torch.randint(NC, (N, K), generator=g).float()
    extras = torch.randn(N, K, extra, generator=g)
    rows = torch.cat([xy, xy + wh, score[..., None], cls[..., None], extras], -1)
    return rows.to(DEVICE).contiguous()


def buffers(c: int) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.full((N, CAPACITY, c), float("nan"), device=DEVICE)
    count = torch.full((N,), -7, dtype=torch.int32, device=DEVICE)
    return out, count


def class_mask_for(classes: list[int] | None) -> torch.Tensor | None:
    if classes is None:
        return None
    mask = torch.zeros(NC, dtype=torch.uint8)
    mask[classes] = 1
    return mask.to(DEVICE)


def assert_selected(out, count, rows, conf, max_det, classes, *, poisoned: bool = True) -> list[int]:
    """out[n, :count[n]] equals select_end2end's rows exactly; past the count still NaN when `poisoned`."""
    expected = select_end2end(rows.cpu(), conf, max_det, classes)
    out, count = out.cpu(), count.cpu()
    counts = count.tolist()
    for n in range(N):
        assert counts[n] == len(expected[n]), f"image {n}: count {counts[n]}, reference keeps {len(expected[n])}"
        assert torch.equal(out[n, : counts[n]], expected[n]), f"image {n}: kept rows differ from the reference"
        if poisoned:
            assert bool(out[n, counts[n] :].isnan().all()), f"image {n}: rows past the count were written"
    return counts


@pytest.mark.parametrize("extra", [0, 5], ids=["C6", "C11"])
@pytest.mark.parametrize("classes", [None, [0, 3, 6]], ids=["all-classes", "class-mask"])
@pytest.mark.parametrize(("conf", "max_det"), [(0.3, 250), (0.3, 17), (0.9, 250), (0.9, 4)])
def test_select_rows_matches_select_end2end(extra, classes, conf, max_det):
    rows = ranked_rows(extra, seed=int(conf * 10) + max_det + extra)
    out, count = buffers(6 + extra)
    select_rows(
        out,
        count,
        rows,
        torch.tensor([conf, 0.7], device=DEVICE),
        torch.tensor([max_det, 30000, 0], dtype=torch.int32, device=DEVICE),
        class_mask_for(classes),
    )
    counts = assert_selected(out, count, rows, conf, max_det, classes)
    # The parameters are chosen so that max_det really cuts (17, 4) or really does not (250).
    passing = [len(r) for r in select_end2end(rows.cpu(), conf, 10**6, classes)]
    if max_det < 100:
        assert any(p > max_det for p in passing), passing
    else:
        assert all(0 < p < max_det for p in passing), passing
    assert max(counts) > 0


def test_select_rows_thresholds_change_between_calls_on_the_same_buffers():
    """What a captured graph does: same tensors, new values written into thresholds/limits/class_mask between runs."""
    rows = ranked_rows(4, seed=11)
    out, count = buffers(10)
    thresholds = torch.tensor([0.3, 0.7], device=DEVICE)
    limits = torch.tensor([250, 30000, 0], dtype=torch.int32, device=DEVICE)
    class_mask = torch.ones(NC, dtype=torch.uint8, device=DEVICE)
    select_rows(out, count, rows, thresholds, limits, class_mask)
    first = assert_selected(out, count, rows, 0.3, 250, None)

    thresholds.copy_(torch.tensor([0.9, 0.7]))
    limits.copy_(torch.tensor([6, 30000, 0], dtype=torch.int32))
    class_mask.copy_(torch.tensor([1, 1, 0, 1, 0, 1, 1], dtype=torch.uint8))
    select_rows(out, count, rows, thresholds, limits, class_mask)
    second = assert_selected(out, count, rows, 0.9, 6, [0, 1, 3, 5, 6], poisoned=False)
    assert first != second and max(second) > 0

    thresholds.copy_(torch.tensor([0.5, 0.7]))
    limits.copy_(torch.tensor([300, 30000, 0], dtype=torch.int32))
    class_mask.fill_(1)
    select_rows(out, count, rows, thresholds, limits, class_mask)
    assert_selected(out, count, rows, 0.5, 300, None, poisoned=False)


def test_select_rows_nothing_passes():
    rows = ranked_rows(0, seed=5)
    out, count = buffers(6)
    thresholds = torch.tensor([float(rows[..., 4].max()), 0.7], device=DEVICE)  # strict: the top score fails too
    select_rows(out, count, rows, thresholds, torch.tensor([300], dtype=torch.int32, device=DEVICE))
    assert count.cpu().tolist() == [0, 0, 0]
    assert bool(out.isnan().all())


# (original h, w), (model input h, w): square and rectangular inputs, portrait/landscape frames, up- and downscaling
SHAPES = [
    [(1080, 810), (640, 640)],
    [(720, 1280), (640, 640)],
    [(480, 640), (384, 640)],
    [(100, 37), (320, 256)],
    [(333, 333), (640, 480)],
    [(1920, 1080), (640, 384)],
]


def test_scale_boxes_matches_torch_pipeline_and_ultralytics():
    g = torch.Generator().manual_seed(3)
    counts = [0, 7, 200, 131, 300, 1]  # empty, short, and counts crossing the kernel's 128-row blocks
    c = 9
    n = len(SHAPES)
    boxes = [Letterbox.fit(orig, target) for orig, target in SHAPES]
    rows = torch.empty(n, K, c)
    for i, ((_, (h, w)), k) in enumerate(zip(SHAPES, counts, strict=True)):
        # Corners anywhere over the model input and 30 px beyond it, so boxes reach into the padding and past the
        # edges: mapped back they fall outside the original image and must be clipped to it.
        rows[i, :, [0, 2]] = torch.rand(K, 2, generator=g) * (w + 60) - 30
        rows[i, :, [1, 3]] = torch.rand(K, 2, generator=g) * (h + 60) - 30
        rows[i, :, 4:] = torch.randn(K, c - 4, generator=g)
        rows[i, k:, :4] = -500 - torch.rand(K - k, 4, generator=g) * 500  # a write past the count would clip these
    params = torch.tensor([b.box_params() for b in boxes], dtype=torch.float32)
    original = rows.clone()
    ours = rows.to(DEVICE)
    scale_boxes(ours, torch.tensor(counts, dtype=torch.int32, device=DEVICE), params.to(DEVICE))
    ours = ours.cpu()

    clipped = 0
    for i, ((orig, target), k, box) in enumerate(zip(SHAPES, counts, boxes, strict=True)):
        expected = torch_pipeline.scale_boxes(original[i, :k].clone(), box)
        torch.testing.assert_close(ours[i, :k], expected, rtol=1e-6, atol=1e-4, msg=f"{orig} in {target}")
        theirs = ultralytics_scale_boxes(target, original[i, :k, :4].clone(), orig)
        torch.testing.assert_close(ours[i, :k, :4], theirs, rtol=1e-6, atol=1e-4, msg=f"ultralytics {orig} {target}")
        assert torch.equal(ours[i, k:], original[i, k:]), f"{orig}: rows past the count changed"
        h0, w0 = orig
        xs, ys = ours[i, :k, [0, 2]], ours[i, :k, [1, 3]]
        assert bool((xs >= 0).all() and (xs <= w0).all() and (ys >= 0).all() and (ys <= h0).all())
        clipped += int((xs == 0).sum() + (xs == w0).sum() + (ys == 0).sum() + (ys == h0).sum())
    assert clipped > 20, "the rows must reach past the image edges for the clip to be exercised"


def test_scale_boxes_without_padding_is_a_plain_rescale():
    """Same aspect ratio, no padding: x / (640 / 1280), an independent closed form."""
    g = torch.Generator().manual_seed(8)
    box = Letterbox.fit((960, 1280), (480, 640))
    assert (box.pad_top, box.pad_left) == (0, 0)
    rows = torch.rand(1, 40, 6, generator=g) * torch.tensor([640, 480, 640, 480, 1, 80])
    expected = rows.clone()
    expected[0, :, :4] *= 2
    out, params = rows.to(DEVICE), torch.tensor([box.box_params()], device=DEVICE)
    scale_boxes(out, torch.tensor([40], dtype=torch.int32, device=DEVICE), params)
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-6, atol=1e-4)


def _select_args(**overrides):
    args = {
        "out": torch.zeros(N, CAPACITY, 6, device=DEVICE),
        "count": torch.zeros(N, dtype=torch.int32, device=DEVICE),
        "rows": torch.rand(N, K, 6, device=DEVICE),
        "thresholds": torch.tensor([0.5, 0.7], device=DEVICE),
        "limits": torch.tensor([300], dtype=torch.int32, device=DEVICE),
        "class_mask": None,
    }
    args.update(overrides)
    return args


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"rows": torch.rand(N, K, 6, dtype=torch.float64)}, "rows: dtype"),
        ({"rows": torch.rand(K, 6)}, "rows: shape"),
        ({"out": torch.zeros(N, CAPACITY, 7)}, "out: shape"),
        ({"out": torch.zeros(N + 1, CAPACITY, 6)}, "out: shape"),
        ({"out": torch.zeros(N, CAPACITY, 6, dtype=torch.float16)}, "out: dtype"),
        ({"count": torch.zeros(N, dtype=torch.int64)}, "count: dtype"),
        ({"count": torch.zeros(N + 1, dtype=torch.int32)}, "count: shape"),
        ({"thresholds": torch.tensor([0.5, 0.7], dtype=torch.float64)}, "thresholds: dtype"),
        ({"limits": torch.tensor([300], dtype=torch.int64)}, "limits: dtype"),
        ({"class_mask": torch.ones(NC, dtype=torch.bool)}, "class_mask: dtype"),
        ({"class_mask": torch.ones(NC, 1, dtype=torch.uint8)}, "class_mask: shape"),
        ({"rows": torch.rand(N, 6, K).mT}, "rows: last-dimension stride"),
    ],
)
def test_select_rows_rejects_bad_arguments(override, message):
    override = {k: v.to(DEVICE) for k, v in override.items()}
    args = _select_args(**override)
    with pytest.raises(ValueError, match=message):
        select_rows(**args)


@pytest.mark.parametrize(
    ("rows", "count", "params", "message"),
    [
        (torch.rand(2, 5, 6, dtype=torch.float64), torch.ones(2, dtype=torch.int32), torch.rand(2, 6), "rows: dtype"),
        (torch.rand(5, 6), torch.ones(2, dtype=torch.int32), torch.rand(2, 6), "rows: shape"),
        (torch.rand(2, 5, 6), torch.ones(2, dtype=torch.int64), torch.rand(2, 6), "count: dtype"),
        (torch.rand(2, 5, 6), torch.ones(3, dtype=torch.int32), torch.rand(2, 6), "count: shape"),
        (torch.rand(2, 5, 6), torch.ones(2, dtype=torch.int32), torch.rand(2, 5), "params: shape"),
        (torch.rand(2, 5, 6), torch.ones(2, dtype=torch.int32), torch.rand(2, 6, dtype=torch.float64), "params: dtype"),
        (torch.rand(2, 5, 6), torch.ones(2, dtype=torch.int32), torch.rand(2, 8)[:, :6], "contiguous"),
    ],
)
def test_scale_boxes_rejects_bad_arguments(rows, count, params, message):
    with pytest.raises(ValueError, match=message):
        scale_boxes(*(to_device_keeping_strides(t, DEVICE) for t in (rows, count, params)))
