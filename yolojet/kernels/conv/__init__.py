"""NHWC convolution as an implicit GEMM on tensor cores, with bias, activation and residual fused.

The GEMM view: M = N·OH·OW output pixels, N_gemm = C_out, K = kh·kw·C_in ordered (ky, kx, ci) so that one
tap's K slice is a contiguous channel run in both the activation and the packed weight. Activations may be
channel slices of wider NHWC buffers (arbitrary N/H/W strides, unit channel stride), which is how concat and
split cost nothing in the engine.

The modules, by what they hold:

- `config`: `ConvConfig` (a `ConvKind`, the kernel it launches, plus that kind's modifiers), the candidate tiles
  the autotuner times (`conv_candidate_configs`, `two_input_candidates`), the untimed `default_config`
  (`untimed_gpu_config` on a GPU, the interpreter's own largest tile under it) and `candidate_set_id`, with the
  tables and limits behind them.
- `feasibility`: whether a layer's views allow TMA loads and stores, whole-pixel word loads and tap-row loads
  (`tma_loadable`, `tma_patch_loadable`, `tma_storable`, `pixels_are_words`, `rows_are_dense`).
- `epilogue`: the @triton.jit helpers several kernels call: output-pixel indices, the grouped tile order, and the
  bias + activation + residual epilogue with its stores.
- `gemm`: `_conv2d_nhwc_kernel`, the implicit GEMM gathering its operands (1x1, two inputs, packed taps or tap
  rows, k x k, split-K).
- `direct`: `_conv2d_direct_kernel`, FMA outer products for a handful of input channels.
- `tma`: `_conv1x1_tma_kernel` and `_conv_tma_kernel`, whose operands the tensor memory accelerator loads.
- `dispatch`: `conv2d_nhwc`, which checks its arguments and hands them to the launcher of its config's kind.
- `scores`: `score_conv_best_class`, a head's last class-score conv with NMS's best-class pass as its epilogue.
- `boxes`: `box_conv_decode`, a head's last box conv with its level's box decode as its epilogue.
- `extras`: `extra_conv_decode`, a segment or pose head's last extra conv with its level's extras decoded as its
  epilogue.

The public names are re-exported here. A name is looked up in the module that uses it, so a test replacing one
patches that module: the kernels and `pixels_are_words` as `conv2d_nhwc` sees them in `dispatch`, the candidate
tables in `config`.
"""

from yolojet.kernels.conv.boxes import MOST_BOX_CHANNELS, box_conv_decode
from yolojet.kernels.conv.config import (
    ConvConfig,
    ConvKind,
    candidate_set_id,
    conv_candidate_configs,
    default_config,
    two_input_candidates,
    untimed_gpu_config,
)
from yolojet.kernels.conv.dispatch import conv2d_nhwc
from yolojet.kernels.conv.extras import MOST_EXTRA_CHANNELS, extra_conv_decode
from yolojet.kernels.conv.feasibility import (
    pixels_are_words,
    rows_are_dense,
    tma_loadable,
    tma_patch_loadable,
    tma_storable,
)
from yolojet.kernels.conv.scores import MOST_SCORE_CHANNELS, score_conv_best_class

__all__ = [
    "MOST_BOX_CHANNELS",
    "MOST_EXTRA_CHANNELS",
    "MOST_SCORE_CHANNELS",
    "ConvConfig",
    "ConvKind",
    "box_conv_decode",
    "candidate_set_id",
    "conv2d_nhwc",
    "conv_candidate_configs",
    "default_config",
    "extra_conv_decode",
    "pixels_are_words",
    "rows_are_dense",
    "score_conv_best_class",
    "tma_loadable",
    "tma_patch_loadable",
    "tma_storable",
    "two_input_candidates",
    "untimed_gpu_config",
]
