"""Scaled FP8 GEMM in Triton: ``C[M, N] = (A[M, K] * sa) @ (B[N, K] * sb)^T``, fp32 accumulation.

Operands are addressed by strides (the ops layer hands over K-contiguous A and B, which is what
Hopper's wgmma wants for fp8). Scale modes:
* ``TENSOR`` (0): scalar ``sa``, ``sb``; applied once in the epilogue.
* ``ROW`` (1): ``sa[M]``, ``sb[N]``; applied in the epilogue.
* ``BLOCK`` (2): per K-block of ``SCALE_K`` (128): ``sa[m // SA_GROUP, kb]``,
  ``sb[n // SB_GROUP, kb]`` multiply each K-tile's partial product in the main loop
  (``SA_GROUP``/``SB_GROUP`` = 1 for 1 x 128 blocks, 128 for 128 x 128 tiles).
Persistent grid with grouped tile order, as in gemm_kernel.py.
"""

from __future__ import annotations

import functools

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
            if SCALE_MODE == 2:
                kb = (kt * BLOCK_K) // SCALE_K
                sa = tl.load(sa_ptrs + kb * stride_sak, mask=mask_m, other=0.0)
                if SB_GROUP % BLOCK_N == 0:
                    # the N tile lies in one weight scale block: one scalar per K-block, and
                    # the promotion is a single FMA per element with a per-row factor (was a
                    # 2-D scale product + multiply + add, issued while the tensor cores wait)
                    sb = tl.load(sb_ptr + ((pid_n * BLOCK_N) // SB_GROUP) * stride_sbn
                                 + kb * stride_sbk)  # fmt: skip
                    acc += tl.dot(a, b) * (sa * sb)[:, None]
                else:
                    sb = tl.load(sb_ptrs + kb * stride_sbk, mask=mask_n, other=0.0)
                    acc += (tl.dot(a, b) * sa[:, None]) * sb[None, :]
            else:
                acc = tl.dot(a, b, acc)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        if SCALE_MODE == 0:
            acc = acc * (tl.load(sa_ptr) * tl.load(sb_ptr))
        elif SCALE_MODE == 1:
            sa = tl.load(sa_ptr + rm64 * stride_sam, mask=mask_m, other=0.0)
            sb = tl.load(sb_ptr + rn64 * stride_sbn, mask=mask_n, other=0.0)
            acc = acc * sa[:, None] * sb[None, :]
        c_ptrs = c_ptr + rm64[:, None] * stride_cm + rn64[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


# ---- configs and launcher ------------------------------------------------------------------


def _cfg(bm, bn, bk, warps, stages, **extra) -> GemmConfig:
    return GemmConfig(bm, bn, bk, 8, warps, stages, 1, tuple(sorted(extra.items())))


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


def fp8_configs(family: ArchFamily, mode: int = TENSOR) -> tuple[GemmConfig, ...]:
    return (_BLOCK_CONFIGS if mode == BLOCK else _CONFIGS)[family]


def select_fp8_config(
    m: int, n: int, k: int, family: ArchFamily, cus: int, mode: int = TENSOR
) -> GemmConfig:
    """The largest tile that still gives every CU a tile; else the smallest."""
    configs = fp8_configs(family, mode)
    for cfg in configs:
        if -(-m // cfg.block_m) * -(-n // cfg.block_n) >= cus:
            return cfg
    return configs[-1]


@functools.cache
def _interpreting() -> bool:
    return triton_interpret()


_tuned: dict[tuple, GemmConfig] = {}


def _launch(a, b, c, sa, sb, mode, sa_group, sb_group, sa_strides, sb_strides, cfg, family):
    m, k = a.shape
    n = b.shape[0]
    tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
    programs = tiles if family == ArchFamily.CPU else min(tiles, num_compute_units(a.device))
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
    return c


def _pick(args, m, n, k, family) -> GemmConfig:
    cus = num_compute_units(args[0].device)
    if family == ArchFamily.CPU or not _tuning_enabled():
        return select_fp8_config(m, n, k, family, cus, args[5])
    a, b = args[0], args[1]
    key = (m, n, k, a.dtype, b.dtype, args[2].dtype, args[5], a.stride(1) == 1, a.device)
    cfg = _tuned.get(key)
    if cfg is None:
        timings = {}
        for cand in fp8_configs(family, args[5]):
            try:
                timings[cand] = triton.testing.do_bench(
                    lambda cand=cand: _launch(*args, cand, family), warmup=5, rep=20
                )
            except Exception:  # e.g. out of shared memory on this chip
                continue
        cfg = min(timings, key=timings.get)
        _tuned[key] = cfg
    return cfg


@functools.cache
def _tuning_enabled() -> bool:
    import os

    from primus_turbo.pytorch.core.platform import is_graph_capturing

    return os.environ.get("PRIMUS_TURBO_TRITON_TUNE", "1").strip() != "0" and not (
        is_graph_capturing()
    )


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
        for cfg in fp8_configs(family, mode):
            specs.append(
                AotSpec(
                    f"gemm_fp8_{name}_{fp8}_{cfg.name}",
                    gemm_fp8_kernel,
                    sig,
                    {
                        "BLOCK_M": cfg.block_m,
                        "BLOCK_N": cfg.block_n,
                        "BLOCK_K": cfg.block_k,
                        "GROUP_M": cfg.group_m,
                        "EVEN_K": True,
                        "SCALE_MODE": mode,
                        "SA_GROUP": groups[0],
                        "SB_GROUP": groups[1],
                        "SCALE_K": 128,
                        "UPCAST": False,
                    },  # fmt: skip
                    cfg.options,
                    default=cfg == default and mode == TENSOR,
                )
            )
    return specs
