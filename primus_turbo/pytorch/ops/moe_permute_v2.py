"""Autograd of the v2 ``moe_permute`` / ``moe_unpermute`` path (Triton only; chosen by
``PRIMUS_TURBO_MOE_PERMUTE_IMPL``, default v2; ``ops/moe.py`` dispatches here after its checks).

Launches per call (v1 in brackets): permute forward 2 (3, plus a copy of strided top-k ids),
permute backward 1 (1, plus torch ops for the probs gradient), unpermute forward 1 (1 + 4 torch
ops for the unpermuted probs), unpermute backward fill + 2 (6 torch ops + 1), and it reads the
permuted rows again only when the probs need a gradient. With the ``2d`` geometry (default)
the unpermute forward also writes the unfilled inverse map, so the unpermute backward (weighted
or not; the MoE layer's is unweighted, probs go into SwiGLU) is 1 launch in token order
(``dout`` read once); the ``v2`` geometry gathers ``dout[src // K]`` in expert order there.
The ``2d`` permute forward is 3 launches by default (``PRIMUS_TURBO_MOE_PERMUTE_COPY=gather``:
histogram, map-only programs that also write the inverse map, a wide row gather), 2 with
``fused`` (the map programs copy the rows).
"""

from __future__ import annotations

import torch

from primus_turbo.pytorch.kernels.moe.permute_impl import moe_gather_rows
from primus_turbo.pytorch.kernels.moe.permute_v2_impl import (
    moe_permute_fused,
    moe_reduce_v2,
    moe_src_from_rows_v2,
    moe_unpermute_bwd_v2,
)


def _gather_by_rows(v: torch.Tensor, row_map: torch.Tensor) -> torch.Tensor:
    """``v[row_map]`` with 0 for dropped copies (``row_map < 0``), shaped like ``row_map``."""
    flat = row_map.reshape(-1)
    return (v.index_select(0, flat.clamp(min=0)) * (flat >= 0)).view_as(row_map)


class _PermuteV2(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, idx, probs, num_experts, pad_multiple, num_out):
        out, row_map, tpe, disp, flag, pp = moe_permute_fused(
            x, idx, num_experts, pad_multiple, num_out, probs
        )
        ctx.save_for_backward(row_map)
        ctx.x_dtype = x.dtype
        ctx.mark_non_differentiable(row_map, tpe, disp, flag)
        ctx.set_materialize_grads(False)
        return out, row_map, tpe, disp, flag, pp

    @staticmethod
    def backward(ctx, g, _g_map, _g_tpe, _g_disp, _g_flag, g_pp):
        (row_map,) = ctx.saved_tensors
        need_p = ctx.needs_input_grad[2] and g_pp is not None
        dx = dp = None
        if ctx.needs_input_grad[0] and g is not None:
            # gather-sum of the K copies; the probs gradient g_pp[row_map] comes out of the same
            # launch
            dx, dp, _ = moe_reduce_v2(
                g.contiguous(), row_map, g_pp if need_p else None, ctx.x_dtype, False, need_p
            )
        if need_p and dp is None:
            dp = _gather_by_rows(g_pp, row_map)
        return dx, None, (dp if need_p else None), None, None, None


def permute_v2(tokens, idx, probs_tk, num_experts: int, pad_multiple: int, num_out: int):
    """The Triton v2 ``moe_permute`` on checked inputs (``idx`` int32/int64 ``[T, K]``, any
    strides; ``probs_tk`` ``[T, K]`` fp32 or None); the return tuple of ``moe_permute``."""
    out, row_map, tpe, disp, flag, pp = _PermuteV2.apply(
        tokens, idx, probs_tk, num_experts, pad_multiple, num_out
    )
    return out, row_map, tpe, flag, disp, None, (pp if probs_tk is not None else None)


class _UnpermuteV2(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, row_map, w):
        from primus_turbo.triton.moe.permute_v2_plan import geom_choice

        has_w = w is not None
        # 2d geometry: the forward also writes the (unfilled) inverse map for the backward,
        # which then is one launch instead of fill + scatter + kernel
        write_src = geom_choice() != "v2" and ctx.needs_input_grad[0]
        out, up, src = moe_reduce_v2(y, row_map, w, y.dtype, has_w, has_w, write_src)
        ctx.save_for_backward(y, row_map, w, src if write_src else None)
        ctx.set_materialize_grads(False)
        if not has_w:
            ctx.mark_non_differentiable(up)
        return out, up

    @staticmethod
    def backward(ctx, g, g_up):
        from primus_turbo.triton.moe.permute_v2_plan import geom_choice

        y, row_map, w, src = ctx.saved_tensors
        need_w = w is not None and ctx.needs_input_grad[2]
        dy = dw = None
        if g is not None and (ctx.needs_input_grad[0] or need_w):
            g = g.contiguous()
            if w is None and src is None and geom_choice() == "v2":
                src = moe_src_from_rows_v2(row_map, y.shape[0])
                dy = moe_gather_rows(g, src, row_map.shape[1])
            else:  # token order: each dout row read once for its K copies
                dy, dw = moe_unpermute_bwd_v2(g, y, row_map, w, need_w, src)
        if need_w and g_up is not None:
            flat = row_map.reshape(-1)
            add = torch.zeros_like(w).index_add_(
                0, flat.clamp(min=0), g_up.reshape(-1) * (flat >= 0)
            )
            dw = add if dw is None else dw + add
        return (dy if ctx.needs_input_grad[0] else None), None, (dw if need_w else None)


def unpermute_v2(y, row_map, w):
    """``(tokens [T, H], unpermuted_probs [T, K] | None)`` on checked inputs."""
    out, up = _UnpermuteV2.apply(y, row_map, w)
    return out, (up if w is not None else None)
