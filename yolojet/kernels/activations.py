"""Activation codes shared by every fused-epilogue kernel.

Kernels take the code as a ``tl.constexpr`` so each activation compiles to its own specialization with no
runtime branch; launchers translate user-facing names through :data:`ACTIVATIONS`.
"""

import triton
import triton.language as tl

from yolojet.options import interpreting

IDENTITY = 0
SILU = 1
RELU = 2
SIGMOID = 3

ACTIVATIONS = {"identity": IDENTITY, "silu": SILU, "relu": RELU, "sigmoid": SIGMOID}

# Triton only lets jitted code read module globals that are constexpr objects.
_SILU = tl.constexpr(SILU)
_RELU = tl.constexpr(RELU)
_SIGMOID = tl.constexpr(SIGMOID)
# Whether kernels compile for a GPU: Triton's interpreter (TRITON_INTERPRET=1, which Triton itself reads once, when
# a kernel is decorated) runs no inline assembly, so it divides plainly in the logistic below.
_COMPILED = tl.constexpr(not interpreting())
_MINUS_LOG2_E = tl.constexpr(-1.4426950408889634)


@triton.jit
def logistic(x):
    """1 / (1 + e^-x) in fp32, as 2^(-x·log2 e) and, compiled, the flush-to-zero reciprocal approximation (within 1
    ulp; a denominator past 2^126 gives 0, the limit): 4 instructions an element, where tl.sigmoid's `div.full.f32`
    with its range fix-ups made a dozen, in epilogues where the activation is much of a thread's work (and in the head
    decode's 80 class scores an anchor)."""
    denominator = 1.0 + tl.exp2(x * _MINUS_LOG2_E)
    if _COMPILED:
        return tl.inline_asm_elementwise(
            "rcp.approx.ftz.f32 $0, $1;", "=r,r", [denominator], dtype=tl.float32, is_pure=True, pack=1
        )
    return 1.0 / denominator


@triton.jit
def apply_activation(x, ACTIVATION: tl.constexpr):
    """Apply the activation selected by the constexpr code ``ACTIVATION`` to the fp32 tile ``x``."""
    if ACTIVATION == _SILU:
        x = x * logistic(x)
    elif ACTIVATION == _RELU:
        x = tl.maximum(x, 0.0)
    elif ACTIVATION == _SIGMOID:
        x = logistic(x)
    return x
