"""Opt-in TMA variant of the grouped GEMM forward for Hopper (``PRIMUS_TURBO_GROUPED_GEMM_TMA=1``).

Same math and in-kernel tile walk as ``grouped_gemm_kernel`` (see that module), but A and B
tiles arrive through host-built TMA descriptors instead of pointer loads:
* A is one descriptor over ``[M, K]``; a tile that crosses the end of its group reads rows of
  the next group, which only feed output rows this tile does not store (the store is masked).
* B is one descriptor over ``b`` viewed as ``[G * N, K]`` (``trans_b``) or ``[G * K, N]``; a tile
  past ``N`` reads the next expert's rows, which only feed masked-out columns. Past ``K`` (the
  ``[G * K, N]`` view) the next expert's rows meet A columns that the descriptor zero-fills.
  Out-of-range tiles at the end of a tensor are zero-filled by the hardware.
The store stays a masked pointer store (a TMA store would overwrite a neighbouring group).
CUDA sm_90 only; not used for the fp8 path or the wgrad. Needs 16-byte aligned row strides.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from primus_turbo.pytorch.core.checks import env_flag
from primus_turbo.triton.gemm.gemm_configs import GemmConfig
from primus_turbo.triton.gemm.gemm_kernel import _tile_coords
from primus_turbo.triton.grouped_gemm.grouped_gemm_kernel import _group_rows


@functools.cache
def tma_enabled() -> bool:
    return env_flag("PRIMUS_TURBO_GROUPED_GEMM_TMA", False)


def tma_usable(a: torch.Tensor, b: torch.Tensor, trans_b: bool) -> bool:
    """Descriptor constraints: CUDA sm_90+, 2-byte dtypes, unit inner strides, 16-byte rows."""
    if not (tma_enabled() and a.is_cuda and torch.version.hip is None):
        return False
    if torch.cuda.get_device_capability(a.device)[0] < 9 or a.element_size() != 2:
        return False
    if not (a.is_contiguous() and b.is_contiguous()):
        return False
    return (a.shape[1] * 2) % 16 == 0 and (b.shape[2] * 2) % 16 == 0


@triton.jit
def grouped_gemm_tma_kernel(
    a_desc,
    b_desc,
    c_ptr,
    offs_ptr,
    M,
    N,
    K,
    G,
    stride_cm,
    stride_cn,
    num_programs,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    TRANS_B: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    rot = 0
    for g in range(0, G + 1):
        start, end = _group_rows(offs_ptr, g, G, M)
        m_g = (end - start).to(tl.int32)
        num_pid_m = tl.cdiv(m_g, BLOCK_M)
        tiles_g = num_pid_m * num_pid_n
        first = (pid - rot + num_programs) % num_programs
        k_end = tl.where(g < G, k_tiles, 0)
        for t in range(first, tiles_g, num_programs):
            pid_m, pid_n = _tile_coords(t, num_pid_m, num_pid_n, GROUP_M)
            row0 = start.to(tl.int32) + pid_m * BLOCK_M
            col0 = pid_n * BLOCK_N
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for kt in range(0, k_end):
                a = a_desc.load([row0, kt * BLOCK_K])
                if TRANS_B:
                    b = b_desc.load([g * N + col0, kt * BLOCK_K])
                    acc = tl.dot(a, b.T, acc)
                else:
                    b = b_desc.load([g * K + kt * BLOCK_K, col0])
                    acc = tl.dot(a, b, acc)
            rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            rn = col0 + tl.arange(0, BLOCK_N)
            rows = start + rm.to(tl.int64)
            c_ptrs = c_ptr + rows[:, None] * stride_cm + rn.to(tl.int64)[None, :] * stride_cn
            mask = (rm[:, None] < m_g) & (rn[None, :] < N)
            tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)
        rot = (rot + tiles_g) % num_programs


def launch_tma(a, b, c, group_offs, trans_b: bool, cfg: GemmConfig, programs: int) -> None:
    """Launch the TMA kernel for ``c = grouped(a, op(b))`` (shapes as in grouped_gemm_triton)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, k = a.shape
    g = b.shape[0]
    n = b.shape[1] if trans_b else b.shape[2]
    a_desc = TensorDescriptor.from_tensor(a, [cfg.block_m, cfg.block_k])
    if trans_b:
        b_desc = TensorDescriptor.from_tensor(b.view(g * n, k), [cfg.block_n, cfg.block_k])
    else:
        b_desc = TensorDescriptor.from_tensor(b.view(g * k, n), [cfg.block_k, cfg.block_n])
    grouped_gemm_tma_kernel[(programs,)](
        a_desc,
        b_desc,
        c,
        group_offs,
        m,
        n,
        k,
        g,
        c.stride(0),
        c.stride(1),
        programs,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m,
        TRANS_B=trans_b,
        **cfg.options,
    )
