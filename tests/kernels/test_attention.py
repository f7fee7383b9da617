"""psa_attention against ultralytics' Attention formula in float64, on odd token counts and channel-slice views."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernel_checks import assert_close

from yolojet.kernels.attention import AttentionTile, attention_candidate_tiles, default_attention_tile, psa_attention

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float16: 1e-2, torch.float32: 1e-4}
SENTINEL = 7.0
F16, F32 = torch.float16, torch.float32


def _reference(q, k, v, num_heads, scale):
    """ultralytics' Attention.forward core, literally, on NCHW float64 copies of the NHWC inputs."""
    b, h, w, _ = q.shape
    t = h * w
    q, k, v = (z.double().permute(0, 3, 1, 2) for z in (q, k, v))
    q = q.reshape(b, num_heads, -1, t)
    k = k.reshape(b, num_heads, -1, t)
    v = v.reshape(b, num_heads, -1, t)
    attn = ((q * scale).transpose(-2, -1) @ k).softmax(-1)
    x = (v @ attn.transpose(-2, -1)).reshape(b, -1, h, w)
    return x.permute(0, 2, 3, 1)


CASES = [  # (batch, h, w, heads, kd, hd, dtype, sliced)
    (1, 4, 4, 2, 8, 16, F16, False),
    (3, 7, 5, 1, 16, 32, F32, True),
    (1, 9, 9, 4, 8, 16, F16, True),  # 81 tokens: two query and two key blocks, the last ones partial
    (2, 5, 7, 2, 12, 20, F32, False),  # kd, hd not powers of two: padded channels masked
    (1, 9, 9, 2, 32, 64, F32, True),
    (3, 3, 5, 2, 32, 64, F16, True),  # 15 tokens: fewer than tl.dot's minimum block of 16
    (1, 20, 20, 2, 32, 64, F16, True),  # a 640-pixel PSA map: 400 tokens
]


@pytest.mark.parametrize(("batch", "h", "w", "heads", "kd", "hd", "dtype", "sliced"), CASES)
def test_attention_matches_ultralytics(batch, h, w, heads, kd, hd, dtype, sliced):
    torch.manual_seed(h * w + kd)
    qc, vc = heads * kd, heads * hd
    # Sliced: q, k, v are consecutive channel slices of one qkv buffer (as the qkv conv writes them, with spare
    # channels before and after) and out a slice of a wider output buffer; else each is its own tensor.
    pad = 3 if sliced else 0
    qkv = torch.randn(batch, h, w, pad + 2 * qc + vc + pad, device=DEVICE).to(dtype)
    q, k, v = qkv[..., pad : pad + qc], qkv[..., pad + qc : pad + 2 * qc], qkv[..., pad + 2 * qc : pad + 2 * qc + vc]
    if not sliced:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out_buf = torch.full((batch, h, w, vc + 2 * pad), SENTINEL, dtype=dtype, device=DEVICE)
    out = out_buf[..., pad : pad + vc]
    out.fill_(float("nan"))
    scale = kd**-0.5

    psa_attention(out, q, k, v, num_heads=heads, scale=scale)

    assert_close(out, _reference(q, k, v, heads, scale), TOLERANCE[dtype])
    out.fill_(SENTINEL)
    assert bool((out_buf == SENTINEL).all()), "psa_attention wrote outside its output slice"


@pytest.mark.parametrize(("h", "w"), [(20, 20), (9, 9), (3, 5)])
def test_every_candidate_tile_matches_ultralytics(h, w):
    """The tiles tuning may pick, cut to the token count: 400 tokens (a 640-pixel PSA map) in 2 to 7 key steps,
    81 with partial blocks, 15 below tl.dot's minimum block."""
    torch.manual_seed(h * w)
    heads, kd, hd = 2, 32, 64
    qkv = torch.randn(2, h, w, heads * (2 * kd + hd), device=DEVICE).to(F16)
    q, k, v = qkv[..., : heads * kd], qkv[..., heads * kd : 2 * heads * kd], qkv[..., 2 * heads * kd :]
    expected = _reference(q, k, v, heads, kd**-0.5)
    tiles = attention_candidate_tiles(h * w)
    assert tiles[0] == default_attention_tile(h * w) and len(tiles) > 1
    for tile in tiles:
        out = torch.full((2, h, w, heads * hd), float("nan"), dtype=F16, device=DEVICE)
        psa_attention(out, q, k, v, num_heads=heads, scale=kd**-0.5, tile=tile)
        assert_close(out, expected, TOLERANCE[F16])


def test_attention_tiles_are_checked():
    assert attention_candidate_tiles(400, F32) == [default_attention_tile(400, F32)]
    assert all(t.block_n <= 16 for t in attention_candidate_tiles(15))
    with pytest.raises(ValueError, match="block_n must be a power of two"):
        AttentionTile(16, 48, 4)
    with pytest.raises(ValueError, match="num_warps"):
        AttentionTile(16, 64, 3)


def _t(c, dtype=F16):
    return torch.randn(2, 3, 5, c, device=DEVICE).to(dtype)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        pytest.param(
            lambda: psa_attention(_t(32), _t(16), _t(16), _t(32), num_heads=3, scale=1.0),
            "num_heads: expected a positive int dividing q's 16",
            id="heads",
        ),
        pytest.param(
            lambda: psa_attention(_t(32), _t(16), _t(8), _t(32), num_heads=2, scale=1.0),
            r"k: shape \(2, 3, 5, 8\), expected \(2, 3, 5, 16\)",
            id="k_shape",
        ),
        pytest.param(
            lambda: psa_attention(_t(30), _t(16), _t(16), _t(30), num_heads=4, scale=1.0),
            "v: 30 channels do not split into num_heads=4",
            id="v_heads",
        ),
        pytest.param(
            lambda: psa_attention(_t(16), _t(16), _t(16), _t(32), num_heads=2, scale=1.0),
            r"out: shape \(2, 3, 5, 16\)",
            id="out_shape",
        ),
        pytest.param(
            lambda: psa_attention(_t(32), _t(16), _t(16, F32), _t(32), num_heads=2, scale=1.0),
            "k: dtype torch.float32",
            id="k_dtype",
        ),
        pytest.param(
            lambda: psa_attention(_t(32, F32), _t(16), _t(16), _t(32), num_heads=2, scale=1.0),
            "out: dtype torch.float32",
            id="out_dtype",
        ),
        pytest.param(
            lambda: psa_attention(_t(32), _t(32)[..., ::2], _t(16), _t(32), num_heads=2, scale=1.0),
            "q: last-dimension stride 2",
            id="q_stride",
        ),
        pytest.param(
            lambda: psa_attention(_t(32), _t(16), _t(16), _t(64)[..., ::2], num_heads=2, scale=1.0),
            "v: last-dimension stride 2",
            id="v_stride",
        ),
    ],
)
def test_launcher_rejects_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()
