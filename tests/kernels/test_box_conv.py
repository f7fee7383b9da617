"""The box conv with its level's box decode as its epilogue, against the conv in float64 and the reference
executor's decode op."""

from __future__ import annotations

import pytest
import torch
from support import exact_head_conv, head_conv_operands

from yolojet.ir import Node
from yolojet.kernels.conv.boxes import MOST_BOX_CHANNELS, box_conv_decode
from yolojet.reference.executor import OPS

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _reference_boxes(maps: list[torch.Tensor], reg_max: int, box_format: str, strides: list[int]) -> torch.Tensor:
    """The reference decode's box rows (N, 4, A) of NCHW float64 box maps, one a level (score maps of one class)."""
    levels = len(maps)
    scores = [torch.zeros(m.shape[0], 1, *m.shape[2:], dtype=m.dtype) for m in maps]
    attrs = dict(task="detect", nc=1, reg_max=reg_max, box_format=box_format, levels=levels, strides=strides)
    node = Node("decode", "decode", [f"b{i}" for i in range(levels)] + [f"s{i}" for i in range(levels)], ["y"], attrs)
    (decoded,) = OPS["decode"](node, [*maps, *scores], {})
    return decoded[:, :4]


@pytest.mark.parametrize(
    ("dtype", "c_in", "reg_max", "box_format", "activation"),
    [
        (torch.float16, 80, 16, "xywh", "identity"),  # yolo11n's 64 -> 64 box conv at P3, two K blocks of 80
        (torch.float32, 24, 16, "xyxy", "silu"),
        (torch.float16, 32, 1, "xyxy", "identity"),  # YOLO26's four raw distances (12 unused columns)
    ],
)
def test_box_conv_writes_the_levels_decoded_boxes(dtype, c_in, reg_max, box_format, activation):
    """Level 1 of two (anchors after level 0's): its box rows are the reference decode's boxes of act(conv(x)) with the
    map rounded to x's dtype, as the conv's store would round it; level 0's anchors, the rows past 4 and the spare
    image stay as they were (NaN)."""
    batch, sizes, strides = 2, [(3, 5), (5, 7)], [8, 16]
    c_out = 4 * reg_max
    # Weights scaled so that each side's distribution is neither flat nor a single bin.
    x, w, bias = head_conv_operands((batch, *sizes[1]), c_in, c_out, dtype, c_in + reg_max, 2.0, DEVICE)
    anchors = sum(h * w for h, w in sizes)
    out = torch.full((batch + 1, 4 + 7, anchors), float("nan"), device=DEVICE)
    offset = sizes[0][0] * sizes[0][1]
    box_conv_decode(x, w, bias, out[:batch], anchor_offset=offset, stride=strides[1], reg_max=reg_max,
                    xywh=box_format == "xywh", activation=activation)  # fmt: skip

    # The map as the conv would store it.
    stored = exact_head_conv(x, w, bias, activation).to(dtype).double().permute(0, 3, 1, 2)
    level0 = torch.zeros(batch, c_out, *sizes[0], dtype=torch.float64)
    want = _reference_boxes([level0, stored], reg_max, box_format, strides)[..., offset:]
    got = out[:batch, :4, offset:].double().cpu()
    # In fp16 a map value summed in another order may land one step from the stored one: ~1e-3 of a bin.
    torch.testing.assert_close(got, want, rtol=0, atol=(0.02 if dtype == torch.float16 else 1e-4) * strides[1])
    assert bool(out[:batch, :4, :offset].isnan().all()), "level 0's anchors were written"
    assert bool(out[:batch, 4:].isnan().all()) and bool(out[batch].isnan().all())


def test_box_conv_refuses_what_does_not_fit():
    x = torch.zeros(1, 2, 2, 16, device=DEVICE)
    out = torch.zeros(1, 84, 4, device=DEVICE)
    bias = torch.zeros(64, device=DEVICE)
    weight = torch.zeros(64, 1, 1, 16, device=DEVICE)

    def call(**changes):
        args = dict(x=x, weight=weight, bias=bias, out=out, anchor_offset=0, stride=8, reg_max=16, xywh=True)
        box_conv_decode(**(args | changes))

    with pytest.raises(ValueError, match=r"anchors 1\.\.5 past the 4"):
        call(anchor_offset=1)
    with pytest.raises(ValueError, match="weight must be a contiguous"):
        call(weight=torch.zeros(64, 3, 3, 16, device=DEVICE))
    with pytest.raises(ValueError, match="reg_max must be 1 or a power of two"):
        call(reg_max=12, weight=torch.zeros(48, 1, 1, 16, device=DEVICE), bias=torch.zeros(48, device=DEVICE))
    wide = 2 * MOST_BOX_CHANNELS // 4
    with pytest.raises(ValueError, match="reg_max must be 1 or a power of two"):
        call(reg_max=wide)
    with pytest.raises(ValueError, match="out must be the decode's float32"):
        call(out=torch.zeros(1, 84, 4, device=DEVICE, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"rows 0\.\.4 are not rows of 3"):
        call(out=torch.zeros(1, 3, 4, device=DEVICE))
