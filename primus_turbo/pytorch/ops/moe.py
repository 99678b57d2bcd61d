"""MoE routing ops with autograd: the fused top-k router, ``moe_permute`` and ``moe_unpermute``.

Row maps are built on the device from the top-k indices (no host synchronisation unless a padded
permute is asked for without ``num_permuted_tokens``): with Triton (GPU, or the CPU interpreter)
by a two-launch counting sort that also gathers the permuted probs
(``primus_turbo/triton/moe/route_map_kernel.py``), elsewhere with torch sorts and scatters.
Data movement runs in the Triton row kernels of ``primus_turbo/triton/moe/permute_kernel.py``. The
permutation is stable (within an expert, tokens keep their order, then the copy order) and no
kernel uses atomics, so permute, unpermute and their gradients are bitwise deterministic. The
router is one fused Triton kernel per direction (``primus_turbo/triton/moe/router_kernel.py``;
``PRIMUS_TURBO_MOE_ROUTER=torch``, CPU without the interpreter, more than 4096 experts, or a
top-k / group count above 32: a composition of torch ops with stable sorts); both are
deterministic.
"""

from __future__ import annotations

import torch

from primus_turbo.pytorch.core.checks import check, check_same_device, check_tensor, fail
from primus_turbo.pytorch.kernels.moe import permute_impl as _impl
from primus_turbo.pytorch.kernels.moe.permute_impl import (
    moe_gather_rows,
    moe_reduce_rows,
    moe_reduce_rows_bwd,
    moe_route_maps,
)
from primus_turbo.pytorch.kernels.moe.permute_v2_impl import permute_impl_choice
from primus_turbo.pytorch.kernels.moe.router_impl import (
    fused_router_usable,
    moe_router_bwd,
    moe_router_fwd,
)
from primus_turbo.pytorch.ops.moe_permute_v2 import permute_v2, unpermute_v2

__all__ = [
    "fused_group_topk_routing_with_aux_score",
    "moe_router_topk",
    "moe_permute",
    "moe_unpermute",
]

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


# ---- router ------------------------------------------------------------------------------------


def _check_router(op, logits, topk, groups, selected_groups, score_function):
    check_tensor(op, "logits", logits, ndim=2, dtypes=FLOAT_DTYPES)
    e = logits.shape[1]
    check(
        score_function in ("softmax", "sigmoid"),
        op,
        "score_function",
        "'softmax' or 'sigmoid'",
        repr(score_function),
    )
    check(
        groups >= 1 and (groups & (groups - 1)) == 0 and e % groups == 0,
        op,
        "groups",
        f"a power of two dividing the expert count {e}",
        groups,
    )
    check(
        1 <= selected_groups <= groups, op, "selected_groups", f"in [1, {groups}]", selected_groups
    )
    check(1 <= topk <= e, op, "topk", f"in [1, {e}]", topk)
    if groups > 1:
        per = e // groups
        check(
            topk % selected_groups == 0
            and topk // selected_groups <= per
            and topk <= selected_groups * per,
            op,
            "topk",
            f"a multiple of selected_groups={selected_groups} with topk/selected_groups <= "
            f"{per} experts per group",
            topk,
        )


def moe_router_topk(
    logits: torch.Tensor,
    topk: int,
    groups: int = 1,
    selected_groups: int = 1,
    score_function: str = "sigmoid",
    scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k routing, compact: ``(aux_scores [T,E] fp32, probs [T,K] fp32, idx [T,K] int64)``.

    Semantics are those of ``reference.moe.router_ref``: softmax or sigmoid scores (fp32),
    optional group-limited selection (DeepSeek-V3: group score = sum of the top
    ``topk // selected_groups`` scores of the group), the lowest expert index wins ties,
    normalisation of the selected scores by their sum (+1e-20) when ``topk > 1``, then
    ``* scaling_factor``. Differentiable w.r.t. ``logits`` through ``probs`` and ``aux_scores``.
    """
    op = "moe_router_topk"
    _check_router(op, logits, topk, groups, selected_groups, score_function)
    if fused_router_usable(logits, topk, groups):
        x = logits if logits.stride(-1) == 1 else logits.contiguous()
        return _FusedRouter.apply(x, topk, groups, selected_groups,
                                  score_function == "sigmoid", float(scaling_factor))  # fmt: skip
    return _router_torch(logits, topk, groups, selected_groups, score_function, scaling_factor)


class _FusedRouter(torch.autograd.Function):
    """``moe_router_topk`` through the fused Triton kernels (``triton/moe/router_kernel.py``):
    one launch forward, one backward; ``idx`` has no gradient."""

    @staticmethod
    def forward(ctx, logits, topk, groups, selected, sigmoid, scale):
        aux, probs, idx, ssum = moe_router_fwd(logits, topk, groups, selected, sigmoid, scale)
        ctx.save_for_backward(logits, idx, probs, ssum)
        ctx.args = (groups, sigmoid, scale)
        ctx.mark_non_differentiable(idx)
        return aux, probs, idx

    @staticmethod
    def backward(ctx, daux, dprobs, _didx):
        logits, idx, probs, ssum = ctx.saved_tensors
        groups, sigmoid, scale = ctx.args
        daux = None if daux is None else daux.float().contiguous()
        dprobs = None if dprobs is None else dprobs.float().contiguous()
        dl = moe_router_bwd(logits, idx, probs, ssum, dprobs, daux, groups, sigmoid, scale)
        return dl, None, None, None, None, None


def _router_torch(logits, topk, groups, selected_groups, score_function, scaling_factor):
    """The router as a composition of torch ops: where ``fused_router_usable`` says no (CPU
    without the interpreter, more than ``MAX_EXPERTS`` experts, a top-k or group count above
    ``MAX_TOPK``, ``PRIMUS_TURBO_MOE_ROUTER=torch``)."""
    s = logits.float()
    t, e = s.shape
    scores = torch.softmax(s, -1) if score_function == "softmax" else torch.sigmoid(s)
    sel = scores.detach()
    if groups > 1:
        per = e // groups
        grouped = sel.reshape(t, groups, per)
        top_in_group = torch.sort(grouped, dim=-1, descending=True, stable=True).values
        gscore = top_in_group[..., : topk // selected_groups].sum(-1)
        gidx = torch.sort(gscore, dim=-1, descending=True, stable=True).indices[:, :selected_groups]
        gmask = torch.zeros((t, groups), dtype=torch.bool, device=s.device).scatter(1, gidx, True)
        emask = gmask.unsqueeze(-1).expand(t, groups, per).reshape(t, e)
        sel = sel.masked_fill(~emask, -1.0)  # scores lie in [0, 1]: masked experts never win
    # A stable descending sort puts equal scores in index order: the lowest index wins ties.
    idx = torch.sort(sel, dim=-1, descending=True, stable=True).indices[:, :topk]
    probs = scores.gather(1, idx)
    if topk > 1:
        probs = probs / (probs.sum(-1, keepdim=True) + 1e-20)
    if scaling_factor != 1.0:
        probs = probs * scaling_factor
    aux = scores if score_function == "softmax" else scores / scores.sum(-1, keepdim=True)
    return aux, probs, idx


def fused_group_topk_routing_with_aux_score(
    logits: torch.Tensor,
    topk: int,
    groups: int = 1,
    selected_groups: int = 1,
    score_function: str = "sigmoid",
    scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dense form of ``moe_router_topk``: ``(scores [S,E], probs [S,E], routing_map [S,E] bool)``.

    ``probs`` holds the routing weights at the selected experts and zeros elsewhere.
    """
    aux, probs_k, idx = moe_router_topk(
        logits, topk, groups, selected_groups, score_function, scaling_factor
    )
    probs = torch.zeros_like(aux).scatter(1, idx, probs_k)
    routing_map = torch.zeros_like(aux, dtype=torch.bool).scatter(1, idx, True)
    return aux, probs, routing_map


# ---- permute / unpermute -----------------------------------------------------------------------


def _build_maps(idx: torch.Tensor, num_experts: int, pad_multiple: int, num_out: int | None):
    """``(row_map [T,K], src_map [N], tokens_per_expert [E], total)`` built on the device.

    Copies routed to an expert outside ``[0, num_experts)`` (e.g. -1, or a non-local expert) are
    dropped: their ``row_map`` entry is -1. ``total`` is the used row count (0-d tensor).
    """
    t, k = idx.shape
    dev = idx.device
    flat = idx.reshape(-1).to(torch.int64)
    key = torch.where((flat >= 0) & (flat < num_experts), flat, num_experts)
    sorted_key, order = torch.sort(key, stable=True)
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, key, torch.ones_like(key))
    counts = counts[:num_experts]
    starts = torch.cumsum(counts, 0) - counts
    if pad_multiple > 0:
        tpe = (counts + pad_multiple - 1) // pad_multiple * pad_multiple
    else:
        tpe = counts
    pstarts = torch.cumsum(tpe, 0) - tpe
    total = tpe.sum()
    if num_out is None:
        num_out = int(total.item()) if pad_multiple > 0 else int(counts.sum().item())
    pos = torch.arange(flat.numel(), device=dev)
    valid = sorted_key < num_experts
    e_c = sorted_key.clamp(max=max(num_experts - 1, 0))
    dst = torch.where(valid, pstarts[e_c] + pos - starts[e_c], -1)
    dst = torch.where(dst < num_out, dst, -1)  # rows past a fixed allocation are dropped
    row_map = torch.empty_like(flat).scatter(0, order, dst).reshape(t, k)
    src_map = torch.full((num_out + 1,), -1, dtype=torch.int64, device=dev)
    src_map = src_map.scatter(0, torch.where(dst >= 0, dst, num_out), order)[:num_out]
    return row_map, src_map, tpe, total, num_out


class _Permute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, src_map, row_map, k):
        ctx.save_for_backward(row_map)
        ctx.x_dtype = x.dtype
        return moe_gather_rows(x, src_map, k)

    @staticmethod
    def backward(ctx, g):
        (row_map,) = ctx.saved_tensors
        return moe_reduce_rows(g.contiguous(), row_map, None, ctx.x_dtype), None, None, None


class _Unpermute(torch.autograd.Function):
    """The inverse map ``src_map`` is only needed by the backward: built there, not per call."""

    @staticmethod
    def forward(ctx, y, row_map, w):
        ctx.save_for_backward(y, row_map, w)
        return moe_reduce_rows(y, row_map, w, y.dtype)

    @staticmethod
    def backward(ctx, g):
        y, row_map, w = ctx.saved_tensors
        g = g.contiguous()
        src_map = _src_from_rows(row_map, y.shape[0])
        if w is None:
            k = row_map.shape[1]
            return moe_gather_rows(g, src_map, k), None, None
        dy, dw = moe_reduce_rows_bwd(g, y, row_map, w, src_map)
        return dy, None, (dw if ctx.needs_input_grad[2] else None)


def moe_permute(
    tokens: torch.Tensor,
    expert_map: torch.Tensor,
    *,
    num_local_experts: int,
    num_topk: int = 0,
    pad_multiple: int = 0,
    num_permuted_tokens: int = -1,
    scaling_factor: torch.Tensor | None = None,
    probs: torch.Tensor | None = None,
    probs_layout: str = "topk",
    scales_per_token: int = 0,
    use_fp8: bool = False,
    _bytes: bool = False,  # internal: uint8 / int32 rows (the fp8 path's views of fp8 rows)
):
    """Sort token copies by expert (expert-major, stable).

    Args:
        tokens: ``[T, H]`` fp16/bf16/fp32.
        expert_map: top-k expert ids ``[T, K]`` int32/int64 (ids outside
            ``[0, num_local_experts)`` are dropped), or a bool routing map ``[T, E]`` with at
            most ``num_topk`` set entries per row (rows with fewer leave dropped slots).
        num_local_experts: ``E``.
        num_topk: ``K``; required with a routing map, checked against ``expert_map`` otherwise.
        pad_multiple: pad every expert's segment with zero rows to a multiple of this.
        num_permuted_tokens: fixed output row count (no host sync); rows past the used ones are
            zero and copies that do not fit are dropped (``overflow_flag``). Default without
            padding: ``T*K`` (no sync; rows of dropped copies stay zero at the end); with
            padding: the exact padded count (one host sync).
        probs: routing weights, ``[T, K]`` ("topk" layout) or ``[T, E]`` ("routing_map").
        use_fp8: ``tokens`` are fp8 (e.g. quantized rowwise before the permutation: T rows
            instead of T*K) and ``scaling_factor`` (fp32 ``[T]`` or ``[T, scales_per_token]``,
            ``scales_per_token`` >= 1) travels with them: ``permuted_scaling_factor [N]`` (or
            ``[N, S]``), 0 on padding rows. Rows are moved as bytes by the same kernels, so the
            result is bitwise what quantizing the permuted high-precision rows gives (rowwise
            scales along H do not depend on the row order). No gradient for the fp8 tokens
            (see ``moe_fp8.moe_quantize_permute_fp8`` for one to their source); ``probs``
            keep theirs.
    Returns:
        ``(permuted [N, H], row_id_map [T, K] int64, tokens_per_expert [E] int64 (padded),
        overflow_flag 0-d bool, num_dispatched_tokens 0-d int64, permuted_scaling_factor (fp8)
        | None, permuted_probs [N] | None)``.
    """
    op = "moe_permute"
    check_tensor(op, "expert_map", expert_map, ndim=2, dtypes=INDEX_DTYPES + (torch.bool,))
    if use_fp8:
        from primus_turbo.pytorch.ops.moe_fp8 import permute_fp8

        return permute_fp8(
            op, tokens, expert_map, scaling_factor, scales_per_token, num_local_experts,
            num_topk, pad_multiple, num_permuted_tokens, probs, probs_layout,
        )  # fmt: skip
    raw = (torch.uint8, torch.int32)  # the fp8 path's byte / word views
    check_tensor(op, "tokens", tokens, ndim=2, dtypes=raw if _bytes else FLOAT_DTYPES)
    check_same_device(op, tokens=tokens, expert_map=expert_map)
    if scaling_factor is not None or scales_per_token:
        got = "a tensor" if scaling_factor is not None else f"scales_per_token={scales_per_token}"
        fail(op, "scaling_factor", "None with use_fp8=False (scales travel with fp8 tokens)", got)
    check(num_local_experts >= 1, op, "num_local_experts", ">= 1", num_local_experts)
    check(
        expert_map.shape[0] == tokens.shape[0],
        op,
        "expert_map",
        f"{tokens.shape[0]} rows (one per token)",
        tuple(expert_map.shape),
    )
    check(pad_multiple >= 0, op, "pad_multiple", ">= 0", pad_multiple)
    check(
        probs_layout in ("topk", "routing_map"),
        op,
        "probs_layout",
        "'topk' or 'routing_map'",
        repr(probs_layout),
    )
    if expert_map.dtype == torch.bool:
        check(
            expert_map.shape[1] == num_local_experts,
            op,
            "expert_map",
            f"a routing map with {num_local_experts} columns",
            tuple(expert_map.shape),
        )
        check(num_topk >= 1, op, "num_topk", ">= 1 with a bool routing map", num_topk)
        idx = torch.sort(expert_map.to(torch.int8), dim=-1, descending=True, stable=True).indices
        idx = idx[:, :num_topk]
        # rows with fewer than num_topk set entries: the extra picks are dropped, not routed
        idx = torch.where(expert_map.gather(1, idx), idx, -1)
    else:
        idx = expert_map.to(torch.int64)
        check(num_topk in (0, idx.shape[1]), op, "num_topk", f"0 or {idx.shape[1]}", num_topk)
    t, k = idx.shape
    num_out = num_permuted_tokens if num_permuted_tokens > 0 else None
    if num_out is None and pad_multiple == 0:
        num_out = t * k  # exact unless copies drop; then the tail rows stay zero
    probs_tk = None
    if probs is not None:
        probs_tk = _probs_topk(op, probs, probs_layout, idx, num_local_experts)
    if num_out is not None and _impl._use_triton(tokens):
        # two Triton launches build every map (and gather the probs): no sort, no host sync
        ids = expert_map if expert_map.dtype != torch.bool else idx
        if k > 0 and permute_impl_choice() == "v2":
            return permute_v2(tokens, ids, probs_tk, num_local_experts, pad_multiple, num_out)
        p_in = probs_tk.detach().contiguous() if probs_tk is not None else None
        row_map, src_map, tpe, dispatched, overflow, pp = moe_route_maps(
            ids, num_local_experts, pad_multiple, num_out, p_in
        )
        permuted = _Permute.apply(tokens, src_map, row_map, k)
        permuted_probs = None
        if probs_tk is not None:
            permuted_probs = _PermuteProbs.apply(probs_tk, pp, row_map)
        return permuted, row_map, tpe, overflow, dispatched, None, permuted_probs
    row_map, src_map, tpe, total, n = _build_maps(idx, num_local_experts, pad_multiple, num_out)
    overflow = total > n
    permuted = _Permute.apply(tokens, src_map, row_map, k)
    permuted_probs = None
    if probs_tk is not None:
        flat = probs_tk.reshape(-1)
        permuted_probs = flat.index_select(0, src_map.clamp(min=0)) * (src_map >= 0)
    return permuted, row_map, tpe, overflow, total.clamp(max=n), None, permuted_probs


def _probs_topk(op, probs, probs_layout, idx, num_local_experts):
    """``probs`` as ``[T, K]`` fp32 in the order of ``idx`` (checked)."""
    t, k = idx.shape
    check_tensor(op, "probs", probs, ndim=2, dtypes=(torch.float32,))
    check_same_device(op, expert_map=idx, probs=probs)
    if probs_layout == "routing_map":
        check(
            probs.shape == (t, num_local_experts),
            op,
            "probs",
            f"shape {(t, num_local_experts)}",
            tuple(probs.shape),
        )
        probs = probs.gather(1, idx.clamp(0, num_local_experts - 1))
    check(probs.shape == (t, k), op, "probs", f"shape {(t, k)}", tuple(probs.shape))
    return probs


class _PermuteProbs(torch.autograd.Function):
    """``permuted_probs`` (gathered by the map kernel) with its gradient: ``d probs[t, k] =
    g[row_map[t, k]]`` (0 for dropped copies)."""

    @staticmethod
    def forward(ctx, probs, permuted, row_map):
        ctx.save_for_backward(row_map)
        return permuted

    @staticmethod
    def backward(ctx, g):
        (row_map,) = ctx.saved_tensors
        flat = row_map.reshape(-1)
        grad = g.index_select(0, flat.clamp(min=0)) * (flat >= 0)
        return grad.view_as(row_map), None, None


def moe_unpermute(
    permuted_tokens: torch.Tensor,
    row_id_map: torch.Tensor,
    num_dispatched_tokens_tensor: torch.Tensor | None = None,
    *,
    restore_shape: torch.Size | tuple[int, ...] | None = None,
    num_local_experts: int = 0,
    permuted_probs: torch.Tensor | None = None,
    probs_topk_stride: int = 0,
    pad_multiple: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Inverse of ``moe_permute``: ``out[t] = sum_k p * permuted_tokens[row_id_map[t, k]]``.

    The sum over the top-k copies runs in fp32 (``p = permuted_probs[row]``, or 1). Padding rows
    and dropped copies contribute nothing. Returns ``(tokens [T, H], unpermuted_probs [T, K] or
    None)``; ``restore_shape`` (``(T, H)``) is checked when given.
    """
    op = "moe_unpermute"
    check_tensor(op, "permuted_tokens", permuted_tokens, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor(op, "row_id_map", row_id_map, ndim=2, dtypes=(torch.int64,))
    check_same_device(op, permuted_tokens=permuted_tokens, row_id_map=row_id_map)
    if restore_shape is not None:
        want = (row_id_map.shape[0], permuted_tokens.shape[1])
        check(tuple(restore_shape) == want, op, "restore_shape", f"{want}", tuple(restore_shape))
    n = permuted_tokens.shape[0]
    unpermuted_probs = None
    if permuted_probs is not None:
        check_tensor(op, "permuted_probs", permuted_probs, ndim=1, dtypes=(torch.float32,))
        check_same_device(op, permuted_tokens=permuted_tokens, permuted_probs=permuted_probs)
        check(
            permuted_probs.shape[0] == n,
            op,
            "permuted_probs",
            f"{n} elements (one per row)",
            tuple(permuted_probs.shape),
        )
    y = permuted_tokens if permuted_tokens.stride(-1) == 1 else permuted_tokens.contiguous()
    if row_id_map.shape[1] > 0 and _impl._use_triton(y) and permute_impl_choice() == "v2":
        return unpermute_v2(y, row_id_map, permuted_probs)
    if permuted_probs is not None:
        valid = row_id_map >= 0
        rows = row_id_map.clamp(min=0).reshape(-1)
        unpermuted_probs = permuted_probs.index_select(0, rows).view_as(row_id_map) * valid
    out = _Unpermute.apply(y, row_id_map, permuted_probs)
    return out, unpermuted_probs


def _src_from_rows(row_map: torch.Tensor, n: int) -> torch.Tensor:
    flat = row_map.reshape(-1)
    src = torch.full((n + 1,), -1, dtype=torch.int64, device=row_map.device)
    ids = torch.arange(flat.numel(), device=row_map.device)
    return src.scatter(0, torch.where(flat >= 0, flat, n), ids)[:n]
