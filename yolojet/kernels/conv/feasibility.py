"""Whether a layer's tensor views allow a kernel mode: TMA loads of a 1x1 conv's operands or of a k x k conv's input
patches (`tma_loadable`, `tma_patch_loadable`), TMA stores of its output (`tma_storable`), loads of each pixel as
8-byte words (`pixels_are_words`), and of a kernel row's neighbouring pixels as one run (`rows_are_dense`). Lowering
asks them before offering or applying a tile; `conv2d_nhwc` asks them again before launching one.
"""

import torch

from yolojet.kernels.conv.config import _HALVES_PER_WORD, _TMA_ALIGN, _TMA_PATCH_STRIDES


def tma_loadable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a conv's operands can be TMA-loaded: the input's and the weight's base addresses and strides
    aligned to 16 bytes, and for a 1x1 weight (loaded as matrices) the input's pixels evenly spaced rows (N, H
    and W strides nested, as in a whole buffer or a channel slice of one)."""
    if x.dim() != 4 or weight.dim() != 4 or x.stride(3) != 1 or not weight.is_contiguous():
        return False
    n, h, w, _ = x.shape
    size = x.element_size()
    if weight.shape[1] == weight.shape[2] == 1:
        nested = (h == 1 or x.stride(1) == w * x.stride(2)) and (n == 1 or x.stride(0) == h * w * x.stride(2))
        strides: tuple[int, ...] = (x.stride(2),)
    else:
        nested, strides = True, x.stride()[:3]
    return (
        nested
        and all((stride * size) % _TMA_ALIGN == 0 for stride in strides)
        and (weight.shape[3] * size) % _TMA_ALIGN == 0
        and x.data_ptr() % _TMA_ALIGN == 0
        and weight.data_ptr() % _TMA_ALIGN == 0
    )


def tma_storable(out: torch.Tensor, patches: bool) -> bool:
    """Whether the tensor memory accelerator can store a conv's output tiles: 16-byte aligned base and strides, unit
    channel stride, a pixel's channels a whole number of 16-byte chunks (TMA stores write whole chunks, so a
    narrower pixel's last chunk would overwrite the channels after it: a concat neighbour's), and, unless the
    tiles are patches of the (N, OH, OW, C_out) view, evenly spaced pixel rows (the output as an (M, C_out)
    matrix, as in a whole buffer or a channel slice of one)."""
    if out.dim() != 4 or out.stride(3) != 1 or (out.shape[3] * out.element_size()) % _TMA_ALIGN:
        return False
    n, h, w, _ = out.shape
    nested = patches or (
        (h == 1 or out.stride(1) == w * out.stride(2)) and (n == 1 or out.stride(0) == h * w * out.stride(2))
    )
    return (
        nested
        and all((stride * out.element_size()) % _TMA_ALIGN == 0 for stride in out.stride()[:3])
        and out.data_ptr() % _TMA_ALIGN == 0
    )


def tma_patch_loadable(x: torch.Tensor, weight: torch.Tensor, stride: tuple[int, int], block_k: int) -> bool:
    """Whether the k x k TMA kernel can load a conv's input patches: TMA-loadable operands (`tma_loadable`) and
    stride 1, or stride 2 on an input of even height and width whose channels are whole BLOCK_K blocks (its view
    pairs rows and pixels, see _conv_tma_kernel)."""
    if stride[0] != stride[1] or stride[0] not in _TMA_PATCH_STRIDES:
        return False
    if stride == (1, 1):
        return tma_loadable(x, weight)
    return (
        x.dim() == 4
        and x.shape[1] % 2 == 0
        and x.shape[2] % 2 == 0
        and x.shape[3] % block_k == 0
        and tma_loadable(x, weight)
    )


def pixels_are_words(x: torch.Tensor) -> bool:
    """Whether an NHWC view's pixels can be loaded as 8-byte words: fp16, at most 8 channels (two words), and every
    pixel starting on an 8-byte boundary (the stem's 3 channels in rows of 4, C3k2's 8-channel slices)."""
    return (
        x.dtype == torch.float16
        and x.dim() == 4
        and x.shape[3] <= 2 * _HALVES_PER_WORD
        and x.stride(3) == 1
        and all(stride % _HALVES_PER_WORD == 0 for stride in x.stride()[:3])
        and x.data_ptr() % 8 == 0
    )


def rows_are_dense(x: torch.Tensor) -> bool:
    """Whether an NHWC view's neighbouring pixels in a row are one contiguous run: its pixel stride is its channel
    count (not a channel slice of a wider map; a spatial crop of one is), so a kernel row's taps can load as one
    vector run."""
    return x.dim() == 4 and x.stride(3) == 1 and x.stride(2) == x.shape[3]
