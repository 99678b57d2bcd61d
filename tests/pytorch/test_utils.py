"""Shared test helpers: the one tolerance table, SNR, random inputs."""

from __future__ import annotations

import torch

# One tolerance table for the whole suite (DESIGN.md section 5).
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (1e-2, 1e-2),
}


def tolerances(dtype: torch.dtype) -> dict[str, float]:
    rtol, atol = TOLERANCES[dtype]
    return {"rtol": rtol, "atol": atol}


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype | None = None) -> None:
    """Elementwise check at the table's tolerance for ``dtype`` (default ``out.dtype``)."""
    assert out.shape == ref.shape, f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    assert not torch.isnan(out).any(), "output has NaN"
    torch.testing.assert_close(
        out.float().cpu(), ref.float().cpu(), **tolerances(dtype or out.dtype)
    )


def snr_db(ref: torch.Tensor, out: torch.Tensor) -> float:
    ref64, out64 = ref.double(), out.double()
    noise = (ref64 - out64).pow(2).sum()
    return float(10 * torch.log10(ref64.pow(2).sum() / (noise + 1e-30)))


def rand(*shape: int, dtype: torch.dtype, device, requires_grad: bool = False) -> torch.Tensor:
    """Uniform(-1, 1) values, exactly representable in ``dtype`` (never zeros)."""
    t = (torch.rand(*shape, device=device) * 2 - 1).to(dtype)
    return t.requires_grad_(requires_grad)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality of two kernel outputs with the same shape, dtype and strides (asserted):
    fp8 / bf16 data through uint8 views, float32 / uint8 scales with ``torch.equal``."""
    assert a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride()
    if a.dtype in (torch.float32, torch.uint8):
        return torch.equal(a, b)
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def bf16_specials(m: int, n: int, special: bool, device) -> torch.Tensor:
    """``randn * 3`` in bf16, ``[m, n]``; with ``special`` also inf, -inf and NaN entries, an
    all-zero row (9) and column (40) and one 1e38 (indices clamped to the shape; m >= 10)."""
    x = (torch.randn(m, n, device=device) * 3.0).to(torch.bfloat16)
    if special:
        x[1, 3], x[2, 4], x[3, 5] = float("inf"), float("-inf"), float("nan")
        x[9, :] = 0.0
        x[:, min(40, n - 1)] = 0.0
        x[min(20, m - 1), min(50, n - 1)] = 1e38
    return x
