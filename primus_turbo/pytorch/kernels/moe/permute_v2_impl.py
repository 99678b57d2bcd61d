"""Custom ops of the v2 permute path (``primus_turbo/triton/moe/permute_v2_kernel.py``).

Triton only (GPU, or the CPU interpreter); ``ops/moe.py`` falls back to v1's torch path
elsewhere. As in ``permute_impl.py``, eager calls skip the custom-op dispatch; torch.compile
sees the ops. Optional outputs are empty tensors (custom ops cannot return None).
"""

from __future__ import annotations

import os

import torch

from primus_turbo.pytorch.core.backend import eager_or_op

IMPL_ENV = "PRIMUS_TURBO_MOE_PERMUTE_IMPL"
IMPLS = ("v1", "v2")


def permute_impl_choice() -> str:
    """``v2`` (fused map building + copy, fewer launches) unless
    ``PRIMUS_TURBO_MOE_PERMUTE_IMPL=v1``; read per call, so an A/B needs no reload."""
    v = os.environ.get(IMPL_ENV, "v2").strip().lower() or "v2"
    if v not in IMPLS:
        raise ValueError(f"primus_turbo: {IMPL_ENV} expected one of {IMPLS}, got {v!r}")
    return v


def _empty_f32(dev) -> torch.Tensor:
    return torch.empty((0,), dtype=torch.float32, device=dev)


def _permute_fused_impl(
    x: torch.Tensor,
    idx: torch.Tensor,
    num_experts: int,
    pad_multiple: int,
    num_out: int,
    probs: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(permuted [N, H], row_map [T, K], tokens_per_expert [E], num_dispatched 0-d,
    overflow 0-d bool, permuted_probs [N] (empty without probs))`` in two launches."""
    from primus_turbo.triton.moe.permute_v2_kernel import permute_fused_triton

    out, row_map, tpe, disp, flag, pp = permute_fused_triton(
        x, idx, num_experts, pad_multiple, num_out, probs
    )
    return out, row_map, tpe, disp, flag, (pp if pp is not None else _empty_f32(x.device))


_permute_fused_op = torch.library.custom_op(
    "primus_turbo::moe_permute_fused", _permute_fused_impl, mutates_args=()
)


@_permute_fused_op.register_fake
def _permute_fused_fake(x, idx, num_experts, pad_multiple, num_out, probs):
    i64 = {"dtype": torch.int64, "device": x.device}
    return (
        x.new_empty((num_out, x.shape[1])),
        torch.empty(idx.shape, **i64),
        torch.empty((num_experts,), **i64),
        torch.empty((), **i64),
        torch.empty((), dtype=torch.bool, device=x.device),
        torch.empty((num_out if probs is not None else 0,), dtype=torch.float32, device=x.device),
    )


def _reduce_v2_impl(
    y: torch.Tensor,
    row_map: torch.Tensor,
    w: torch.Tensor | None,
    out_dtype: torch.dtype,
    mul_w: bool,
    write_p: bool,
    write_src: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out [T, H], p_out [T, K] (empty unless write_p), src [N] (empty unless write_src))``:
    ``out[t] = sum_k (w or 1) * y[row_map[t, k]]``, ``p_out[t, k] = w[row_map[t, k]]`` (0 for
    dropped copies), ``src[row_map[t, k]] = t * K + k`` (other rows unwritten)."""
    from primus_turbo.triton.moe.permute_v2_kernel import reduce_v2_triton

    out, p, src = reduce_v2_triton(y, row_map, w, out_dtype, mul_w, write_p, write_src)
    empty_i64 = torch.empty((0,), dtype=torch.int64, device=y.device)
    return (
        out,
        (p if p is not None else _empty_f32(y.device)),
        (src if src is not None else empty_i64),
    )


_reduce_v2_op = torch.library.custom_op(
    "primus_turbo::moe_reduce_v2", _reduce_v2_impl, mutates_args=()
)


@_reduce_v2_op.register_fake
def _reduce_v2_fake(y, row_map, w, out_dtype, mul_w, write_p, write_src=False):
    p_shape = tuple(row_map.shape) if write_p else (0,)
    return (
        y.new_empty((row_map.shape[0], y.shape[1]), dtype=out_dtype),
        y.new_empty(p_shape, dtype=torch.float32),
        y.new_empty((y.shape[0] if write_src else 0,), dtype=torch.int64),
    )


def _unpermute_bwd_v2_impl(
    dout: torch.Tensor,
    y: torch.Tensor,
    row_map: torch.Tensor,
    w: torch.Tensor | None,
    need_dw: bool,
    src: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dy [N, H], dw [N] fp32 (empty unless need_dw and w))`` of the unpermute (weighted
    by ``w`` or not); ``src``: the forward's unfilled inverse map (``moe_reduce_v2`` with
    ``write_src``), else it is built here."""
    from primus_turbo.triton.moe.permute_v2_kernel import unpermute_bwd_triton

    dy, dw = unpermute_bwd_triton(dout, y, row_map, w, need_dw, src)
    return dy, (dw if dw is not None else _empty_f32(y.device))


_unpermute_bwd_v2_op = torch.library.custom_op(
    "primus_turbo::moe_unpermute_bwd_v2", _unpermute_bwd_v2_impl, mutates_args=()
)


@_unpermute_bwd_v2_op.register_fake
def _unpermute_bwd_v2_fake(dout, y, row_map, w, need_dw, src=None):
    n_dw = y.shape[0] if need_dw and w is not None else 0
    return torch.empty_like(y), y.new_empty((n_dw,), dtype=torch.float32)


def _src_from_rows_v2_impl(row_map: torch.Tensor, n: int) -> torch.Tensor:
    """``src [n]`` int64: the copy ``t * K + k`` landing in each row, -1 for none."""
    from primus_turbo.triton.moe.permute_v2_kernel import src_from_rows_triton

    return src_from_rows_triton(row_map, n)


_src_from_rows_v2_op = torch.library.custom_op(
    "primus_turbo::moe_src_from_rows_v2", _src_from_rows_v2_impl, mutates_args=()
)


@_src_from_rows_v2_op.register_fake
def _src_from_rows_v2_fake(row_map, n):
    return row_map.new_empty((n,))


moe_permute_fused = eager_or_op(_permute_fused_impl, _permute_fused_op)
moe_reduce_v2 = eager_or_op(_reduce_v2_impl, _reduce_v2_op)
moe_unpermute_bwd_v2 = eager_or_op(_unpermute_bwd_v2_impl, _unpermute_bwd_v2_op)
moe_src_from_rows_v2 = eager_or_op(_src_from_rows_v2_impl, _src_from_rows_v2_op)
