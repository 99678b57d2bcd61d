"""Reference grouped GEMMs (MoE experts), looping over groups in fp32 (or fp64).

These read the group sizes on the host (a device sync): they are references, written for clarity.
"""

from __future__ import annotations

import torch


def group_offsets(group_lens: torch.Tensor) -> torch.Tensor:
    """int64 ``[G + 1]`` exclusive prefix sum ``[0, l0, l0 + l1, ...]``, computed on the device."""
    offs = torch.zeros(group_lens.numel() + 1, dtype=torch.int64, device=group_lens.device)
    torch.cumsum(group_lens.to(torch.int64), 0, out=offs[1:])
    return offs


def grouped_gemm_ref(
    a: torch.Tensor,
    b: torch.Tensor,
    group_lens: torch.Tensor,
    trans_b: bool = False,
    out_dtype: torch.dtype | None = None,
    acc_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``out[rows of g] = a[rows of g] @ op(b[g])``; rows past ``sum(group_lens)`` are zero.

    Args:
        a: ``[M, K]`` packed by group; b: ``[G, K, N]`` (``[G, N, K]`` when ``trans_b``).
        group_lens: ``[G]`` rows per group.
    Returns:
        ``[M, N]`` of ``out_dtype`` (default ``a.dtype``).
    """
    n = b.shape[1] if trans_b else b.shape[2]
    out = torch.zeros((a.shape[0], n), dtype=acc_dtype, device=a.device)
    start = 0
    for g, length in enumerate(group_lens.tolist()):
        w = b[g].to(acc_dtype)
        w = w.t() if trans_b else w
        out[start : start + length] = a[start : start + length].to(acc_dtype) @ w
        start += length
    return out.to(out_dtype or a.dtype)


def grouped_gemm_variable_k_ref(
    x: torch.Tensor,
    y: torch.Tensor,
    group_lens: torch.Tensor,
    out_dtype: torch.dtype | None = None,
    acc_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``out[g] = x[rows of g]^T @ y[rows of g]``: ``x [M, P]``, ``y [M, Q]`` -> ``[G, P, Q]``.

    The weight gradient of :func:`grouped_gemm_ref` (``x = a``, ``y = grad``; or ``x = grad``,
    ``y = a`` for ``trans_b``). Empty groups give zero blocks.
    """
    outs = []
    start = 0
    for length in group_lens.tolist():
        xs = x[start : start + length].to(acc_dtype)
        ys = y[start : start + length].to(acc_dtype)
        outs.append(xs.t() @ ys)
        start += length
    if not outs:
        return torch.empty((0, x.shape[1], y.shape[1]), dtype=out_dtype or x.dtype, device=x.device)
    return torch.stack(outs).to(out_dtype or x.dtype)
