"""Pose keypoints back to original-image pixels, in place on the NMS output rows.

For rows (N, K, C) whose keypoints (kpt_shape = (nk, d), d = 2: x, y; d = 3: x, y, visibility) start at
column f, per image n and row k < count[n], keypoint p:
  x = rows[n, k, f + p·d]      ← clamp((x − pad_x) / gain_x, 0, w0)
  y = rows[n, k, f + p·d + 1]  ← clamp((y − pad_y) / gain_y, 0, h0)
visibility and every other column untouched. This is ultralytics' `scale_coords` (ops.py, as PosePredictor's
construct_result calls it: padding off, divided by the gain, clipped to the image) and
yolojet/reference/pose.py `scale_keypoints`, with per-image [pad_x, pad_y, gain_x, gain_y, w0, h0]
(Letterbox.box_params) read from a device tensor, so a captured graph serves any frame size. The division
rounds to nearest, as torch's CPU division does (Triton's `/` is approximate on NVIDIA).

With `boxes=True` the same launch also maps the rows' xyxy boxes (columns 0..3) as boxes.py's
`scale_boxes` does: the pose path maps its boxes and keypoints in one launch.

The OBB counterpart, `scale_rotated_boxes`, lives in kernels/rotated_nms.py with the row layout it rewrites.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from yolojet.kernels.boxes import map_box_columns
from yolojet.kernels.views import check_view

_BLOCK_K = 32


@triton.jit
def _scale_keypoints_kernel(
    rows_ptr,
    sr_n,
    sr_k,
    count_ptr,
    params_ptr,
    K,
    FIRST,
    NK,
    DIM: tl.constexpr,
    BOXES: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    n = tl.program_id(0).to(tl.int64)
    count = tl.minimum(tl.load(count_ptr + n), K)  # a bad count must not write past the rows
    p = params_ptr + n * 6
    pad_x, pad_y = tl.load(p), tl.load(p + 1)
    gain_x, gain_y = tl.load(p + 2), tl.load(p + 3)
    w0, h0 = tl.load(p + 4), tl.load(p + 5)
    kp = tl.arange(0, BLOCK_P)
    for k0 in range(0, count, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        if BOXES:
            map_box_columns(rows_ptr + n * sr_n + k * sr_k, k < count, pad_x, pad_y, gain_x, gain_y, w0, h0)
        ok = (k < count)[:, None] & (kp < NK)[None, :]
        x_ptr = rows_ptr + n * sr_n + k[:, None] * sr_k + FIRST + kp[None, :] * DIM
        for axis in tl.static_range(2):
            value = tl.load(x_ptr + axis, mask=ok, other=0.0)
            if axis == 0:
                value = tl.math.div_rn(value - pad_x, gain_x)
                top = w0
            else:
                value = tl.math.div_rn(value - pad_y, gain_y)
                top = h0
            value = tl.maximum(value, 0.0, propagate_nan=tl.PropagateNan.ALL)  # torch's clamp keeps NaN
            value = tl.minimum(value, top, propagate_nan=tl.PropagateNan.ALL)
            tl.store(x_ptr + axis, value, mask=ok)


def scale_keypoints(
    rows: torch.Tensor,
    count: torch.Tensor,
    params: torch.Tensor,
    *,
    kpt_shape: Sequence[int],
    first_column: int,
    boxes: bool = False,
) -> None:
    """In place, the keypoints of rows[n, :count[n]] from model-input to original-image pixels, clipped to the
    image (see the module docstring); visibility and the other columns are left as they are, except the xyxy
    boxes in columns 0..3 with `boxes=True`, mapped as `scale_boxes` maps them.

    rows: (N, K, C) float32, any row strides, keypoints nk·d columns from `first_column` (6 after
    [x1, y1, x2, y2, conf, cls]); count: (N,) int32, clamped to K; params: (N, 6) float32 [pad_x, pad_y, gain_x,
    gain_y, w0, h0], contiguous; kpt_shape: (nk, d), d 2 or 3. Rows from the count on are left untouched.
    """
    if len(kpt_shape) != 2 or int(kpt_shape[0]) < 1 or int(kpt_shape[1]) not in (2, 3):
        raise ValueError(f"scale_keypoints kpt_shape {tuple(kpt_shape)}: expected (keypoints >= 1, 2 or 3)")
    nk, dim = int(kpt_shape[0]), int(kpt_shape[1])
    check_view("scale_keypoints rows", rows, (None, None, None), torch.float32)
    n, k, c = rows.shape
    if first_column < (4 if boxes else 0) or first_column + nk * dim > c:
        raise ValueError(
            f"scale_keypoints first_column {first_column}: {nk}×{dim} keypoint columns from it do not fit rows of {c}"
        )
    check_view("scale_keypoints count", count, (n,), torch.int32, rows.device)
    check_view("scale_keypoints params", params, (n, 6), torch.float32, rows.device)
    if not params.is_contiguous():
        raise ValueError("scale_keypoints params: expected a contiguous (N, 6) tensor")
    _scale_keypoints_kernel[(n,)](
        rows, rows.stride(0), rows.stride(1), count, params, k, first_column, nk,
        DIM=dim, BOXES=boxes, BLOCK_K=_BLOCK_K, BLOCK_P=triton.next_power_of_2(nk),
    )  # fmt: skip
