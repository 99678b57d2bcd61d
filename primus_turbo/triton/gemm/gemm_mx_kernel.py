"""MX GEMM (MXFP8 / MXFP4) in Triton through ``tl.dot_scaled``: ``C = A @ B^T``.

``A [M, K / PACK_A]`` and ``B [N, K / PACK_B]`` hold fp8 values (PACK 1) or E2M1 pairs packed in
bytes (PACK 2, element ``2i`` in the low nibble); scales are E8M0 bytes, one per 32 values along K:
``sa [M, K / 32]``, ``sb [N, K / 32]``, any strides (MXFP8 quantization stores them outer-dim-major,
MXFP4 row-major). K must be a multiple of ``BLOCK_K`` (the launcher's
caller checks K % 128 == 0). Native on gfx950; on sm_90 Triton emulates the scaled dot (upcast to
bf16 + wgmma). Not available on gfx942 and not in the CPU interpreter (triton 3.6).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from primus_turbo.pytorch.core.platform import ArchFamily, arch_family, num_compute_units
from primus_turbo.triton.aot import AOT_TARGETS, AotSpec
from primus_turbo.triton.gemm.gemm_configs import GemmConfig
from primus_turbo.triton.gemm.gemm_kernel import _tile_coords

MX_FORMAT = {
    torch.float8_e4m3fn: "e4m3",
    torch.float8_e5m2: "e5m2",
    torch.uint8: "e2m1",  # packed FP4
}


@triton.jit
def gemm_mx_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    sa_ptr,
    sb_ptr,
    M,
    N,
    K,
    stride_am,
    stride_bn,
    stride_cm,
    stride_sam,
    stride_sak,
    stride_sbn,
    stride_sbk,
    num_programs,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    FMT_A: tl.constexpr,
    FMT_B: tl.constexpr,
    PACK_A: tl.constexpr,
    PACK_B: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    offs_ka = tl.arange(0, BLOCK_K // PACK_A)
    offs_kb = tl.arange(0, BLOCK_K // PACK_B)
    offs_s = tl.arange(0, BLOCK_K // 32)
    for tile_id in range(pid, num_tiles, num_programs):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rm64 = rm.to(tl.int64)
        rn64 = rn.to(tl.int64)
        mask_m = rm < M
        mask_n = rn < N
        a_ptrs = a_ptr + rm64[:, None] * stride_am + offs_ka[None, :]
        b_ptrs = b_ptr + rn64[None, :] * stride_bn + offs_kb[:, None]
        sa_ptrs = sa_ptr + rm64[:, None] * stride_sam + offs_s[None, :] * stride_sak
        sb_ptrs = sb_ptr + rn64[:, None] * stride_sbn + offs_s[None, :] * stride_sbk
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for _ in range(0, tl.cdiv(K, BLOCK_K)):
            # rows past M / columns past N only reach output elements that are not stored
            a = tl.load(a_ptrs, mask=mask_m[:, None])
            b = tl.load(b_ptrs, mask=mask_n[None, :])
            sa = tl.load(sa_ptrs, mask=mask_m[:, None], other=127)
            sb = tl.load(sb_ptrs, mask=mask_n[:, None], other=127)
            acc = tl.dot_scaled(a, sa, FMT_A, b, sb, FMT_B, acc)
            a_ptrs += BLOCK_K // PACK_A
            b_ptrs += BLOCK_K // PACK_B
            sa_ptrs += (BLOCK_K // 32) * stride_sak
            sb_ptrs += (BLOCK_K // 32) * stride_sbk
        c_ptrs = c_ptr + rm64[:, None] * stride_cm + rn64[None, :]
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def _cfg(bm, bn, bk, warps, stages, **extra) -> GemmConfig:
    return GemmConfig(bm, bn, bk, 8, warps, stages, 1, tuple(sorted(extra.items())))


_CONFIGS = {
    ArchFamily.HOPPER: (_cfg(128, 128, 128, 8, 3), _cfg(64, 128, 128, 8, 3)),  # w4 spills
    ArchFamily.CDNA4: (
        _cfg(256, 256, 128, 8, 2, matrix_instr_nonkdim=16),
        _cfg(128, 128, 128, 4, 2, matrix_instr_nonkdim=16),
    ),
}


def select_mx_config(m: int, n: int, family: ArchFamily, cus: int) -> GemmConfig:
    configs = _CONFIGS.get(family, _CONFIGS[ArchFamily.HOPPER])
    for cfg in configs:
        if -(-m // cfg.block_m) * -(-n // cfg.block_n) >= cus:
            return cfg
    return configs[-1]


def gemm_mx_triton(a, b, sa, sb, out_dtype, k: int) -> torch.Tensor:
    """``[M, N]`` product of MX operands (row-major, K contiguous; ``k`` = logical K)."""
    m, n = a.shape[0], b.shape[0]
    c = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if m == 0 or n == 0:
        return c
    family = arch_family(a.device)
    cfg = select_mx_config(m, n, family, num_compute_units(a.device))
    tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
    programs = min(tiles, num_compute_units(a.device))
    fa, fb = MX_FORMAT[a.dtype], MX_FORMAT[b.dtype]
    gemm_mx_kernel[(programs,)](
        a, b, c, sa, sb, m, n, k, a.stride(0), b.stride(0), c.stride(0), *sa.stride(),
        *sb.stride(), programs, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m, FMT_A=fa, FMT_B=fb, PACK_A=2 if fa == "e2m1" else 1,
        PACK_B=2 if fb == "e2m1" else 1, **cfg.options,
    )  # fmt: skip
    return c


def aot_specs(target: str) -> list[AotSpec]:
    """MXFP8 (e4m3) and MXFP4 (e2m1) NT on gfx950 and sm_90 only (no MX on gfx942)."""
    assert target in AOT_TARGETS, target
    if target == "gfx942":
        return []
    family = ArchFamily.CDNA4 if target == "gfx950" else ArchFamily.HOPPER
    specs = []
    # MXFP8 scales come outer-dim-major (row stride 1), MXFP4 scales row-major (K stride 1)
    for fmt, ptr, pack, srow, sk in (("e4m3", "fp8e4nv", 1, "i32:1", "i32:16"),
                                     ("e2m1", "u8", 2, "i32", "i32:1")):  # fmt: skip
        sig = {"a_ptr": f"*{ptr}", "b_ptr": f"*{ptr}", "c_ptr": "*bf16", "sa_ptr": "*u8",
               "sb_ptr": "*u8", "M": "i32:16", "N": "i32:16", "K": "i32:16",
               "stride_am": "i32:16", "stride_bn": "i32:16", "stride_cm": "i32:16",
               "stride_sam": srow, "stride_sak": sk, "stride_sbn": srow, "stride_sbk": sk,
               "num_programs": "i32"}  # fmt: skip
        for cfg in _CONFIGS[family]:
            specs.append(
                AotSpec(
                    f"gemm_mx_{fmt}_{cfg.name}",
                    gemm_mx_kernel,
                    sig,
                    {
                        **cfg.tile_constexprs,
                        "FMT_A": fmt,
                        "FMT_B": fmt,
                        "PACK_A": pack,
                        "PACK_B": pack,
                    },  # fmt: skip
                    cfg.options,
                    default=cfg == _CONFIGS[family][0],
                )
            )
    return specs
