"""scale_keypoints (pose keypoints back to original pixels, in place) against the torch pose post-processing
(yolojet/reference/pose.py `scale_keypoints`) and ultralytics' own `scale_coords`.

Rows start with sentinels any write would change: rows below the count must equal the reference in the keypoint
x, y columns and be bit-identical elsewhere (boxes, visibility, trailing columns); rows from the count on must be
untouched.
"""

from __future__ import annotations

import pytest
import torch
from kernel_checks import to_device_keeping_strides
from ultralytics.utils.ops import scale_coords as ultralytics_scale_coords

from yolojet.geometry import Letterbox
from yolojet.kernels.boxes import scale_boxes
from yolojet.kernels.keypoints import scale_keypoints
from yolojet.reference import pose

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
K = 300
# Masked-off lanes may divide 0 by 0 under the interpreter; the result is never used.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

# (original h, w), (model input h, w): square and rectangular inputs, portrait/landscape frames, up- and downscaling
SHAPES = [
    [(1080, 810), (640, 640)],
    [(720, 1280), (640, 640)],
    [(480, 640), (384, 640)],
    [(100, 37), (320, 256)],
    [(333, 333), (640, 480)],
    [(1920, 1080), (640, 384)],
]
COUNTS = [0, 7, 200, 33, 300, 1]  # empty, short, and counts crossing the kernel's 32-row blocks


def pose_rows(kpt_shape: tuple[int, int], trailing: int, seed: int) -> tuple[torch.Tensor, list[Letterbox]]:
    """(len(SHAPES), K, 6 + nk·d + trailing) rows: boxes, conf, cls, keypoints anywhere over the model input and
    40 px beyond it (into the padding and past the edges, so the clip is exercised), visibility, extra columns."""
    g = torch.Generator().manual_seed(seed)
    nk, dim = kpt_shape
    rows = torch.randn(len(SHAPES), K, 6 + nk * dim + trailing, generator=g) * 100
    for i, (_, (h, w)) in enumerate(SHAPES):
        kpts = rows[i, :, 6 : 6 + nk * dim].view(K, nk, dim)
        kpts[..., 0] = torch.rand(K, nk, generator=g) * (w + 80) - 40
        kpts[..., 1] = torch.rand(K, nk, generator=g) * (h + 80) - 40
        if dim == 3:
            kpts[..., 2] = torch.rand(K, nk, generator=g)
    return rows, [Letterbox.fit(orig, target) for orig, target in SHAPES]


def scaled(rows: torch.Tensor, boxes: list[Letterbox], kpt_shape, first_column: int) -> torch.Tensor:
    """Our kernel on a copy of `rows` on DEVICE, back on the CPU."""
    ours = rows.to(DEVICE, copy=True)
    params = torch.tensor([b.box_params() for b in boxes], dtype=torch.float32, device=DEVICE)
    count = torch.tensor(COUNTS, dtype=torch.int32, device=DEVICE)
    scale_keypoints(ours, count, params, kpt_shape=kpt_shape, first_column=first_column)
    return ours.cpu()


@pytest.mark.parametrize("kpt_shape", [(17, 3), (5, 2)], ids=["17x3", "5x2"])
@pytest.mark.parametrize("trailing", [0, 3], ids=["rows-end-with-keypoints", "trailing-columns"])
def test_scale_keypoints_matches_pose_scale_keypoints(kpt_shape, trailing):
    nk, dim = kpt_shape
    rows, boxes = pose_rows(kpt_shape, trailing, seed=nk * dim + trailing)
    ours = scaled(rows, boxes, kpt_shape, 6)
    clipped = 0
    for i, ((orig, target), k, box) in enumerate(zip(SHAPES, COUNTS, boxes, strict=True)):
        kpts = rows[i, :k, 6 : 6 + nk * dim].reshape(k, nk, dim)
        expected = pose.scale_keypoints(kpts.clone(), box)
        got = ours[i, :k, 6 : 6 + nk * dim].reshape(k, nk, dim)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-4, msg=f"{orig} in {target}")
        theirs = ultralytics_scale_coords(target, kpts[..., :2].clone(), orig)
        torch.testing.assert_close(got[..., :2], theirs, rtol=1e-6, atol=1e-4, msg=f"ultralytics {orig} {target}")
        if dim == 3:
            assert torch.equal(got[..., 2], kpts[..., 2]), "visibility changed"
        assert torch.equal(ours[i, :k, :6], rows[i, :k, :6]), "box columns changed"
        assert torch.equal(ours[i, :k, 6 + nk * dim :], rows[i, :k, 6 + nk * dim :]), "trailing columns changed"
        assert torch.equal(ours[i, k:], rows[i, k:]), f"{orig}: rows past the count changed"
        h0, w0 = orig
        clipped += int((got[..., 0] == 0).sum() + (got[..., 0] == w0).sum())
        clipped += int((got[..., 1] == 0).sum() + (got[..., 1] == h0).sum())
    assert clipped > 20, "the keypoints must reach past the image edges for the clip to be exercised"


def test_scale_keypoints_with_boxes_equals_scale_boxes_then_scale_keypoints():
    """The pose path's one launch gives bit for bit what scale_boxes followed by scale_keypoints gives."""
    kpt_shape = (17, 3)
    rows, boxes = pose_rows(kpt_shape, 2, seed=5)
    rows[..., :4] = torch.rand(rows.shape[0], K, 4) * 800 - 80  # boxes reaching past the edges: the clip counts
    params = torch.tensor([b.box_params() for b in boxes], dtype=torch.float32, device=DEVICE)
    count = torch.tensor(COUNTS, dtype=torch.int32, device=DEVICE)
    fused, separate = rows.to(DEVICE, copy=True), rows.to(DEVICE, copy=True)
    scale_keypoints(fused, count, params, kpt_shape=kpt_shape, first_column=6, boxes=True)
    scale_boxes(separate, count, params)
    scale_keypoints(separate, count, params, kpt_shape=kpt_shape, first_column=6)
    assert torch.equal(fused, separate)
    assert not torch.equal(fused[..., :4], rows.to(DEVICE)[..., :4]), "no box was mapped"


def test_scale_keypoints_other_first_column_and_padded_rows():
    """Keypoints from column 8 of a column-slice view (row stride wider than the row): only they change."""
    kpt_shape = (5, 3)
    rows, boxes = pose_rows(kpt_shape, 0, seed=21)
    wide = torch.cat([torch.randn(len(SHAPES), K, 3), rows, torch.randn(len(SHAPES), K, 2)], 2)
    view = wide.to(DEVICE, copy=True)[..., 1:-1]  # keypoints at view columns 2 + 6 = 8 … 22
    params = torch.tensor([b.box_params() for b in boxes], dtype=torch.float32, device=DEVICE)
    count = torch.tensor(COUNTS, dtype=torch.int32, device=DEVICE)
    scale_keypoints(view, count, params, kpt_shape=kpt_shape, first_column=8)
    ours = view.cpu()
    expected_full = wide[..., 1:-1].clone()
    for i, (k, box) in enumerate(zip(COUNTS, boxes, strict=True)):
        kpts = expected_full[i, :k, 8:23].reshape(k, 5, 3)
        expected_full[i, :k, 8:23] = pose.scale_keypoints(kpts.clone(), box).reshape(k, 15)
    torch.testing.assert_close(ours, expected_full, rtol=1e-6, atol=1e-4)
    untouched = torch.ones(ours.shape[-1], dtype=torch.bool)
    untouched[8:23:3] = untouched[9:23:3] = False
    assert torch.equal(ours[..., untouched], expected_full[..., untouched])


def test_scale_keypoints_without_padding_is_a_plain_rescale():
    """Same aspect ratio, no padding, nothing outside: x · 2, an independent closed form."""
    g = torch.Generator().manual_seed(8)
    box = Letterbox.fit((960, 1280), (480, 640))
    assert (box.pad_top, box.pad_left) == (0, 0)
    rows = torch.rand(1, 40, 6 + 34, generator=g) * torch.tensor([640.0, 480.0] * 20)
    expected = rows.clone()
    expected[0, :, 6:] *= 2
    ours = rows.to(DEVICE, copy=True)
    params = torch.tensor([box.box_params()], device=DEVICE)
    scale_keypoints(
        ours, torch.tensor([40], dtype=torch.int32, device=DEVICE), params, kpt_shape=(17, 2), first_column=6
    )
    torch.testing.assert_close(ours.cpu(), expected, rtol=1e-6, atol=1e-4)


def test_scale_keypoints_params_change_between_calls():
    """Same buffers, new letterbox params and counts written in place: what a captured graph does per frame."""
    kpt_shape = (17, 3)
    rows, boxes = pose_rows(kpt_shape, 0, seed=4)
    buf = rows.to(DEVICE, copy=True)
    params = torch.zeros(len(SHAPES), 6, device=DEVICE)
    count = torch.zeros(len(SHAPES), dtype=torch.int32, device=DEVICE)
    for shift in (0, 2):
        frames = boxes[shift:] + boxes[:shift]
        counts = COUNTS[shift:] + COUNTS[:shift]
        buf.copy_(rows.to(DEVICE))
        params.copy_(torch.tensor([b.box_params() for b in frames]))
        count.copy_(torch.tensor(counts))
        scale_keypoints(buf, count, params, kpt_shape=kpt_shape, first_column=6)
        ours = buf.cpu()
        for i, (k, box) in enumerate(zip(counts, frames, strict=True)):
            expected = pose.scale_keypoints(rows[i, :k, 6:].reshape(k, 17, 3).clone(), box).reshape(k, 51)
            torch.testing.assert_close(ours[i, :k, 6:], expected, rtol=1e-6, atol=1e-4)
            assert torch.equal(ours[i, k:], rows[i, k:])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"rows": torch.rand(2, 5, 57, dtype=torch.float64)}, "rows: dtype"),
        ({"rows": torch.rand(5, 57)}, "rows: shape"),
        ({"rows": torch.rand(2, 57, 5).mT}, "rows: last-dimension stride"),
        ({"count": torch.ones(2, dtype=torch.int64)}, "count: dtype"),
        ({"count": torch.ones(3, dtype=torch.int32)}, "count: shape"),
        ({"params": torch.rand(2, 5)}, "params: shape"),
        ({"params": torch.rand(2, 6, dtype=torch.float64)}, "params: dtype"),
        ({"params": torch.rand(2, 8)[:, :6]}, "contiguous"),
        ({"kpt_shape": (17, 4)}, "kpt_shape"),
        ({"kpt_shape": (0, 3)}, "kpt_shape"),
        ({"kpt_shape": (17,)}, "kpt_shape"),
        ({"kpt_shape": (17, 3), "first_column": 7}, "first_column"),
        ({"first_column": -1}, "first_column"),
    ],
)
def test_scale_keypoints_rejects_bad_arguments(override, message):
    args = {
        "rows": torch.rand(2, 5, 57),
        "count": torch.ones(2, dtype=torch.int32),
        "params": torch.rand(2, 6),
        "kpt_shape": (17, 3),
        "first_column": 6,
    }
    args.update(override)
    args = {k: to_device_keeping_strides(v, DEVICE) if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    rows, count, params = args.pop("rows"), args.pop("count"), args.pop("params")
    with pytest.raises(ValueError, match=message):
        scale_keypoints(rows, count, params, **args)
