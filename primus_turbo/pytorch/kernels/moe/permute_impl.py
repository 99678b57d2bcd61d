"""Row-movement custom ops behind ``moe_permute`` / ``moe_unpermute``.

Triton on GPU (or under TRITON_INTERPRET=1), plain torch indexing elsewhere. See
``primus_turbo/triton/moe/permute_kernel.py`` for the map conventions. Like the GEMM slice, the
custom ops are what torch.compile sees; eager calls go straight to the implementation (the
custom-op dispatch costs tens of microseconds per call, comparable to a whole permute).
"""

from __future__ import annotations

import torch

from primus_turbo.pytorch.core.backend import eager_or_op
from primus_turbo.pytorch.core.platform import triton_interpret


def _use_triton(x: torch.Tensor) -> bool:
    return x.device.type == "cuda" or triton_interpret()


def _moe_gather_rows_impl(x: torch.Tensor, src_map: torch.Tensor, k: int) -> torch.Tensor:
    """``out[n] = x[src_map[n] // k]``, zero where ``src_map[n] < 0``."""
    if _use_triton(x):
        from primus_turbo.triton.moe.permute_kernel import gather_rows_triton

        return gather_rows_triton(x, src_map, k)
    valid = (src_map >= 0).unsqueeze(1)
    return (x[src_map.clamp(min=0) // max(k, 1)] * valid).to(x.dtype)


_moe_gather_rows_op = torch.library.custom_op(
    "primus_turbo::moe_gather_rows", _moe_gather_rows_impl, mutates_args=()
)


@_moe_gather_rows_op.register_fake
def _gather_fake(x, src_map, k):
    return x.new_empty((src_map.shape[0], x.shape[1]))


def _moe_reduce_rows_impl(
    y: torch.Tensor, row_map: torch.Tensor, w: torch.Tensor | None, out_dtype: torch.dtype
) -> torch.Tensor:
    """``out[t] = sum_k w[row_map[t,k]] * y[row_map[t,k]]`` (fp32 sum; missing copies skipped)."""
    if _use_triton(y):
        from primus_turbo.triton.moe.permute_kernel import reduce_rows_triton

        return reduce_rows_triton(y, row_map, w, out_dtype)
    valid = (row_map >= 0).unsqueeze(-1)
    rows = row_map.clamp(min=0)
    v = y[rows].float()
    if w is not None:
        v = v * w[rows].float().unsqueeze(-1)
    return (v * valid).sum(1).to(out_dtype)


_moe_reduce_rows_op = torch.library.custom_op(
    "primus_turbo::moe_reduce_rows", _moe_reduce_rows_impl, mutates_args=()
)


@_moe_reduce_rows_op.register_fake
def _reduce_fake(y, row_map, w, out_dtype):
    return y.new_empty((row_map.shape[0], y.shape[1]), dtype=out_dtype)


def _moe_reduce_rows_bwd_impl(
    dout: torch.Tensor,
    y: torch.Tensor,
    row_map: torch.Tensor,
    w: torch.Tensor,
    src_map: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dy, dw)`` of ``moe_reduce_rows`` with weights; ``src_map`` (the inverse of
    ``row_map``, -1 for unmapped rows) marks the rows that get zeros."""
    if _use_triton(y):
        from primus_turbo.triton.moe.permute_kernel import reduce_rows_bwd_triton

        return reduce_rows_bwd_triton(dout, y, row_map, w, src_map)
    n = y.shape[0]
    valid = row_map >= 0
    rows = row_map[valid]
    toks = torch.arange(row_map.shape[0], device=y.device).unsqueeze(1).expand_as(row_map)[valid]
    g = dout[toks].float()
    dy = torch.zeros_like(y)
    dy[rows] = (g * w[rows].float().unsqueeze(1)).to(y.dtype)
    dw = torch.zeros((n,), dtype=torch.float32, device=y.device)
    dw[rows] = (g * y[rows].float()).sum(1)
    return dy, dw


_moe_reduce_rows_bwd_op = torch.library.custom_op(
    "primus_turbo::moe_reduce_rows_bwd", _moe_reduce_rows_bwd_impl, mutates_args=()
)


@_moe_reduce_rows_bwd_op.register_fake
def _reduce_bwd_fake(dout, y, row_map, w, src_map):
    return torch.empty_like(y), y.new_empty((y.shape[0],), dtype=torch.float32)


def _moe_route_maps_impl(
    idx: torch.Tensor,
    num_experts: int,
    pad_multiple: int,
    num_out: int,
    probs: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Permute maps from top-k ids in two Triton launches (see ``route_map_kernel.py``):
    ``(row_map [T,K], src_map [N], tokens_per_expert [E], num_dispatched 0-d, overflow 0-d
    bool, permuted_probs [N] (empty without probs))``. Triton only (GPU or interpreter)."""
    from primus_turbo.triton.moe.route_map_kernel import build_route_maps

    row_map, src_map, tpe, disp, flag, pprobs = build_route_maps(
        idx, num_experts, pad_multiple, num_out, probs
    )
    if pprobs is None:
        pprobs = torch.empty((0,), dtype=torch.float32, device=idx.device)
    return row_map, src_map, tpe, disp, flag, pprobs


_moe_route_maps_op = torch.library.custom_op(
    "primus_turbo::moe_route_maps", _moe_route_maps_impl, mutates_args=()
)


@_moe_route_maps_op.register_fake
def _route_maps_fake(idx, num_experts, pad_multiple, num_out, probs):
    i64 = {"dtype": torch.int64, "device": idx.device}
    n_probs = num_out if probs is not None else 0
    return (
        torch.empty(idx.shape, **i64),
        torch.empty((num_out,), **i64),
        torch.empty((num_experts,), **i64),
        torch.empty((), **i64),
        torch.empty((), dtype=torch.bool, device=idx.device),
        torch.empty((n_probs,), dtype=torch.float32, device=idx.device),
    )


moe_gather_rows = eager_or_op(_moe_gather_rows_impl, _moe_gather_rows_op)
moe_reduce_rows = eager_or_op(_moe_reduce_rows_impl, _moe_reduce_rows_op)
moe_reduce_rows_bwd = eager_or_op(_moe_reduce_rows_bwd_impl, _moe_reduce_rows_bwd_op)
moe_route_maps = eager_or_op(_moe_route_maps_impl, _moe_route_maps_op)
