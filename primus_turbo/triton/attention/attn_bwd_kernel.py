"""Flash attention backward in Triton: two kernels, no atomics (deterministic).

Launch order: dQ first, then dK/dV.
- ``attn_bwd_dq_kernel``: one program per (query block, batch, q head); it reads its dO and O
  rows once, computes ``delta = rowsum(dO * O)`` (fp32) and stores it for the dK/dV kernel (no
  separate reduction pass over dO and O), then walks the visible key blocks and accumulates
  ``dQ += dS K``.
- ``attn_bwd_dkdv_kernel``: one program per (key block, batch, kv head); it walks the q heads of
  its GQA group and their visible query blocks, recomputing
  ``P = exp2(S * scale * log2e - lse * log2e)``, and accumulates ``dV += P^T dO`` and
  ``dK += dS^T Q`` in fp32 registers (the GQA sum happens in a fixed order inside one program).
``dS = P * (dP - delta)`` with ``dP = dO V^T``; dQ and dK are scaled by softmax_scale at the end.
Rows with lse = -inf (no visible key) get P = 0, so their gradients are 0.

A qk head dim that is not a power of two runs as two power-of-two chunks (``BLOCK_DQK2 > 0``:
192 = 128 + 64; S is the sum of two dots, dQ/dK have two accumulators) instead of padding to 256.
The dK/dV kernel can also run as two launches (``PART`` 1: dV only, 2: dK only), each with one
accumulator set, which lets the 192 tiles be wider at the cost of computing S twice; the
launcher times both ways per shape (attn_launch._dkdv_mode).
"""

from __future__ import annotations

import triton
import triton.language as tl

from primus_turbo.triton.attention.attn_common import (
    key_ranges,
    query_ranges,
    seq_bounds,
    visible,
)


@triton.jit
def _dkdv_steps(
    dk,
    dk2,
    dv,
    k,
    k2,
    v,
    q_base,
    do_base,
    lse_base,
    delta_base,
    stride_qm,
    stride_dom,
    stride_lm,
    offs_n,
    offs_dk,
    offs_dk2,
    offs_dv,
    start,
    end,
    seqlen_q,
    seqlen_k,
    win_l,
    win_r,
    qk_scale,
    DQK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    SPLIT: tl.constexpr,
    MASK: tl.constexpr,
    HAS_L: tl.constexpr,
    HAS_R: tl.constexpr,
    UPCAST: tl.constexpr,
    PART: tl.constexpr = 0,
):
    for m0 in range(start, end, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        row_ok = offs_m < seqlen_q
        qt_ptrs = q_base + offs_m[None, :].to(tl.int64) * stride_qm + offs_dk[:, None]
        do_ptrs = do_base + offs_m[:, None].to(tl.int64) * stride_dom + offs_dv[None, :]
        qt = tl.load(qt_ptrs, mask=row_ok[None, :] & (offs_dk[:, None] < DQK), other=0.0)
        do = tl.load(do_ptrs, mask=row_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
        lse = tl.load(lse_base + offs_m.to(tl.int64) * stride_lm, mask=row_ok, other=0.0)
        lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
        if UPCAST:
            qt = qt.to(tl.float32)
            do = do.to(tl.float32)
        st = tl.dot(k, qt)  # [BLOCK_N, BLOCK_M]
        if SPLIT:  # the qk dim's second chunk (e.g. 192 = 128 + 64: no padding to 256)
            qt2_ptrs = q_base + offs_m[None, :].to(tl.int64) * stride_qm + offs_dk2[:, None]
            qt2 = tl.load(qt2_ptrs, mask=row_ok[None, :] & (offs_dk2[:, None] < DQK), other=0.0)
            if UPCAST:
                qt2 = qt2.to(tl.float32)
            st = tl.dot(k2, qt2, st)
        st = st * qk_scale
        pt = tl.math.exp2(st - lse2[None, :])
        if MASK:
            ok = visible(offs_m, offs_n, seqlen_q, seqlen_k, win_l, win_r, HAS_L, HAS_R)
            pt = tl.where(tl.trans(ok), pt, 0.0)
        if PART != 2:
            dv = tl.dot(pt.to(do.dtype), do, dv)
        if PART != 1:
            delta = tl.load(delta_base + offs_m.to(tl.int64) * stride_lm, mask=row_ok, other=0.0)
            dpt = tl.dot(v, tl.trans(do))
            dst = pt * (dpt - delta[None, :])
            dk = tl.dot(dst.to(qt.dtype), tl.trans(qt), dk)
            if SPLIT:
                dk2 = tl.dot(dst.to(qt2.dtype), tl.trans(qt2), dk2)
    return dk, dk2, dv


@triton.jit(do_not_specialize=["num_kv_heads", "group"])
def attn_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, cu_q_ptr, cu_k_ptr,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_dob, stride_dos, stride_doh,
    stride_dkb, stride_dks, stride_dkh,
    stride_dvb, stride_dvs, stride_dvh,
    stride_lb, stride_lh, stride_ls,
    num_kv_heads, group, seqlen_q, seqlen_k, qk_scale, sm_scale, win_l, win_r,
    DQK: tl.constexpr, DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DQK: tl.constexpr,
    BLOCK_DV: tl.constexpr, VARLEN: tl.constexpr, HAS_L: tl.constexpr, HAS_R: tl.constexpr,
    UPCAST: tl.constexpr, BLOCK_DQK2: tl.constexpr = 0, PART: tl.constexpr = 0,
):  # fmt: skip
    # PART 0: dK and dV; 1: dV only; 2: dK only (two launches with half the accumulators each:
    # wider tiles fit in the registers at the cost of recomputing S; see attn_launch)
    # BLOCK_DQK2 > 0: the qk dim is two chunks [0, BLOCK_DQK) + [BLOCK_DQK, BLOCK_DQK + BLOCK_DQK2)
    # (192 = 128 + 64), so neither the K tile nor the dK accumulator is padded to 256 columns
    SPLIT: tl.constexpr = BLOCK_DQK2 > 0
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_kv_heads
    hk = pid_bh % num_kv_heads
    start_q, seqlen_q, start_k, seqlen_k = seq_bounds(
        cu_q_ptr, cu_k_ptr, b, seqlen_q, seqlen_k, VARLEN
    )
    n_start = pid_n * BLOCK_N
    if n_start >= seqlen_k:
        return
    offs_n = n_start + tl.arange(0, BLOCK_N)
    offs_dk = tl.arange(0, BLOCK_DQK)
    offs_dk2 = BLOCK_DQK + tl.arange(0, BLOCK_DQK2 if SPLIT else 16)
    offs_dv = tl.arange(0, BLOCK_DV)
    b64 = b.to(tl.int64)
    sq64 = start_q.to(tl.int64)
    sk64 = start_k.to(tl.int64)
    n_ok = offs_n[:, None] < seqlen_k
    k_base = k_ptr + b64 * stride_kb + sk64 * stride_ks + hk.to(tl.int64) * stride_kh
    k_rows = k_base + offs_n[:, None].to(tl.int64) * stride_ks
    v_ptrs = v_ptr + b64 * stride_vb + sk64 * stride_vs + hk.to(tl.int64) * stride_vh
    v_ptrs += offs_n[:, None].to(tl.int64) * stride_vs + offs_dv[None, :]
    k = tl.load(k_rows + offs_dk[None, :], mask=n_ok & (offs_dk[None, :] < DQK), other=0.0)
    v = tl.load(v_ptrs, mask=n_ok & (offs_dv[None, :] < DV), other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    dk = tl.zeros([BLOCK_N, BLOCK_DQK], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    k2 = k
    dk2 = dk
    if SPLIT:
        k2 = tl.load(k_rows + offs_dk2[None, :], mask=n_ok & (offs_dk2[None, :] < DQK), other=0.0)
        if UPCAST:
            k2 = k2.to(tl.float32)
        dk2 = tl.zeros([BLOCK_N, BLOCK_DQK2], dtype=tl.float32)
    lo, full_lo, full_hi, hi = query_ranges(
        n_start, seqlen_q, seqlen_k, win_l, win_r, BLOCK_M, BLOCK_N, HAS_L, HAS_R
    )
    for g in range(0, group):
        h64 = (hk * group + g).to(tl.int64)  # 64-bit head offsets: bhsd views, stride_h = S * D
        q_base = q_ptr + b64 * stride_qb + sq64 * stride_qs + h64 * stride_qh
        do_base = do_ptr + b64 * stride_dob + sq64 * stride_dos + h64 * stride_doh
        lse_base = lse_ptr + b64 * stride_lb + h64 * stride_lh + sq64 * stride_ls
        delta_base = delta_ptr + b64 * stride_lb + h64 * stride_lh + sq64 * stride_ls
        dk, dk2, dv = _dkdv_steps(dk, dk2, dv, k, k2, v, q_base, do_base, lse_base, delta_base,
                                  stride_qs, stride_dos, stride_ls, offs_n, offs_dk, offs_dk2,
                                  offs_dv, full_lo, full_hi, seqlen_q, seqlen_k, win_l, win_r,
                                  qk_scale, DQK, DV, BLOCK_M, SPLIT, False, HAS_L, HAS_R,
                                  UPCAST, PART)  # fmt: skip
        dk, dk2, dv = _dkdv_steps(dk, dk2, dv, k, k2, v, q_base, do_base, lse_base, delta_base,
                                  stride_qs, stride_dos, stride_ls, offs_n, offs_dk, offs_dk2,
                                  offs_dv, lo, full_lo, seqlen_q, seqlen_k, win_l, win_r,
                                  qk_scale, DQK, DV, BLOCK_M, SPLIT, True, HAS_L, HAS_R,
                                  UPCAST, PART)  # fmt: skip
        dk, dk2, dv = _dkdv_steps(dk, dk2, dv, k, k2, v, q_base, do_base, lse_base, delta_base,
                                  stride_qs, stride_dos, stride_ls, offs_n, offs_dk, offs_dk2,
                                  offs_dv, full_hi, hi, seqlen_q, seqlen_k, win_l, win_r,
                                  qk_scale, DQK, DV, BLOCK_M, SPLIT, True, HAS_L, HAS_R,
                                  UPCAST, PART)  # fmt: skip
    if PART != 1:
        dk_rows = dk_ptr + b64 * stride_dkb + sk64 * stride_dks + hk.to(tl.int64) * stride_dkh
        dk_rows += offs_n[:, None].to(tl.int64) * stride_dks
        dk_ty = dk_ptr.dtype.element_ty
        tl.store(dk_rows + offs_dk[None, :], (dk * sm_scale).to(dk_ty),
                 mask=n_ok & (offs_dk[None, :] < DQK))  # fmt: skip
        if SPLIT:
            tl.store(dk_rows + offs_dk2[None, :], (dk2 * sm_scale).to(dk_ty),
                     mask=n_ok & (offs_dk2[None, :] < DQK))  # fmt: skip
    if PART != 2:
        dv_ptrs = dv_ptr + b64 * stride_dvb + sk64 * stride_dvs + hk.to(tl.int64) * stride_dvh
        dv_ptrs += offs_n[:, None].to(tl.int64) * stride_dvs + offs_dv[None, :]
        tl.store(dv_ptrs, dv.to(dv_ptr.dtype.element_ty), mask=n_ok & (offs_dv[None, :] < DV))


@triton.jit
def _dq_steps(
    dq,
    dq2,
    q,
    q2,
    do,
    lse2,
    delta,
    k_base,
    v_base,
    stride_kn,
    stride_vn,
    offs_m,
    offs_dk,
    offs_dk2,
    offs_dv,
    start,
    end,
    seqlen_q,
    seqlen_k,
    win_l,
    win_r,
    qk_scale,
    DQK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    MASK: tl.constexpr,
    HAS_L: tl.constexpr,
    HAS_R: tl.constexpr,
    UPCAST: tl.constexpr,
):
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n[None, :] < seqlen_k
        k_cols = k_base + offs_n[None, :].to(tl.int64) * stride_kn
        vt_ptrs = v_base + offs_n[None, :].to(tl.int64) * stride_vn + offs_dv[:, None]
        kt = tl.load(k_cols + offs_dk[:, None], mask=n_ok & (offs_dk[:, None] < DQK), other=0.0)
        vt = tl.load(vt_ptrs, mask=n_ok & (offs_dv[:, None] < DV), other=0.0)
        if UPCAST:
            kt = kt.to(tl.float32)
            vt = vt.to(tl.float32)
        s = tl.dot(q, kt)
        if SPLIT:
            kt2 = tl.load(k_cols + offs_dk2[:, None], mask=n_ok & (offs_dk2[:, None] < DQK),
                          other=0.0)  # fmt: skip
            if UPCAST:
                kt2 = kt2.to(tl.float32)
            s = tl.dot(q2, kt2, s)
        p = tl.math.exp2(s * qk_scale - lse2[:, None])
        if MASK:
            ok = visible(offs_m, offs_n, seqlen_q, seqlen_k, win_l, win_r, HAS_L, HAS_R)
            p = tl.where(ok, p, 0.0)
        dp = tl.dot(do, vt)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(kt.dtype), tl.trans(kt), dq)
        if SPLIT:
            dq2 = tl.dot(ds.to(kt2.dtype), tl.trans(kt2), dq2)
    return dq, dq2


@triton.jit(do_not_specialize=["num_heads", "group"])
def attn_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, cu_q_ptr, cu_k_ptr,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ob, stride_os, stride_oh,
    stride_dob, stride_dos, stride_doh,
    stride_dqb, stride_dqs, stride_dqh,
    stride_lb, stride_lh, stride_ls,
    num_heads, group, seqlen_q, seqlen_k, qk_scale, sm_scale, win_l, win_r,
    DQK: tl.constexpr, DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DQK: tl.constexpr,
    BLOCK_DV: tl.constexpr, VARLEN: tl.constexpr, HAS_L: tl.constexpr, HAS_R: tl.constexpr,
    UPCAST: tl.constexpr, BLOCK_DQK2: tl.constexpr = 0,
):  # fmt: skip
    SPLIT: tl.constexpr = BLOCK_DQK2 > 0  # qk dim in two chunks, as in the dK/dV kernel
    # last query block first: with a causal / right-bounded mask it sees the most keys, so the
    # heaviest programs start first and the last wave is made of light ones (shorter tail)
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    hk = h // group
    start_q, seqlen_q, start_k, seqlen_k = seq_bounds(
        cu_q_ptr, cu_k_ptr, b, seqlen_q, seqlen_k, VARLEN
    )
    m_start = pid_m * BLOCK_M
    if m_start >= seqlen_q:
        return
    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_dk = tl.arange(0, BLOCK_DQK)
    offs_dk2 = BLOCK_DQK + tl.arange(0, BLOCK_DQK2 if SPLIT else 16)
    offs_dv = tl.arange(0, BLOCK_DV)
    b64 = b.to(tl.int64)
    sq64 = start_q.to(tl.int64)
    sk64 = start_k.to(tl.int64)
    m_ok = offs_m < seqlen_q
    q_rows = q_ptr + b64 * stride_qb + sq64 * stride_qs + h.to(tl.int64) * stride_qh
    q_rows += offs_m[:, None].to(tl.int64) * stride_qs
    do_ptrs = do_ptr + b64 * stride_dob + sq64 * stride_dos + h.to(tl.int64) * stride_doh
    do_ptrs += offs_m[:, None].to(tl.int64) * stride_dos + offs_dv[None, :]
    o_ptrs = o_ptr + b64 * stride_ob + sq64 * stride_os + h.to(tl.int64) * stride_oh
    o_ptrs += offs_m[:, None].to(tl.int64) * stride_os + offs_dv[None, :]
    dv_ok = m_ok[:, None] & (offs_dv[None, :] < DV)
    q = tl.load(q_rows + offs_dk[None, :], mask=m_ok[:, None] & (offs_dk[None, :] < DQK),
                other=0.0)  # fmt: skip
    do = tl.load(do_ptrs, mask=dv_ok, other=0.0)
    o = tl.load(o_ptrs, mask=dv_ok, other=0.0)
    l_off = b64 * stride_lb + h.to(tl.int64) * stride_lh + (sq64 + offs_m) * stride_ls
    # delta = rowsum(dO * O) in fp32, stored for the dK/dV kernel (launched after this one)
    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), axis=1)
    tl.store(delta_ptr + l_off, delta, mask=m_ok)
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    q2 = q
    dq = tl.zeros([BLOCK_M, BLOCK_DQK], dtype=tl.float32)
    dq2 = dq
    if SPLIT:
        q2 = tl.load(q_rows + offs_dk2[None, :], mask=m_ok[:, None] & (offs_dk2[None, :] < DQK),
                     other=0.0)  # fmt: skip
        if UPCAST:
            q2 = q2.to(tl.float32)
        dq2 = tl.zeros([BLOCK_M, BLOCK_DQK2], dtype=tl.float32)
    lse = tl.load(lse_ptr + l_off, mask=m_ok, other=0.0)
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    k_base = k_ptr + b64 * stride_kb + sk64 * stride_ks + hk.to(tl.int64) * stride_kh
    v_base = v_ptr + b64 * stride_vb + sk64 * stride_vs + hk.to(tl.int64) * stride_vh
    lo, full_lo, full_hi, hi = key_ranges(
        m_start, seqlen_q, seqlen_k, win_l, win_r, BLOCK_M, BLOCK_N, HAS_L, HAS_R
    )
    dq, dq2 = _dq_steps(dq, dq2, q, q2, do, lse2, delta, k_base, v_base, stride_ks, stride_vs,
                        offs_m, offs_dk, offs_dk2, offs_dv, full_lo, full_hi, seqlen_q, seqlen_k,
                        win_l, win_r, qk_scale, DQK, DV, BLOCK_N, SPLIT, False, HAS_L, HAS_R,
                        UPCAST)  # fmt: skip
    dq, dq2 = _dq_steps(dq, dq2, q, q2, do, lse2, delta, k_base, v_base, stride_ks, stride_vs,
                        offs_m, offs_dk, offs_dk2, offs_dv, lo, full_lo, seqlen_q, seqlen_k,
                        win_l, win_r, qk_scale, DQK, DV, BLOCK_N, SPLIT, True, HAS_L, HAS_R,
                        UPCAST)  # fmt: skip
    dq, dq2 = _dq_steps(dq, dq2, q, q2, do, lse2, delta, k_base, v_base, stride_ks, stride_vs,
                        offs_m, offs_dk, offs_dk2, offs_dv, full_hi, hi, seqlen_q, seqlen_k,
                        win_l, win_r, qk_scale, DQK, DV, BLOCK_N, SPLIT, True, HAS_L, HAS_R,
                        UPCAST)  # fmt: skip
    dq_rows = dq_ptr + b64 * stride_dqb + sq64 * stride_dqs + h.to(tl.int64) * stride_dqh
    dq_rows += offs_m[:, None].to(tl.int64) * stride_dqs
    dq_ty = dq_ptr.dtype.element_ty
    tl.store(dq_rows + offs_dk[None, :], (dq * sm_scale).to(dq_ty),
             mask=m_ok[:, None] & (offs_dk[None, :] < DQK))  # fmt: skip
    if SPLIT:
        tl.store(dq_rows + offs_dk2[None, :], (dq2 * sm_scale).to(dq_ty),
                 mask=m_ok[:, None] & (offs_dk2[None, :] < DQK))  # fmt: skip
