"""Blockwise-scaled FP8 GEMM with TMA operand loads (sm_90): the ``v3`` candidates of
``gemm_fp8_kernel`` (``PRIMUS_TURBO_FP8_BLOCK_CONFIGS``).

Same math as ``gemm_fp8_kernel``'s BLOCK mode with ``RESCALE`` (one fp32 accumulator kept in
units of the current K-block's scale: ``acc = dot(a, b, acc * (s_{k-1} / s_k))``, ``acc * s_last``
at the end), but A ``[M, K]`` and B ``[N, K]`` tiles arrive through host-built TMA descriptors
instead of 16-byte ``cp.async`` pointer loads. Why: Triton ends every K-block of a blockwise
kernel with a ``wgmma.wait_group 0`` (the partial product is read by non-dot ops; checked in
the sm_90 TTGIR, for the rescale, the fresh-product and a software-pipelined deferred
promotion alike), so the time between two K-blocks' wgmma bursts is the issue time of the
promotion plus the loads. With TMA one thread issues a tile load (``cp.async`` needs 8-16
16-byte copies, masks and address arithmetic per thread per stage) and the wait is an
mbarrier, not ``cp.async.wait_group`` + ``bar.sync``: fewer instructions and registers per
K-block (sm_90 128x128 w8: 122 instead of 128-with-maxnreg registers; w4 218 instead of 221).
``FLATTEN`` flattens the persistent tile loop with the K loop, so the next tile's first loads
are issued during this tile's epilogue.

Out-of-range rows/columns/K are zero-filled by the hardware (TMA), so there are no load masks;
the scales of a K tail block exist (``cdiv(K, 128)`` columns). The store is a masked pointer
store. Needs K-contiguous operands with 16-byte aligned row strides (``K % 16 == 0``) and
16-byte aligned base pointers; ``gemm_fp8_kernel`` covers everything else.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from primus_turbo.triton.gemm.gemm_configs import GemmConfig
from primus_turbo.triton.gemm.gemm_kernel import _tile_coords


@triton.jit
def gemm_fp8_block_tma_kernel(
    a_desc,
    b_desc,
    c_ptr,
    sa_ptr,
    sb_ptr,
    M,
    N,
    K,
    stride_cm,
    stride_cn,
    stride_sam,
    stride_sak,
    stride_sbn,
    stride_sbk,
    num_programs,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SA_GROUP: tl.constexpr = 1,
    SB_GROUP: tl.constexpr = 128,
    SCALE_K: tl.constexpr = 128,
    UPCAST: tl.constexpr = False,
    FLATTEN: tl.constexpr = False,
    DEFER: tl.constexpr = False,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile_id in tl.range(pid, num_tiles, num_programs, flatten=FLATTEN):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        row0 = pid_m * BLOCK_M
        col0 = pid_n * BLOCK_N
        rm64 = (row0 + tl.arange(0, BLOCK_M)).to(tl.int64)
        rn64 = (col0 + tl.arange(0, BLOCK_N)).to(tl.int64)
        mask_m = rm64 < M
        mask_n = rn64 < N
        sa_ptrs = sa_ptr + (rm64 // SA_GROUP) * stride_sam
        sb_ptrs = sb_ptr + (rn64 // SB_GROUP) * stride_sbn
        sb_tile = sb_ptr + (col0 // SB_GROUP).to(tl.int64) * stride_sbn
        if DEFER:
            _block_tile_deferred(a_desc, b_desc, c_ptr, sa_ptrs, sb_ptr, sb_tile, row0, col0,
                                 rm64, mask_m, M, N, k_tiles, stride_cm, stride_cn, stride_sak,
                                 stride_sbn, stride_sbk, BLOCK_M, BLOCK_N, BLOCK_K, SB_GROUP,
                                 SCALE_K, UPCAST)  # fmt: skip
        else:
            prev_a = tl.full((BLOCK_M,), 1.0, tl.float32)
            prev_b = tl.full((BLOCK_N,), 1.0, tl.float32)
            # this K-block's scales, loaded one iteration ahead (Triton pipelines only the dot's
            # operand loads; a scale load in the same iteration would stall before the wgmma)
            next_a = tl.load(sa_ptrs, mask=mask_m, other=1.0)
            if SB_GROUP % BLOCK_N == 0:
                next_a = next_a * tl.load(sb_tile)
            next_b = tl.load(sb_ptrs, mask=mask_n, other=1.0)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for kt in range(0, k_tiles):
                a = a_desc.load([row0, kt * BLOCK_K])
                b = b_desc.load([col0, kt * BLOCK_K])
                if UPCAST:  # the interpreter path: exact fp32 products of the fp8 values
                    a = a.to(tl.float32)
                    b = b.to(tl.float32)
                sa = tl.where(next_a == 0.0, 1.0, next_a)
                sb = tl.where(next_b == 0.0, 1.0, next_b)
                kb = (tl.minimum(kt + 1, k_tiles - 1) * BLOCK_K) // SCALE_K
                next_a = tl.load(sa_ptrs + kb * stride_sak, mask=mask_m, other=1.0)
                if SB_GROUP % BLOCK_N == 0:
                    next_a = next_a * tl.load(sb_tile + kb * stride_sbk)
                    acc = tl.dot(a, b.T, acc * (prev_a / sa)[:, None])
                else:
                    next_b = tl.load(sb_ptrs + kb * stride_sbk, mask=mask_n, other=1.0)
                    acc = tl.dot(a, b.T, (acc * (prev_a / sa)[:, None]) * (prev_b / sb)[None, :])
                    prev_b = sb
                prev_a = sa
            acc = acc * prev_a[:, None]
            if SB_GROUP % BLOCK_N != 0:
                acc = acc * prev_b[None, :]
            c_ptrs = c_ptr + rm64[:, None] * stride_cm + rn64[None, :] * stride_cn
            tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _block_tile_deferred(
    a_desc, b_desc, c_ptr, sa_ptrs, sb_ptr, sb_tile, row0, col0, rm64, mask_m, M, N, k_tiles,
    stride_cm, stride_cn, stride_sak, stride_sbn, stride_sbk,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SB_GROUP: tl.constexpr, SCALE_K: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """One output tile as two N halves whose promotions are staggered by a K-block: the first
    half's product is synchronous (its ``wait 0`` also completes the second half's product of
    the previous K-block, which is promoted next), then the second half's product is issued
    and stays in flight (its result is only yielded and its previous value is read after that
    ``wait 0``: Triton's "properly async" rule 3b) while the first half is promoted. So half
    of the promotion FMAs run under a wgmma. ``b_desc`` has ``BLOCK_N / 2`` rows. ptxas
    reports no wgmma serialization (C7514) for this order."""
    HALF: tl.constexpr = BLOCK_N // 2
    rn1 = (col0 + tl.arange(0, HALF)).to(tl.int64)
    rn2 = rn1 + HALF
    mask_n1 = rn1 < N
    mask_n2 = rn2 < N
    sb1_ptrs = sb_ptr + (rn1 // SB_GROUP) * stride_sbn
    sb2_ptrs = sb_ptr + (rn2 // SB_GROUP) * stride_sbn
    acc1 = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
    part2 = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)  # the previous K-block's 2nd half
    s_prev = tl.zeros((BLOCK_M,), dtype=tl.float32)
    sb2_prev = tl.zeros((HALF,), dtype=tl.float32)
    for kt in range(0, k_tiles):
        a = a_desc.load([row0, kt * BLOCK_K])
        b1 = b_desc.load([col0, kt * BLOCK_K])
        b2 = b_desc.load([col0 + HALF, kt * BLOCK_K])
        if UPCAST:
            a = a.to(tl.float32)
            b1 = b1.to(tl.float32)
            b2 = b2.to(tl.float32)
        kb = (kt * BLOCK_K) // SCALE_K
        s = tl.load(sa_ptrs + kb * stride_sak, mask=mask_m, other=0.0)
        if SB_GROUP % BLOCK_N == 0:
            s = s * tl.load(sb_tile + kb * stride_sbk)
        else:
            sb1 = tl.load(sb1_ptrs + kb * stride_sbk, mask=mask_n1, other=0.0)
            sb2 = tl.load(sb2_ptrs + kb * stride_sbk, mask=mask_n2, other=0.0)
        part1 = tl.dot(a, b1.T)  # synchronous: its wait 0 also completes part2
        # part2 is consumed before its registers are reused by this K-block's second half
        # (consumed after that issue, ptxas must copy the in-flight accumulator at the loop
        # back edge and serializes every wgmma: C7514 "non wgmma instructions reading
        # accumulator registers")
        if SB_GROUP % BLOCK_N == 0:
            acc2 += part2 * s_prev[:, None]
        else:
            acc2 += (part2 * s_prev[:, None]) * sb2_prev[None, :]
            sb2_prev = sb2
        part2 = tl.dot(a, b2.T)  # stays in flight through part1's promotion
        if SB_GROUP % BLOCK_N == 0:
            acc1 += part1 * s[:, None]
        else:
            acc1 += (part1 * s[:, None]) * sb1[None, :]
        s_prev = s
    if SB_GROUP % BLOCK_N == 0:
        acc2 += part2 * s_prev[:, None]
    else:
        acc2 += (part2 * s_prev[:, None]) * sb2_prev[None, :]
    c_rows = c_ptr + rm64[:, None] * stride_cm
    out_ty = c_ptr.dtype.element_ty
    tl.store(
        c_rows + rn1[None, :] * stride_cn, acc1.to(out_ty), mask=mask_m[:, None] & mask_n1[None, :]
    )
    tl.store(
        c_rows + rn2[None, :] * stride_cn, acc2.to(out_ty), mask=mask_m[:, None] & mask_n2[None, :]
    )


def tma_usable(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Descriptor constraints: K-contiguous operands, 16-byte aligned rows and base pointers
    (CUDA sm_90+ or the CPU interpreter; the caller checks the arch)."""
    for t in (a, b):
        if t.stride(1) != 1 or (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
            return False
    return a.shape[1] * a.element_size() >= 16


def launch_block_tma(a, b, c, sa, sb, sa_group, sb_group, sa_strides, sb_strides, cfg: GemmConfig,
                     programs: int, upcast: bool) -> None:  # fmt: skip
    """``c = (a * sa) @ (b * sb)^T`` (BLOCK scaling) with ``cfg``; ``programs`` persistent
    programs. ``cfg.extra`` may carry ``TMA`` (ignored here) and ``FLATTEN``."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from primus_turbo.triton.host_tma import ensure_context

    ensure_context(a.device)
    m, k = a.shape
    n = b.shape[0]
    a_desc = TensorDescriptor.from_tensor(a, [cfg.block_m, cfg.block_k])
    defer = dict(cfg.extra).get("DEFER", False)
    b_desc = TensorDescriptor.from_tensor(b, [cfg.block_n // (2 if defer else 1), cfg.block_k])
    opts = {key: v for key, v in cfg.options.items() if key not in ("TMA", "RESCALE")}
    gemm_fp8_block_tma_kernel[(programs,)](
        a_desc, b_desc, c, sa, sb, m, n, k, c.stride(0), c.stride(1), *sa_strides, *sb_strides,
        programs, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m, SA_GROUP=sa_group, SB_GROUP=sb_group, SCALE_K=128, UPCAST=upcast,
        **opts,
    )  # fmt: skip


def aot_specs(fp8: str, configs) -> list:
    """sm_90 specs (called from ``gemm_fp8_kernel.aot_specs``): 1x128 activation scales,
    128x128 weight scales, bf16 and fp32 out (the epilogue's shared memory depends on it: the
    AOT check flags a config over the sm_90 limit); descriptors typed by their block shapes."""
    from primus_turbo.triton.aot import AotSpec

    specs = []
    for cfg, out in [(c, o) for c in configs for o in ("bf16", "fp32")]:
        defer = dict(cfg.extra).get("DEFER", False)
        sig = {
            "a_desc": f"tensordesc<{fp8}[{cfg.block_m}, {cfg.block_k}]>",
            "b_desc": f"tensordesc<{fp8}[{cfg.block_n // (2 if defer else 1)}, {cfg.block_k}]>",
            "c_ptr": f"*{out}", "sa_ptr": "*fp32", "sb_ptr": "*fp32", "M": "i32:16",
            "N": "i32:16", "K": "i32:16", "stride_cm": "i32:16", "stride_cn": "i32:1",
            "stride_sam": "i32", "stride_sak": "i32", "stride_sbn": "i32", "stride_sbk": "i32",
            "num_programs": "i32",
        }  # fmt: skip
        consts = {**cfg.tile_constexprs, "SA_GROUP": 1, "SB_GROUP": 128, "SCALE_K": 128,
                  "UPCAST": False, "FLATTEN": dict(cfg.extra).get("FLATTEN", False),
                  "DEFER": defer}  # fmt: skip
        opts = {k: v for k, v in cfg.options.items() if not k.isupper()}
        name = f"gemm_fp8_block_tma_{fp8}_{out}_{cfg.name}"
        specs.append(AotSpec(name, gemm_fp8_block_tma_kernel, sig, consts, opts))
    return specs
