"""The extra conv with its level's extras decoded as its epilogue (mask coefficients, keypoints), against the conv in
float64 and the reference executor's decode op."""

from __future__ import annotations

import pytest
import torch
from support import exact_head_conv, head_conv_operands

from yolojet.ir import Node
from yolojet.kernels.conv.extras import MOST_EXTRA_CHANNELS, extra_conv_decode
from yolojet.reference.executor import OPS

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NC = 3


def _reference_extras(maps: list[torch.Tensor], attrs: dict, strides: list[int]) -> torch.Tensor:
    """The reference decode's extra rows (N, E, A) of NCHW float64 extra maps, one a level (box maps of raw distances
    and score maps of NC classes beside them)."""
    levels = len(maps)
    boxes = [torch.zeros(m.shape[0], 4, *m.shape[2:], dtype=m.dtype) for m in maps]
    scores = [torch.zeros(m.shape[0], NC, *m.shape[2:], dtype=m.dtype) for m in maps]
    attrs = dict(attrs, nc=NC, reg_max=1, box_format="xywh", levels=levels, strides=strides)
    inputs = [f"{part}{i}" for part in "bse" for i in range(levels)]
    node = Node("decode", "decode", inputs, ["y"], attrs)
    (decoded,) = OPS["decode"](node, [*boxes, *scores, *maps], {})
    return decoded[:, 4 + NC :]


HEADS = {
    "segment": dict(task="segment", extra_channels=32),
    "pose-v8": dict(task="pose", extra_channels=51, kpt_shape=[17, 3], kpt_offset="v8"),
    "pose-26-xy": dict(task="pose", extra_channels=10, kpt_shape=[5, 2], kpt_offset="v26"),
}


@pytest.mark.parametrize(
    ("head", "dtype", "c_in", "c_out", "activation"),
    [
        ("segment", torch.float16, 80, 32, "identity"),  # yolo11n-seg's 32 coefficients from 32 channels, 2 K blocks
        ("pose-v8", torch.float16, 24, 64, "identity"),  # 51 keypoint values in a map widened to 64
        ("pose-v8", torch.float32, 24, 51, "silu"),
        ("pose-26-xy", torch.float16, 16, 16, "identity"),
    ],
)
def test_extra_conv_writes_the_levels_decoded_extras(head, dtype, c_in, c_out, activation):
    """Level 1 of two (anchors after level 0's): its extra rows are the reference decode's extras of act(conv(x)) with
    the map rounded to x's dtype, as the conv's store would round it; a widened map's padding columns, level 0's
    anchors, the box and score rows and the spare image stay as they were (NaN)."""
    attrs = HEADS[head]
    extra = attrs["extra_channels"]
    batch, sizes, strides = 2, [(3, 5), (5, 7)], [8, 16]
    x, w, bias = head_conv_operands((batch, *sizes[1]), c_in, c_out, dtype, c_in + c_out, 2.0, DEVICE)
    anchors = sum(h * w for h, w in sizes)
    out = torch.full((batch + 1, 4 + NC + extra, anchors), float("nan"), device=DEVICE)
    offset = sizes[0][0] * sizes[0][1]
    keypoint_dim = attrs["kpt_shape"][1] if "kpt_shape" in attrs else None
    extra_conv_decode(x, w, bias, out[:batch], first_row=4 + NC, extra=extra, anchor_offset=offset,
                      stride=strides[1], keypoint_dim=keypoint_dim, keypoints_v26=attrs.get("kpt_offset") == "v26",
                      activation=activation)  # fmt: skip

    # The map as the conv would store it.
    stored = exact_head_conv(x, w, bias, activation).to(dtype).double().permute(0, 3, 1, 2)[:, :extra]
    level0 = torch.zeros(batch, extra, *sizes[0], dtype=torch.float64)
    want = _reference_extras([level0, stored], attrs, strides)[..., offset:]
    got = out[:batch, 4 + NC :, offset:].double().cpu()
    # In fp16 a map value summed in another order may land one step from the stored one; keypoints scale it by up to
    # twice the stride.
    step = 2 * strides[1] if keypoint_dim else 1
    torch.testing.assert_close(got, want, rtol=0, atol=(2e-3 if dtype == torch.float16 else 1e-5) * step * 4)
    assert bool(out[:batch, 4 + NC :, :offset].isnan().all()), "level 0's anchors were written"
    assert bool(out[:batch, : 4 + NC].isnan().all()) and bool(out[batch].isnan().all())


def test_extra_conv_refuses_what_does_not_fit():
    x = torch.zeros(1, 2, 2, 16, device=DEVICE)
    out = torch.zeros(1, 4 + NC + 51, 4, device=DEVICE)
    bias = torch.zeros(64, device=DEVICE)
    weight = torch.zeros(64, 1, 1, 16, device=DEVICE)

    def call(**changes):
        args = dict(x=x, weight=weight, bias=bias, out=out, first_row=4 + NC, extra=51, anchor_offset=0, stride=8,
                    keypoint_dim=3)  # fmt: skip
        extra_conv_decode(**(args | changes))

    with pytest.raises(ValueError, match=r"anchors 1\.\.5 past the 4"):
        call(anchor_offset=1)
    with pytest.raises(ValueError, match="51 extras of 32 outputs"):
        call(weight=torch.zeros(32, 1, 1, 16, device=DEVICE), bias=torch.zeros(32, device=DEVICE))
    wide = MOST_EXTRA_CHANNELS + 16
    with pytest.raises(ValueError, match=f"at most {MOST_EXTRA_CHANNELS} outputs"):
        call(weight=torch.zeros(wide, 1, 1, 16, device=DEVICE), bias=torch.zeros(wide, device=DEVICE))
    with pytest.raises(ValueError, match="not whole keypoints of 2"):
        call(keypoint_dim=2)
    with pytest.raises(ValueError, match=r"rows 8\.\.59 are not rows of 58"):
        call(first_row=8)
    with pytest.raises(ValueError, match="row 3 is a box row"):
        call(first_row=3)
    with pytest.raises(ValueError, match="out must be the decode's float32"):
        call(out=out.half())
    with pytest.raises(ValueError, match="weight must be a contiguous"):
        call(weight=torch.zeros(64, 3, 3, 16, device=DEVICE))
