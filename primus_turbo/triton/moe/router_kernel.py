"""Fused top-k router: one kernel for the forward, one for the backward (``moe_router_topk``).

A program takes ``ROWS`` tokens and holds each token's ``E`` logits in registers as a
``[ROWS, GROUPS, PER]`` tile (expert ``e = g * per + j``; ``PER`` is the group size padded to a
power of two; no groups: ``GROUPS = 1``). Forward, in fp32: softmax or sigmoid scores; with
groups, each group's score is the sum of its ``TOPK // SEL`` best scores (taken best first, the
reference's order) and the ``SEL`` best groups stay eligible; then ``TOPK`` rounds of "largest
eligible score, lowest expert index on a tie", the picked score normalised by the picks' sum
(+1e-20, ``TOPK > 1``) and scaled. Writes ``aux [T, E]`` (softmax scores, or the sigmoid scores
normalised over all experts), ``probs [T, TOPK]`` fp32, ``idx [T, TOPK]`` int64 and the picks'
sum ``[T]`` fp32 (for the backward). The backward recomputes the scores from the logits (the
same arithmetic, so the same values), takes the normalisation's gradient from the saved probs
and sums, and writes ``dlogits`` in the logits' dtype from ``dprobs`` and ``daux`` (either may
be absent).
No atomics: bitwise deterministic. Semantics: ``reference.moe.router_ref``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from primus_turbo.triton.aot import AotSpec

MAX_EXPERTS = 4096  # rows up to this many experts are held in registers (else the torch ops)
MAX_TOPK = 32  # selection rounds are unrolled: larger top-k / group counts take the torch ops
# logits per program: ROWS = _TILE // padded E (1-16). AOT (sm_90 / gfx942 / gfx950, 128 and 256
# experts): 512 compiles without spills (at most 128 registers); 2048 spilled on all three.
_TILE = 512


@triton.jit
def _tile_coords(pid, T, E, PER_G, ROWS: tl.constexpr, GROUPS: tl.constexpr, PER: tl.constexpr):
    """Rows ``[ROWS]``, expert ids ``[ROWS, GROUPS, PER]`` (int32) and the valid mask."""
    rows = pid * ROWS + tl.arange(0, ROWS)
    g = tl.arange(0, GROUPS)[None, :, None]
    j = tl.arange(0, PER)[None, None, :]
    e = g * PER_G + j
    ok = (rows[:, None, None] < T) & (j < PER_G) & (e < E)
    return rows, e, ok


@triton.jit
def _scores(logits_ptr, rows, e, ok, stride_l, SIGMOID: tl.constexpr):
    """fp32 scores of the tile (0 off the valid mask)."""
    x = tl.load(logits_ptr + rows.to(tl.int64)[:, None, None] * stride_l + e, mask=ok,
                other=0.0).to(tl.float32)  # fmt: skip
    if SIGMOID:
        z = tl.exp(-tl.abs(x))  # no overflow on either side
        s = tl.where(x >= 0, 1.0 / (1.0 + z), z / (1.0 + z))
    else:
        x = tl.where(ok, x, float("-inf"))
        m = tl.max(tl.max(x, axis=2), axis=1)
        m = tl.where(m == float("-inf"), 0.0, m)  # rows past T: nothing valid
        ex = tl.where(ok, tl.exp(x - m[:, None, None]), 0.0)
        total = tl.sum(tl.sum(ex, axis=2), axis=1)
        s = ex / tl.where(total == 0.0, 1.0, total)[:, None, None]
    return tl.where(ok, s, 0.0)


@triton.jit
def router_fwd_kernel(
    logits_ptr, aux_ptr, probs_ptr, idx_ptr, ssum_ptr, T, E, PER_G, stride_l, scale,
    TOPK: tl.constexpr, K_PAD: tl.constexpr, GROUPS: tl.constexpr, SEL: tl.constexpr,
    PER: tl.constexpr, ROWS: tl.constexpr, SIGMOID: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    rows, e, ok = _tile_coords(pid, T, E, PER_G, ROWS, GROUPS, PER)
    s = _scores(logits_ptr, rows, e, ok, stride_l, SIGMOID)
    big = E + 1
    sel = tl.where(ok, s, -1.0)  # scores lie in [0, 1]: -1 is never picked
    if GROUPS > 1:
        # group score: the sum of the group's TOPK // SEL best scores, best first
        gsel = sel
        gscore = tl.zeros((ROWS, GROUPS), dtype=tl.float32)
        for _ in tl.static_range(TOPK // SEL):
            best = tl.max(gsel, axis=2)
            first = tl.min(tl.where(gsel == best[:, :, None], e, big), axis=2)
            gscore += best
            gsel = tl.where(e == first[:, :, None], -2.0, gsel)
        gid = tl.arange(0, GROUPS)[None, :]
        gscore = tl.where((rows[:, None] < T) & (gid * PER_G < E), gscore, -1.0)
        keep = gscore < -10.0  # all False
        for _ in tl.static_range(SEL):
            best = tl.max(gscore, axis=1)
            first = tl.min(tl.where(gscore == best[:, None], gid, GROUPS), axis=1)
            keep = keep | (gid == first[:, None])
            gscore = tl.where(gid == first[:, None], -2.0, gscore)
        sel = tl.where(keep[:, :, None], sel, -1.0)
    kcol = tl.arange(0, K_PAD)[None, :]
    p = tl.zeros((ROWS, K_PAD), dtype=tl.float32)
    ids = tl.zeros((ROWS, K_PAD), dtype=tl.int64)
    for k in tl.static_range(TOPK):
        best = tl.max(tl.max(sel, axis=2), axis=1)
        first = tl.min(tl.min(tl.where(sel == best[:, None, None], e, big), axis=2), axis=1)
        hit = e == first[:, None, None]
        pk = tl.sum(tl.sum(tl.where(hit, s, 0.0), axis=2), axis=1)
        p = tl.where(kcol == k, pk[:, None], p)
        ids = tl.where(kcol == k, first[:, None].to(tl.int64), ids)
        sel = tl.where(hit, -2.0, sel)
    if TOPK > 1:
        total = tl.sum(p, axis=1) + 1e-20
        p = p / total[:, None]
        tl.store(ssum_ptr + rows, total, mask=rows < T)  # for the backward
    p = p * scale
    out = (rows[:, None] < T) & (kcol < TOPK)
    offs = rows.to(tl.int64)[:, None] * TOPK + kcol
    tl.store(probs_ptr + offs, p, mask=out)
    tl.store(idx_ptr + offs, ids, mask=out)
    aux = s
    if SIGMOID:
        a_sum = tl.sum(tl.sum(s, axis=2), axis=1)
        aux = s / tl.where(a_sum == 0.0, 1.0, a_sum)[:, None, None]  # 0: rows past T
    tl.store(aux_ptr + rows.to(tl.int64)[:, None, None] * E + e, aux, mask=ok)


@triton.jit
def router_bwd_kernel(
    logits_ptr, idx_ptr, probs_ptr, ssum_ptr, dprobs_ptr, daux_ptr, dlogits_ptr, T, E, PER_G,
    stride_l, stride_d, scale, TOPK: tl.constexpr, GROUPS: tl.constexpr, PER: tl.constexpr,
    ROWS: tl.constexpr, SIGMOID: tl.constexpr, HAS_DPROBS: tl.constexpr, HAS_DAUX: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    rows, e, ok = _tile_coords(pid, T, E, PER_G, ROWS, GROUPS, PER)
    s = _scores(logits_ptr, rows, e, ok, stride_l, SIGMOID)
    r64 = rows.to(tl.int64)
    ds = tl.zeros((ROWS, GROUPS, PER), dtype=tl.float32)
    if HAS_DPROBS:
        # With p_k = c s_k / S (S = sum_j s_j + 1e-20, saved by the forward) the score gradient
        # at pick k is (c dp_k - sum_j dp_j p_j) / S: per pick, its expert id, dprobs and probs
        # are [ROWS] vectors (no reduction over the tile, no gather), scattered onto the tile
        # by comparison as dp (scattered) and the picked mask, scaled once after the loop.
        live = rows < T
        dot = tl.zeros((ROWS,), dtype=tl.float32)
        picked = tl.zeros((ROWS, GROUPS, PER), dtype=tl.float32)
        for k in tl.static_range(TOPK):
            ik = tl.load(idx_ptr + r64 * TOPK + k, mask=live, other=-1).to(tl.int32)
            dpk = tl.load(dprobs_ptr + r64 * TOPK + k, mask=live, other=0.0)
            hit = e == ik[:, None, None]
            ds = tl.where(hit, ds + dpk[:, None, None], ds)
            if TOPK > 1:
                dot += dpk * tl.load(probs_ptr + r64 * TOPK + k, mask=live, other=0.0)
                picked = tl.where(hit, picked + 1.0, picked)
        if TOPK > 1:
            inv = 1.0 / tl.load(ssum_ptr + rows, mask=live, other=1.0)
            ds = (ds * scale - picked * dot[:, None, None]) * inv[:, None, None]
        else:
            ds = ds * scale
    if HAS_DAUX:
        da = tl.load(daux_ptr + r64[:, None, None] * E + e, mask=ok, other=0.0)
        if SIGMOID:  # aux = s / A, A = sum s
            a_sum = tl.sum(tl.sum(s, axis=2), axis=1)
            a_sum = tl.where(a_sum == 0.0, 1.0, a_sum)  # rows past T
            dot = tl.sum(tl.sum(da * s, axis=2), axis=1)
            ds += da / a_sum[:, None, None] - (dot / (a_sum * a_sum))[:, None, None]
        else:
            ds += da
    if SIGMOID:
        dl = ds * s * (1.0 - s)
    else:
        dot = tl.sum(tl.sum(ds * s, axis=2), axis=1)
        dl = s * (ds - dot[:, None, None])
    out = dlogits_ptr + r64[:, None, None] * stride_d + e
    tl.store(out, dl.to(dlogits_ptr.dtype.element_ty), mask=ok)


def router_tile(e: int, groups: int) -> tuple[int, int]:
    """``(ROWS, PER)``: the padded group size and the rows of one program."""
    per = triton.next_power_of_2(max(e // groups, 1))
    return max(1, min(16, _TILE // (per * groups))), per


def router_fwd_triton(
    logits: torch.Tensor, topk: int, groups: int, selected: int, sigmoid: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(aux [T, E] fp32, probs [T, topk] fp32, idx [T, topk] int64, ssum [T] fp32)`` of
    ``logits [T, E]`` (unit stride along E; ``groups`` a power of two dividing E); ``ssum``: the
    picks' score sum + 1e-20 per token (``topk > 1``; what the backward needs), unset for
    ``topk == 1``."""
    t, e = logits.shape
    dev = logits.device
    aux = torch.empty((t, e), dtype=torch.float32, device=dev)
    probs = torch.empty((t, topk), dtype=torch.float32, device=dev)
    idx = torch.empty((t, topk), dtype=torch.int64, device=dev)
    ssum = torch.empty((t,), dtype=torch.float32, device=dev)
    if t == 0:
        return aux, probs, idx, ssum
    rows, per = router_tile(e, groups)
    router_fwd_kernel[(triton.cdiv(t, rows),)](
        logits, aux, probs, idx, ssum, t, e, e // groups, logits.stride(0), float(scale),
        TOPK=topk, K_PAD=triton.next_power_of_2(topk), GROUPS=groups, SEL=selected, PER=per,
        ROWS=rows, SIGMOID=sigmoid, num_warps=4,
    )  # fmt: skip
    return aux, probs, idx, ssum


def router_bwd_triton(
    logits: torch.Tensor,
    idx: torch.Tensor,
    probs: torch.Tensor,
    ssum: torch.Tensor,
    dprobs: torch.Tensor | None,
    daux: torch.Tensor | None,
    groups: int,
    sigmoid: bool,
    scale: float,
) -> torch.Tensor:
    """``dlogits [T, E]`` in the logits' dtype (``probs`` / ``ssum``: the forward's outputs;
    ``dprobs`` / ``daux``: contiguous fp32 or None)."""
    t, e = logits.shape
    topk = idx.shape[1]
    dl = torch.empty((t, e), dtype=logits.dtype, device=logits.device)
    if t == 0:
        return dl
    rows, per = router_tile(e, groups)
    router_bwd_kernel[(triton.cdiv(t, rows),)](
        logits, idx, probs, ssum, dprobs if dprobs is not None else logits,
        daux if daux is not None else logits, dl, t, e, e // groups, logits.stride(0),
        dl.stride(0), float(scale), TOPK=topk, GROUPS=groups, PER=per, ROWS=rows,
        SIGMOID=sigmoid, HAS_DPROBS=dprobs is not None, HAS_DAUX=daux is not None, num_warps=4,
    )  # fmt: skip
    return dl


def aot_specs(target: str) -> list[AotSpec]:
    """fp32 logits: DeepSeek-V3's group-limited sigmoid router (256 experts, 8 groups, 4
    selected, top-8) and Qwen3-MoE's softmax router (128 experts, top-8), forward and backward."""
    specs = []
    for name, e, groups, sel, sigmoid in (("ds", 256, 8, 4, True), ("qwen", 128, 1, 1, False)):
        rows, per = router_tile(e, groups)
        const = {"TOPK": 8, "GROUPS": groups, "PER": per, "ROWS": rows, "SIGMOID": sigmoid}
        specs.append(AotSpec(
            name=f"moe_router_fwd_{name}", fn=router_fwd_kernel,
            signature={"logits_ptr": "*fp32", "aux_ptr": "*fp32", "probs_ptr": "*fp32",
                       "idx_ptr": "*i64", "ssum_ptr": "*fp32", "T": "i32", "E": "i32",
                       "PER_G": "i32", "stride_l": "i32", "scale": "fp32"},
            constexprs={**const, "K_PAD": 8, "SEL": sel}, options={"num_warps": 4},
            default=name == "ds",
        ))  # fmt: skip
        specs.append(AotSpec(
            name=f"moe_router_bwd_{name}", fn=router_bwd_kernel,
            signature={"logits_ptr": "*fp32", "idx_ptr": "*i64", "probs_ptr": "*fp32",
                       "ssum_ptr": "*fp32", "dprobs_ptr": "*fp32",
                       "daux_ptr": "*fp32", "dlogits_ptr": "*fp32",
                       "T": "i32", "E": "i32", "PER_G": "i32", "stride_l": "i32",
                       "stride_d": "i32", "scale": "fp32"},
            constexprs={**const, "HAS_DPROBS": True, "HAS_DAUX": True},
            options={"num_warps": 4},
        ))  # fmt: skip
    return specs
