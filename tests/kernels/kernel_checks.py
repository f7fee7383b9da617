"""The comparison every kernel test makes: relative L2 error against a float64 reference, NaN meaning unwritten."""

import pytest
import torch


def assert_close(out: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    """Fail with the NaN count (outputs are poisoned first, so NaN means never written) or the worst element."""
    nan_count = int(out.isnan().sum())
    if nan_count:
        first = tuple(int(i) for i in out.isnan().nonzero()[0])
        pytest.fail(f"{nan_count} of {out.numel()} outputs are NaN (unwritten?), first at {first}")
    err = (out.double() - ref).abs()
    rel = float(err.norm() / ref.norm())
    if rel > tol:
        worst = tuple(int(i) for i in torch.unravel_index(err.argmax(), err.shape))
        pytest.fail(
            f"relative error {rel:.3g} > {tol:g}; worst at {worst}: got {float(out[worst]):.6g}, "
            f"expected {float(ref[worst]):.6g}"
        )


def to_device_keeping_strides(t: torch.Tensor, device: str | torch.device) -> torch.Tensor:
    """`t` on `device` with its strides kept. `Tensor.to` packs a non-dense view (a slice) into a contiguous
    copy when it changes device, which would hide the very layout a test hands a kernel."""
    moved = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=device)
    return moved.copy_(t)
