"""Scaled FP8 GEMM in Triton: ``C[M, N] = (A[M, K] * sa) @ (B[N, K] * sb)^T``, fp32 accumulation.

Operands are addressed by strides (the ops layer hands over K-contiguous A and B, which is what
Hopper's wgmma wants for fp8). Scale modes:
* ``TENSOR`` (0): scalar ``sa``, ``sb``; applied once in the epilogue.
* ``ROW`` (1): ``sa[M]``, ``sb[N]``; applied in the epilogue.
* ``BLOCK`` (2): per K-block of ``SCALE_K`` (128): ``sa[m // SA_GROUP, kb]``,
  ``sb[n // SB_GROUP, kb]`` multiply each K-tile's partial product in the main loop
  (``SA_GROUP``/``SB_GROUP`` = 1 for 1 x 128 blocks, 128 for 128 x 128 tiles).
  Two promotion schemes (constexpr ``RESCALE``):
  - ``False``: ``acc += dot(a, b) * s_k`` (a fresh fp32 product tile per K-block: two fp32
    tiles live, 222 registers/thread at 128x128 w8 on sm_90, so 128x256 spills).
  - ``True``: the accumulator is kept in units of the current K-block's scale,
    ``acc = dot(a, b, acc * (s_{k-1} / s_k))`` and ``acc * s_last`` at the end: one fp32 tile
    (sm_90 128x128 w8 128 registers with ``maxnreg=128`` and no spills, so two programs fit
    per SM and one's promotion overlaps the other's wgmma; 128x256 w8 fits without spills).
    Same products; the extra rounding is one fp32 multiply per K-block. Scales must be
    nonzero (the quantizer floors amax at 1e-12; a zero scale is read as 1), and the running
    sum divided by ``sa * sb`` must stay within fp32 (true partial sums below ~1e9 even when
    both scales sit at the 1e-12/448 floor).
Persistent grid with grouped tile order, as in gemm_kernel.py; ``programs_per_cu`` of the
config sets how many programs share a CU/SM.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from primus_turbo.pytorch.core.platform import (
    ArchFamily,
    arch_family,
    num_compute_units,
    triton_interpret,
)
from primus_turbo.triton.aot import AOT_TARGETS, AotSpec
from primus_turbo.triton.gemm.gemm_configs import GemmConfig
from primus_turbo.triton.gemm.gemm_kernel import _tile_coords

TENSOR, ROW, BLOCK = 0, 1, 2


@triton.jit
def gemm_fp8_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    sa_ptr,
    sb_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bn,
    stride_bk,
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
    EVEN_K: tl.constexpr,
    SCALE_MODE: tl.constexpr,
    SA_GROUP: tl.constexpr = 1,
    SB_GROUP: tl.constexpr = 1,
    SCALE_K: tl.constexpr = 128,
    UPCAST: tl.constexpr = False,
    RESCALE: tl.constexpr = False,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    offs_k = tl.arange(0, BLOCK_K)
    for tile_id in range(pid, num_tiles, num_programs):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rm64 = rm.to(tl.int64)
        rn64 = rn.to(tl.int64)
        mask_m = rm < M
        mask_n = rn < N
        a_ptrs = a_ptr + rm64[:, None] * stride_am + offs_k[None, :] * stride_ak
        b_ptrs = b_ptr + offs_k[:, None] * stride_bk + rn64[None, :] * stride_bn
        if SCALE_MODE == 2:
            sa_ptrs = sa_ptr + (rm64 // SA_GROUP) * stride_sam
            sb_ptrs = sb_ptr + (rn64 // SB_GROUP) * stride_sbn
            # the N tile's weight scale row when the tile lies in one weight scale block
            sb_tile = sb_ptr + ((pid_n * BLOCK_N) // SB_GROUP) * stride_sbn
            prev_a = tl.full((BLOCK_M,), 1.0, tl.float32)  # RESCALE: the previous K-block's
            prev_b = tl.full((BLOCK_N,), 1.0, tl.float32)  # scales (acc is in their units)
            if RESCALE:  # this K-block's scales, loaded one iteration ahead (they are needed
                # before the wgmma; Triton does not pipeline non-dot loads)
                next_a = tl.load(sa_ptrs, mask=mask_m, other=1.0)
                if SB_GROUP % BLOCK_N == 0:
                    next_a = next_a * tl.load(sb_tile)
                next_b = tl.load(sb_ptrs, mask=mask_n, other=1.0)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(0, k_tiles):
            if EVEN_K:
                a = tl.load(a_ptrs, mask=mask_m[:, None], other=0.0)
                b = tl.load(b_ptrs, mask=mask_n[None, :], other=0.0)
            else:
                k_left = K - kt * BLOCK_K
                a = tl.load(a_ptrs, mask=mask_m[:, None] & (offs_k[None, :] < k_left), other=0.0)
                b = tl.load(b_ptrs, mask=mask_n[None, :] & (offs_k[:, None] < k_left), other=0.0)
            if UPCAST:  # the interpreter path: exact fp32 products of the fp8 values
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            if SCALE_MODE == 2 and RESCALE:
                sa = tl.where(next_a == 0.0, 1.0, next_a)
                sb = tl.where(next_b == 0.0, 1.0, next_b)
                kb = (tl.minimum(kt + 1, k_tiles - 1) * BLOCK_K) // SCALE_K
                next_a = tl.load(sa_ptrs + kb * stride_sak, mask=mask_m, other=1.0)
                if SB_GROUP % BLOCK_N == 0:
                    next_a = next_a * tl.load(sb_tile + kb * stride_sbk)
                    acc = tl.dot(a, b, acc * (prev_a / sa)[:, None])
                else:
                    next_b = tl.load(sb_ptrs + kb * stride_sbk, mask=mask_n, other=1.0)
                    acc = tl.dot(a, b, (acc * (prev_a / sa)[:, None]) * (prev_b / sb)[None, :])
                    prev_b = sb
                prev_a = sa
            elif SCALE_MODE == 2:
                kb = (kt * BLOCK_K) // SCALE_K
                sa = tl.load(sa_ptrs + kb * stride_sak, mask=mask_m, other=0.0)
                if SB_GROUP % BLOCK_N == 0:
                    # the N tile lies in one weight scale block: one scalar per K-block, and
                    # the promotion is a single FMA per element with a per-row factor (was a
                    # 2-D scale product + multiply + add, issued while the tensor cores wait)
                    sb = tl.load(sb_tile + kb * stride_sbk)
                    acc += tl.dot(a, b) * (sa * sb)[:, None]
                else:
                    sb = tl.load(sb_ptrs + kb * stride_sbk, mask=mask_n, other=0.0)
                    acc += (tl.dot(a, b) * sa[:, None]) * sb[None, :]
            else:
                acc = tl.dot(a, b, acc)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        if SCALE_MODE == 2 and RESCALE:
            acc = acc * prev_a[:, None]
            if SB_GROUP % BLOCK_N != 0:
                acc = acc * prev_b[None, :]
        if SCALE_MODE == 0:
            acc = acc * (tl.load(sa_ptr) * tl.load(sb_ptr))
        elif SCALE_MODE == 1:
            sa = tl.load(sa_ptr + rm64 * stride_sam, mask=mask_m, other=0.0)
            sb = tl.load(sb_ptr + rn64 * stride_sbn, mask=mask_n, other=0.0)
            acc = acc * sa[:, None] * sb[None, :]
        c_ptrs = c_ptr + rm64[:, None] * stride_cm + rn64[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


# ---- configs and launcher ------------------------------------------------------------------


def _cfg(bm, bn, bk, warps, stages, per_cu=1, **extra) -> GemmConfig:
    """``extra``: compile options (``waves_per_eu``, ``maxnreg``) and UPPERCASE kernel
    constexprs (``RESCALE``); both travel in ``GemmConfig.extra`` and reach the launch as
    keywords (the AOT specs split them)."""
    return GemmConfig(bm, bn, bk, 8, warps, stages, per_cu, tuple(sorted(extra.items())))


_CONFIGS: dict[ArchFamily, tuple[GemmConfig, ...]] = {
    ArchFamily.HOPPER: (
        _cfg(128, 256, 128, 8, 3),
        _cfg(128, 128, 128, 8, 4),
        _cfg(128, 128, 128, 4, 4),
        _cfg(64, 128, 128, 4, 4),
    ),
    ArchFamily.CDNA3: (  # no 256x256: spills with 8 warps (as the bf16 GEMM on gfx942)
        _cfg(256, 128, 128, 8, 2, matrix_instr_nonkdim=16, waves_per_eu=2),
        _cfg(128, 256, 128, 8, 2, matrix_instr_nonkdim=16, waves_per_eu=2),
        _cfg(128, 128, 128, 4, 2, matrix_instr_nonkdim=16, waves_per_eu=2),
        _cfg(64, 64, 128, 4, 2, matrix_instr_nonkdim=16, waves_per_eu=0),
    ),
    ArchFamily.CPU: (_cfg(32, 32, 32, 4, 1),),
}
_CONFIGS[ArchFamily.CDNA4] = _CONFIGS[ArchFamily.CDNA3]
_CONFIGS[ArchFamily.OTHER_GPU] = _CONFIGS[ArchFamily.HOPPER]
# BLOCK mode keeps a second fp32 tile (the K-block's partial product) live: smaller tiles per
# thread, or it spills (AOT report: sm_90 128x256 w8 and 128x128 w4, gfx942 128x128 w4).
_BLOCK_CONFIGS: dict[ArchFamily, tuple[GemmConfig, ...]] = {
    ArchFamily.HOPPER: (
        _cfg(128, 128, 128, 8, 4),
        _cfg(128, 128, 128, 8, 3),
        _cfg(64, 128, 128, 4, 4),
    ),
    ArchFamily.CDNA3: (
        _cfg(256, 128, 128, 8, 2, matrix_instr_nonkdim=16, waves_per_eu=2),
        _cfg(128, 128, 128, 8, 2, matrix_instr_nonkdim=16, waves_per_eu=2),
        _cfg(64, 64, 128, 4, 2, matrix_instr_nonkdim=16, waves_per_eu=0),
    ),
    ArchFamily.CPU: _CONFIGS[ArchFamily.CPU],
}
_BLOCK_CONFIGS[ArchFamily.CDNA4] = _BLOCK_CONFIGS[ArchFamily.CDNA3]
_BLOCK_CONFIGS[ArchFamily.OTHER_GPU] = _BLOCK_CONFIGS[ArchFamily.HOPPER]
# v2 (sm_90): the rescaled-accumulator promotion (one fp32 tile) and programs_per_cu > 1, so a
# second resident program's wgmma runs while one program promotes (the promotion itself cannot
# overlap its own wgmma in Triton: the product is read by non-dot ops, so every K-block ends
# with a wgmma wait 0). AOT sm_90 (registers/thread, smem): r128 w8 s3 maxnreg128 128/96 KiB
# (2 per SM: 64K registers, 192 KiB); r128x256 w8 s3 255/145 KiB; r256x128 w8 s3 211/145 KiB;
# r128 w4 s3 221/97 KiB (2 per SM); r64x128 w4 s3 maxnreg168 159/72 KiB (3 per SM: 61K
# registers, 219 KiB with the per-block reserve; narrow N and short K); plain 64x128 w4 s4
# 238/96 KiB (2 per SM); the 2-warpgroup big tiles with a 4-deep pipeline (1 per SM, for the
# big shapes where r128 w4 cu2 sits at 0.81-0.85 of torch._scaled_mm): r256x128 w8 s4 211/193
# KiB, r128x256 w8 s4 255/193 KiB. Spill: 64x256 w4 s2 (255 + 20 B), 128x128 w4 s2 maxnreg168.
_BLOCK_CONFIGS_V2: dict[ArchFamily, tuple[GemmConfig, ...]] = {
    ArchFamily.HOPPER: (
        _cfg(128, 128, 128, 8, 3, per_cu=2, RESCALE=True, maxnreg=128),
        _cfg(128, 256, 128, 8, 3, RESCALE=True),
        _cfg(256, 128, 128, 8, 3, RESCALE=True),
        _cfg(128, 128, 128, 4, 3, per_cu=2, RESCALE=True),
        _cfg(64, 128, 128, 4, 3, per_cu=3, RESCALE=True, maxnreg=168),
        _cfg(256, 128, 128, 8, 4, RESCALE=True),
        _cfg(128, 256, 128, 8, 4, RESCALE=True),
        _cfg(128, 128, 128, 8, 4),
        _cfg(64, 128, 128, 4, 4, per_cu=2),
    ),
}
# TMA (sm_90): the rescaled kernel with TMA operand loads (gemm_fp8_block_tma.py; ``TMA`` in
# the config's extra routes the launch there). AOT sm_90 (registers, shared bytes; bf16 / fp32
# out): 128x128 w8 s3 128 / 154, 96 KiB (2 per SM, no maxnreg needed), w4 s3 250 / 226, 97 KiB
# (2 per SM), 256x128 w8 s4 245 / 219, 193 KiB, 64x128 w4 s4 134 / 152, 96 KiB (2 per SM),
# 64x128 w4 s3 128 / 149, 72 KiB (3 per SM), 128x64 w4 s3 120 / 146, 73 KiB (3 per SM), s4
# 136 / 145, 97 KiB (2 per SM). FLATTEN (the next tile's loads during this tile's epilogue)
# keeps the operand ring live through the epilogue's layout conversion (+BM*BN*out bytes):
# 128x128 w8 s3 128 KiB bf16 / 160 KiB fp32. DEFER (two N halves, the second half's wgmma in
# flight during the first half's promotion): 128x128 w8 s4 198 / 240, 128 KiB, FLATTEN s3
# 175 / 180, 112 / 128 KiB, 64x128 w4 s4 166 / 236, 96 KiB, s3 167 / 234, 72 KiB. Dropped
# after run 4.2: 128x256 w8 s4 (never within 30% of the best; spills with fp32 out) and its
# FLATTEN variant (320 KiB of shared memory with fp32 out: cannot launch on sm_90).
# ``tma`` = every TMA config (exploration with PRIMUS_TURBO_FP8_TUNE_LOG=1).
_TMA_CONFIGS: dict[ArchFamily, tuple[GemmConfig, ...]] = {
    ArchFamily.HOPPER: (
        _cfg(128, 128, 128, 4, 3, per_cu=2, TMA=True),
        _cfg(128, 128, 128, 8, 3, per_cu=2, TMA=True),
        _cfg(64, 128, 128, 4, 3, per_cu=3, TMA=True),
        _cfg(128, 64, 128, 4, 3, per_cu=3, TMA=True),
        _cfg(256, 128, 128, 8, 4, TMA=True),
        _cfg(128, 128, 128, 8, 3, TMA=True, FLATTEN=True),
        _cfg(64, 128, 128, 4, 4, per_cu=2, TMA=True),
        _cfg(128, 64, 128, 4, 4, per_cu=2, TMA=True),
        _cfg(128, 128, 128, 8, 4, TMA=True, DEFER=True),
        _cfg(128, 128, 128, 8, 3, TMA=True, DEFER=True, FLATTEN=True),
        _cfg(64, 128, 128, 4, 4, per_cu=2, TMA=True, DEFER=True),
        _cfg(64, 128, 128, 4, 3, per_cu=3, TMA=True, DEFER=True),
    ),
}
# v3 (default, sm_90): the candidates that won or came within 3% of the best somewhere in the
# run-4.2 tune log (26 model shapes, H200; tuner TFLOPS): TMA 128x128 w4 s3 2 per SM (best on
# 20 of 24 shapes: 1054-1308 big, 695 kv_a), 128x128 w8 s3 2 per SM (Qwen lm_head 1040 vs 968,
# q_b 1015 vs 1012), 64x128 w4 s3 3 per SM (q_a 948 vs 935, kv_b 647 vs 645); 128x64 w4 s3 3
# per SM is new (narrow N: kv_a's 576 columns are 4.5 128-wide tiles, 9 64-wide ones; not
# measured yet, so the tuner decides and the heuristic never picks it). The pointer-load
# (cp.async) kernel for operands TMA cannot describe: v2's 128x128 w4 s3 2 per SM (its best on
# 19 of 26 shapes in run 4.1) and 64x128 w4 s3 maxnreg168 3 per SM (q_a, kv_a in run 4.1: its
# kv_a 664 bench TFLOPS beat the TMA kernel's 532 in run 4.2, so it stays a tuner candidate
# for TMA operands too). Six candidates per shape.
_V3_TMA_W4, _V3_TMA_W8, _V3_TMA_64, _V3_TMA_N64 = _TMA_CONFIGS[ArchFamily.HOPPER][:4]
_V3_PTR_W4 = _cfg(128, 128, 128, 4, 3, per_cu=2, RESCALE=True)
_V3_PTR_64 = _cfg(64, 128, 128, 4, 3, per_cu=3, RESCALE=True, maxnreg=168)
_BLOCK_CONFIGS_V3: dict[ArchFamily, tuple[GemmConfig, ...]] = {
    ArchFamily.HOPPER: (_V3_TMA_W4, _V3_TMA_W8, _V3_TMA_64, _V3_TMA_N64, _V3_PTR_W4, _V3_PTR_64)
}
BLOCK_CONFIG_SETS = ("v1", "v2", "v3", "tma")

# sm_90 shared memory: 227 KiB per block (``sharedMemPerBlockOptin``), 228 KiB per SM of which
# 1 KiB per resident block is reserved by the driver.
SM90_SMEM_PER_BLOCK = 232448
SM90_SMEM_PER_SM = 233472


def block_smem_bytes(cfg: GemmConfig, out_bytes: int) -> int:
    """Upper bound of the shared memory of a blockwise config on sm_90 (checked against the AOT
    figures, ``scripts/aot_check.py``, bf16 and fp32 out): the fp8 operand ring
    ``stages * (BM + BN) * BK`` plus 2 KiB (barriers, scale staging: 24-1056 bytes seen), plus
    for ``FLATTEN`` the epilogue's layout-conversion tile (``BM * BN * out_bytes``, half of it
    for ``DEFER``; the ring is still live then). Non-FLATTEN configs reuse the ring for it."""
    extra = dict(cfg.extra)
    ring = cfg.num_stages * (cfg.block_m + cfg.block_n) * cfg.block_k
    if not extra.get("TMA"):  # cp.async kernel: the ring, and the conversion tile reuses it
        return ring + 2048
    epilogue = 0
    if extra.get("FLATTEN"):
        epilogue = cfg.block_m * cfg.block_n * out_bytes // (2 if extra.get("DEFER") else 1)
    return ring + 2048 + epilogue


def is_tma(cfg: GemmConfig) -> bool:
    return dict(cfg.extra).get("TMA", False)


@functools.cache
def block_config_set() -> str:
    """``PRIMUS_TURBO_FP8_BLOCK_CONFIGS``: ``v1`` (per-K-block product tile, one program per
    SM), ``v2`` (adds the rescaled-accumulator tiles and 2 programs per SM on sm_90), ``v3``
    (default: the six measured winners of the TMA and the pointer kernel, sm_90) or ``tma``
    (every TMA config, to time them alone). Arches without a list fall back: v3/tma -> v2 ->
    v1; a TMA config is skipped for operands TMA cannot describe. Read once per process."""
    import os

    value = os.environ.get("PRIMUS_TURBO_FP8_BLOCK_CONFIGS", "v3").strip().lower() or "v3"
    if value not in BLOCK_CONFIG_SETS:
        raise ValueError(
            f"primus_turbo: PRIMUS_TURBO_FP8_BLOCK_CONFIGS expected one of "
            f"{BLOCK_CONFIG_SETS}, got {value!r}"
        )
    return value


def fp8_configs(
    family: ArchFamily, mode: int = TENSOR, config_set: str | None = None
) -> tuple[GemmConfig, ...]:
    if mode != BLOCK:
        return _CONFIGS[family]
    chosen = config_set or block_config_set()
    if chosen == "tma" and family in _TMA_CONFIGS:
        return _TMA_CONFIGS[family]
    if chosen in ("v3", "tma") and family in _BLOCK_CONFIGS_V3:
        return _BLOCK_CONFIGS_V3[family]
    if chosen != "v1" and family in _BLOCK_CONFIGS_V2:
        return _BLOCK_CONFIGS_V2[family]
    return _BLOCK_CONFIGS[family]


def select_fp8_config(
    m: int, n: int, k: int, family: ArchFamily, cus: int, mode: int = TENSOR, tma_ok: bool = True
) -> GemmConfig:
    """The untuned choice (CPU, graph capture, ``PRIMUS_TURBO_TRITON_TUNE=0``). Blockwise v3 on
    sm_90: :func:`block_v3_choice`. Else the largest tile that still gives every CU a tile;
    else the smallest. ``tma_ok``: whether TMA configs may be chosen (the operands fit a
    descriptor)."""
    if mode == BLOCK and family == ArchFamily.HOPPER and block_config_set() == "v3":
        return block_v3_choice(m, n, cus, tma_ok)
    configs = tuple(c for c in fp8_configs(family, mode) if tma_ok or not is_tma(c))
    for cfg in configs:
        if -(-m // cfg.block_m) * -(-n // cfg.block_n) >= cus:
            return cfg
    return configs[-1]


def block_v3_choice(m: int, n: int, cus: int, tma_ok: bool) -> GemmConfig:
    """The run-4.2 winner per shape class: 128x128 w4 with 2 programs per SM (TMA, or the
    pointer kernel when TMA cannot describe the operands), except when its tiles leave the
    second round of resident programs at most half full (``2*cus < tiles <= 3*cus``, e.g.
    DeepSeek-V3 q_a 4096x1536: 384 tiles on 264 programs), where 64x128 with 3 per SM has
    about twice the tiles for 1.5x the programs (q_a: 948 vs 935 tuner TFLOPS). Narrow N below
    one round (kv_a, 160 tiles) stays 128x128 (695 vs 649)."""
    big, small = (_V3_TMA_W4, _V3_TMA_64) if tma_ok else (_V3_PTR_W4, _V3_PTR_64)
    tiles = -(-m // 128) * -(-n // 128)
    resident = cus * big.programs_per_cu
    return small if resident < tiles <= resident * 3 // 2 else big


@functools.cache
def _interpreting() -> bool:
    return triton_interpret()


_tuned: dict[tuple, GemmConfig] = {}


def _launch(a, b, c, sa, sb, mode, sa_group, sb_group, sa_strides, sb_strides, cfg, family):
    m, k = a.shape
    n = b.shape[0]
    tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
    resident = num_compute_units(a.device) * cfg.programs_per_cu
    programs = tiles if family == ArchFamily.CPU else min(tiles, resident)
    if is_tma(cfg):
        from primus_turbo.triton.gemm.gemm_fp8_block_tma import launch_block_tma

        launch_block_tma(a, b, c, sa, sb, sa_group, sb_group, sa_strides, sb_strides, cfg,
                         programs, _interpreting())  # fmt: skip
        return
    gemm_fp8_kernel[(programs,)](
        a, b, c, sa, sb, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        c.stride(0), c.stride(1), *sa_strides, *sb_strides, programs,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        EVEN_K=k % cfg.block_k == 0, SCALE_MODE=mode, SA_GROUP=sa_group, SB_GROUP=sb_group,
        SCALE_K=128, UPCAST=_interpreting(), **cfg.options,
    )  # fmt: skip


def _scale_strides(s: torch.Tensor) -> tuple[int, int]:
    if s.dim() == 0:
        return (0, 0)
    if s.dim() == 1:
        return (s.stride(0), 0)
    return (s.stride(0), s.stride(1))


def gemm_fp8_triton(
    a: torch.Tensor,
    b: torch.Tensor,
    sa: torch.Tensor,
    sb: torch.Tensor,
    mode: int,
    out_dtype: torch.dtype,
    sa_group: int = 1,
    sb_group: int = 1,
) -> torch.Tensor:
    """``(a * sa) @ (b * sb)^T`` for fp8 ``a [M, K]``, ``b [N, K]`` (any strides).

    Scales: TENSOR 0-d; ROW ``sa [M]`` / ``sb [N]`` (any view with that many elements along
    dim 0, e.g. ``[M, 1]``); BLOCK ``sa [M / SA_GROUP, K / 128]``, ``sb [N / SB_GROUP, K/128]``
    (any strides). BLOCK needs the config's BLOCK_K to divide 128.
    """
    m, k = a.shape
    n = b.shape[0]
    c = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if m == 0 or n == 0:
        return c
    if k == 0:
        return c.zero_()
    family = arch_family(a.device)
    sa_st, sb_st = _scale_strides(sa), _scale_strides(sb)
    args = (a, b, c, sa, sb, mode, sa_group, sb_group, sa_st, sb_st)
    cfg = _pick(args, m, n, k, family)
    _launch(*args, cfg, family)
    global last_config
    last_config = cfg
    return c


last_config: GemmConfig | None = None  # the config of the latest launch (benchmark tables)


def _pick(args, m, n, k, family) -> GemmConfig:
    cus = num_compute_units(args[0].device)
    a, b = args[0], args[1]
    tma_ok = args[5] == BLOCK and _tma_usable(a, b)
    if family == ArchFamily.CPU or not _tune_env():
        return select_fp8_config(m, n, k, family, cus, args[5], tma_ok)
    key = _tune_key(args, m, n, k, tma_ok)
    cfg = _tuned.get(key)
    if cfg is None and not _tuning_enabled():  # a graph capture: the tuned config if the shape
        return select_fp8_config(m, n, k, family, cus, args[5], tma_ok)  # ran before, else this
    if cfg is None:
        timings = {}
        out_bytes = args[2].element_size()
        for cand in fp8_configs(family, args[5]):
            if is_tma(cand) and not tma_ok:
                continue
            if (args[5] == BLOCK and family == ArchFamily.HOPPER
                    and block_smem_bytes(cand, out_bytes) > SM90_SMEM_PER_BLOCK):  # fmt: skip
                continue
            try:
                timings[cand] = triton.testing.do_bench(
                    lambda cand=cand: _launch(*args, cand, family), warmup=5, rep=20
                )
            except Exception:  # e.g. out of shared memory on this chip
                continue
        guess = select_fp8_config(m, n, k, family, cus, args[5], tma_ok)
        cfg = min(timings, key=timings.get) if timings else guess
        _tuned[key] = cfg
        if _tune_log():  # every candidate's time, for choosing the lists and the heuristic
            flops = 2.0 * m * n * k
            ranked = sorted(timings.items(), key=lambda kv: kv[1])
            print(f"[fp8 tune] mode={args[5]} M={m} N={n} K={k} " + " ".join(
                f"{c.name}_cu{c.programs_per_cu}:{flops / t / 1e9:.0f}" for c, t in ranked
            ) + f" (TFLOPS) heuristic={guess.name}_cu{guess.programs_per_cu} at "
              f"{timings.get(cfg, 0.0) / timings.get(guess, math.inf):.3f} of best",
              flush=True)  # fmt: skip
    return cfg


def _tune_key(args, m: int, n: int, k: int, tma_ok: bool) -> tuple:
    a, b = args[0], args[1]
    return (m, n, k, a.dtype, b.dtype, args[2].dtype, args[5], args[6], args[7],
            a.stride(1) == 1, a.device, block_config_set(), tma_ok)  # fmt: skip


def _tma_usable(a: torch.Tensor, b: torch.Tensor) -> bool:
    """TMA descriptors: a CUDA sm_90+ device (or the interpreter) and aligned operands."""
    if a.device.type == "cuda" and (
        torch.version.hip is not None or torch.cuda.get_device_capability(a.device)[0] < 9
    ):
        return False
    from primus_turbo.triton.gemm.gemm_fp8_block_tma import tma_usable

    return tma_usable(a, b)


@functools.cache
def _tune_log() -> bool:
    """``PRIMUS_TURBO_FP8_TUNE_LOG=1``: print every tuner candidate's TFLOPS per shape."""
    from primus_turbo.pytorch.core.checks import env_flag

    return env_flag("PRIMUS_TURBO_FP8_TUNE_LOG", False)


@functools.cache
def _tune_env() -> bool:
    from primus_turbo.pytorch.core.checks import env_flag

    return env_flag("PRIMUS_TURBO_TRITON_TUNE", True)


def _tuning_enabled() -> bool:
    """``PRIMUS_TURBO_TRITON_TUNE`` (read once) and not inside a CUDA graph capture (checked on
    every call: a shape first seen during a capture gets the heuristic, never a timing loop)."""
    from primus_turbo.pytorch.core.platform import is_graph_capturing

    return _tune_env() and not is_graph_capturing()


# ---- ahead-of-time check -------------------------------------------------------------------

_AOT_FAMILY = {"gfx942": ArchFamily.CDNA3, "gfx950": ArchFamily.CDNA4, "sm_90": ArchFamily.HOPPER}


def aot_specs(target: str) -> list[AotSpec]:
    """NT fp8 (K-contiguous A and B, bf16 out) for every config and scale mode; e4m3 is FNUZ
    (``fp8e4b8``) on gfx942 and OCP (``fp8e4nv``) on gfx950 / sm_90."""
    assert target in AOT_TARGETS, target
    family = _AOT_FAMILY[target]
    fp8 = "fp8e4b8" if target == "gfx942" else "fp8e4nv"
    sig = {
        "a_ptr": f"*{fp8}", "b_ptr": f"*{fp8}", "c_ptr": "*bf16", "sa_ptr": "*fp32",
        "sb_ptr": "*fp32", "M": "i32:16", "N": "i32:16", "K": "i32:16", "stride_am": "i32:16",
        "stride_ak": "i32:1", "stride_bn": "i32:16", "stride_bk": "i32:1", "stride_cm": "i32:16",
        "stride_cn": "i32:1", "stride_sam": "i32", "stride_sak": "i32", "stride_sbn": "i32",
        "stride_sbk": "i32", "num_programs": "i32",
    }  # fmt: skip
    default = select_fp8_config(8192, 8192, 8192, family, 132 if target == "sm_90" else 304)
    specs = []
    modes = ((TENSOR, "tensor", (1, 1)), (ROW, "row", (1, 1)), (BLOCK, "block", (1, 128)))
    for mode, name, groups in modes:
        cands = fp8_configs(family, mode, "v1")
        if mode == BLOCK:  # both candidate sets, each config once
            cands = tuple({c.name: c for c in cands + fp8_configs(family, mode, "v2")}.values())
        for cfg in cands:
            consts = {k: v for k, v in cfg.extra if k.isupper()}
            opts = {k: v for k, v in cfg.options.items() if not k.isupper()}
            specs.append(
                AotSpec(
                    f"gemm_fp8_{name}_{fp8}_{cfg.name}",
                    gemm_fp8_kernel,
                    sig,
                    {
                        **cfg.tile_constexprs,
                        "EVEN_K": True,
                        "SCALE_MODE": mode,
                        "SA_GROUP": groups[0],
                        "SB_GROUP": groups[1],
                        "SCALE_K": 128,
                        "UPCAST": False,
                        "RESCALE": False,
                        **consts,
                    },  # fmt: skip
                    opts,
                    default=cfg == default and mode == TENSOR,
                )
            )
    if family in _TMA_CONFIGS:
        from primus_turbo.triton.gemm.gemm_fp8_block_tma import aot_specs as tma_specs

        specs += tma_specs(fp8, _TMA_CONFIGS[family])
    return specs
