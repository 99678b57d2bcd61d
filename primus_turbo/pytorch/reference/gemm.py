"""Reference dense GEMM: ``op(a) @ op(b)`` accumulated in fp32 (or fp64)."""

from __future__ import annotations

import torch


def gemm_ref(
    a: torch.Tensor,
    b: torch.Tensor,
    trans_a: bool = False,
    trans_b: bool = False,
    out_dtype: torch.dtype | None = None,
    acc_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``[M, N] = op(a) [M, K] @ op(b) [K, N]``, computed in ``acc_dtype``, cast to ``out_dtype``.

    ``op`` transposes its operand when the matching ``trans_*`` flag is set.
    """
    x = (a.t() if trans_a else a).to(acc_dtype)
    y = (b.t() if trans_b else b).to(acc_dtype)
    return (x @ y).to(out_dtype or a.dtype)
