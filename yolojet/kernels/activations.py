"""Activation codes shared by every fused-epilogue kernel.

Kernels take the code as a ``tl.constexpr`` so each activation compiles to its own specialization with no
runtime branch; launchers translate user-facing names through :data:`ACTIVATIONS`.
"""

import triton
import triton.language as tl

IDENTITY = 0
SILU = 1
RELU = 2
SIGMOID = 3

ACTIVATIONS = {"identity": IDENTITY, "silu": SILU, "relu": RELU, "sigmoid": SIGMOID}

# Triton only lets jitted code read module globals that are constexpr objects.
_SILU = tl.constexpr(SILU)
_RELU = tl.constexpr(RELU)
_SIGMOID = tl.constexpr(SIGMOID)


@triton.jit
def apply_activation(x, ACTIVATION: tl.constexpr):
    """Apply the activation selected by the constexpr code ``ACTIVATION`` to the fp32 tile ``x``."""
    if ACTIVATION == _SILU:
        x = x * tl.sigmoid(x)
    elif ACTIVATION == _RELU:
        x = tl.maximum(x, 0.0)
    elif ACTIVATION == _SIGMOID:
        x = tl.sigmoid(x)
    return x
