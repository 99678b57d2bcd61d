"""Flash attention forward in Triton (online softmax, fp32 accumulation, lse saved).

Layout: q ``[B, Sq, Hq, Dqk]``, k ``[B, Sk, Hkv, Dqk]``, v ``[B, Sk, Hkv, Dv]`` addressed by
strides (innermost stride 1), or packed ``[T, H, D]`` with ``cu_seqlens`` (VARLEN: batch stride
0, token offsets from cu_seqlens). GQA/MQA: kv head = q head // (Hq / Hkv); K/V are never
repeated. Head dims are padded to powers of two (BLOCK_DQK, BLOCK_DV) with masked loads; a qk
dim that pads badly runs as two chunks instead (BLOCK_DQK2 > 0): 192/128 (DeepSeek) as
BLOCK_DQK=128 + BLOCK_DQK2=64, BLOCK_DV=128 (PRIMUS_TURBO_ATTN_SPLIT_D=0: padded to 256).

Softmax in base 2: scores are multiplied by ``softmax_scale * log2(e)`` and exponentiated with
exp2; the stored lse is in natural log (``[B, Hq, Sq]`` dense, ``[Hq, T]`` varlen). Key blocks
invisible to a whole query block (causal / window) are skipped by the loop bounds; blocks that
are fully visible run without the mask. Rows that see no key give output 0 and lse = -inf.
"""

from __future__ import annotations

import triton
import triton.language as tl

from primus_turbo.triton.attention.attn_common import key_ranges, seq_bounds, visible

LOG2E = 1.4426950408889634


@triton.jit
def _fwd_steps(
    acc,
    l_i,
    m_i,
    q,
    k_base,
    v_base,
    stride_kn,
    stride_vn,
    offs_m,
    offs_dk,
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
    MASK: tl.constexpr,
    HAS_L: tl.constexpr,
    HAS_R: tl.constexpr,
    EVEN_DQK: tl.constexpr,
    EVEN_DV: tl.constexpr,
    UPCAST: tl.constexpr,
    ks_base=None,
    vs_base=None,
    qs=None,
    FP8: tl.constexpr = False,
    SCALE_BLK: tl.constexpr = 64,
    P_MAX: tl.constexpr = 448.0,
    P_FP8: tl.constexpr = False,
    q2=None,
    offs_dk2=None,
    SPLIT: tl.constexpr = False,
):
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        kt_ptrs = k_base + offs_n[None, :].to(tl.int64) * stride_kn + offs_dk[:, None]
        v_ptrs = v_base + offs_n[:, None].to(tl.int64) * stride_vn + offs_dv[None, :]
        kmask = offs_dk[:, None] < DQK
        vmask = offs_dv[None, :] < DV
        if MASK:
            kt = tl.load(kt_ptrs, mask=kmask & (offs_n[None, :] < seqlen_k), other=0.0)
        elif EVEN_DQK:
            kt = tl.load(kt_ptrs)
        else:
            kt = tl.load(kt_ptrs, mask=kmask, other=0.0)
        if UPCAST:
            kt = kt.to(tl.float32)
        s = tl.dot(q, kt)
        if SPLIT:  # the qk dim's second chunk (192 = 128 + 64: no padding to 256)
            kt2_ptrs = k_base + offs_n[None, :].to(tl.int64) * stride_kn + offs_dk2[:, None]
            if MASK:
                k2_ok = (offs_dk2[:, None] < DQK) & (offs_n[None, :] < seqlen_k)
                kt2 = tl.load(kt2_ptrs, mask=k2_ok, other=0.0)
            elif EVEN_DQK:
                kt2 = tl.load(kt2_ptrs)
            else:
                kt2 = tl.load(kt2_ptrs, mask=offs_dk2[:, None] < DQK, other=0.0)
            if UPCAST:
                kt2 = kt2.to(tl.float32)
            s = tl.dot(q2, kt2, s)
        s = s * qk_scale
        if FP8:  # dequant: per-row Q scale x per-(head, key block) K scale
            s = s * (qs[:, None] * tl.load(ks_base + n0 // SCALE_BLK))
        if MASK:
            ok = visible(offs_m, offs_n, seqlen_q, seqlen_k, win_l, win_r, HAS_L, HAS_R)
            s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # fully masked row so far
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if MASK:
            v = tl.load(v_ptrs, mask=vmask & (offs_n[:, None] < seqlen_k), other=0.0)
        elif EVEN_DV:
            v = tl.load(v_ptrs)
        else:
            v = tl.load(v_ptrs, mask=vmask, other=0.0)
        if FP8 and not P_FP8:  # V dequantised to bf16 in registers; P V in bf16
            vdq = v.to(tl.float32) * tl.load(vs_base + n0 // SCALE_BLK)
            if UPCAST:
                acc = tl.dot(p.to(tl.bfloat16).to(tl.float32), vdq.to(tl.bfloat16).to(tl.float32),
                             acc)  # fmt: skip
            else:
                acc = tl.dot(p.to(tl.bfloat16), vdq.to(tl.bfloat16), acc)
        elif FP8:  # P quantised as p * P_MAX in V's fp8 format; V's block scale applied after
            p8 = (p * P_MAX).to(v.dtype)
            if UPCAST:
                pv = tl.dot(p8.to(tl.float32), v.to(tl.float32))
            else:
                pv = tl.dot(p8, v)
            acc += pv * (tl.load(vs_base + n0 // SCALE_BLK) / P_MAX)
        elif UPCAST:
            acc = tl.dot(p, v.to(tl.float32), acc)
        else:
            acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["num_heads", "group"])  # no recompile per GQA ratio
def attn_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, cu_q_ptr, cu_k_ptr, qs_ptr, ks_ptr, vs_ptr,
    n_sblk_q, n_sblk_k,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ob, stride_os, stride_oh,
    stride_lb, stride_lh, stride_ls,
    num_heads, group, seqlen_q, seqlen_k, qk_scale, win_l, win_r,
    DQK: tl.constexpr, DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DQK: tl.constexpr,
    BLOCK_DV: tl.constexpr, VARLEN: tl.constexpr, HAS_L: tl.constexpr, HAS_R: tl.constexpr,
    UPCAST: tl.constexpr,
    FP8: tl.constexpr = False,
    SCALE_BLK: tl.constexpr = 64,
    P_MAX: tl.constexpr = 448.0,
    P_FP8: tl.constexpr = False,
    BLOCK_DQK2: tl.constexpr = 0,
):  # fmt: skip
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
    # BLOCK_DQK2 > 0: the qk dim runs as two chunks [0, BLOCK_DQK) + [BLOCK_DQK, +BLOCK_DQK2)
    SPLIT: tl.constexpr = BLOCK_DQK2 > 0
    EVEN_DQK: tl.constexpr = BLOCK_DQK + BLOCK_DQK2 == DQK
    EVEN_DV: tl.constexpr = BLOCK_DV == DV
    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_dk = tl.arange(0, BLOCK_DQK)
    offs_dv = tl.arange(0, BLOCK_DV)
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)  # head offsets in 64 bits: bhsd views have stride_h = S * D
    hk64 = hk.to(tl.int64)
    q_base = q_ptr + b64 * stride_qb + start_q.to(tl.int64) * stride_qs + h64 * stride_qh
    k_base = k_ptr + b64 * stride_kb + start_k.to(tl.int64) * stride_ks + hk64 * stride_kh
    v_base = v_ptr + b64 * stride_vb + start_k.to(tl.int64) * stride_vs + hk64 * stride_vh
    q_ptrs = q_base + offs_m[:, None].to(tl.int64) * stride_qs + offs_dk[None, :]
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < seqlen_q) & (offs_dk[None, :] < DQK), other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    offs_dk2 = BLOCK_DQK + tl.arange(0, BLOCK_DQK2 if SPLIT else 16)
    q2 = q
    if SPLIT:
        q2_ptrs = q_base + offs_m[:, None].to(tl.int64) * stride_qs + offs_dk2[None, :]
        q2 = tl.load(q2_ptrs, mask=(offs_m[:, None] < seqlen_q) & (offs_dk2[None, :] < DQK),
                     other=0.0)  # fmt: skip
        if UPCAST:
            q2 = q2.to(tl.float32)
    ks_base = ks_ptr
    vs_base = vs_ptr
    qs = None
    if FP8:  # per-row Q scales (a row block may span scale blocks); K/V scales per key block
        q_row = (b64 * num_heads + h) * n_sblk_q
        qs = tl.load(qs_ptr + q_row + offs_m // SCALE_BLK, mask=offs_m < seqlen_q, other=1.0)
        kv_row = (b64 * (num_heads // group) + hk) * n_sblk_k
        ks_base = ks_ptr + kv_row
        vs_base = vs_ptr + kv_row

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    lo, full_lo, full_hi, hi = key_ranges(
        m_start, seqlen_q, seqlen_k, win_l, win_r, BLOCK_M, BLOCK_N, HAS_L, HAS_R
    )
    acc, l_i, m_i = _fwd_steps(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, offs_m,
                               offs_dk, offs_dv, full_lo, full_hi, seqlen_q, seqlen_k, win_l,
                               win_r, qk_scale, DQK, DV, BLOCK_N, False, HAS_L, HAS_R, EVEN_DQK,
                               EVEN_DV, UPCAST, ks_base, vs_base, qs, FP8, SCALE_BLK,
                               P_MAX, P_FP8, q2, offs_dk2, SPLIT)  # fmt: skip
    acc, l_i, m_i = _fwd_steps(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, offs_m,
                               offs_dk, offs_dv, lo, full_lo, seqlen_q, seqlen_k, win_l,
                               win_r, qk_scale, DQK, DV, BLOCK_N, True, HAS_L, HAS_R, EVEN_DQK,
                               EVEN_DV, UPCAST, ks_base, vs_base, qs, FP8, SCALE_BLK,
                               P_MAX, P_FP8, q2, offs_dk2, SPLIT)  # fmt: skip
    acc, l_i, m_i = _fwd_steps(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, offs_m,
                               offs_dk, offs_dv, full_hi, hi, seqlen_q, seqlen_k, win_l,
                               win_r, qk_scale, DQK, DV, BLOCK_N, True, HAS_L, HAS_R, EVEN_DQK,
                               EVEN_DV, UPCAST, ks_base, vs_base, qs, FP8, SCALE_BLK,
                               P_MAX, P_FP8, q2, offs_dk2, SPLIT)  # fmt: skip
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    o_base = o_ptr + b64 * stride_ob + start_q.to(tl.int64) * stride_os + h64 * stride_oh
    o_ptrs = o_base + offs_m[:, None].to(tl.int64) * stride_os + offs_dv[None, :]
    tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < seqlen_q) & (offs_dv[None, :] < DV))  # fmt: skip
    lse_ptrs = lse_ptr + b64 * stride_lb + h64 * stride_lh
    lse_ptrs += (start_q + offs_m).to(tl.int64) * stride_ls
    tl.store(lse_ptrs, lse, mask=offs_m < seqlen_q)
