"""Wgrad plan ``tmavd`` (session 13): per-group TMA descriptors built on the device.

``variable_k_tma_kernel`` (plans ``tma`` / ``tmavs``) reads a group's whole ``BLOCK_K``-row
steps through descriptors over all of ``X [M, P]`` / ``Y [M, Q]`` and its last ``m_g % BLOCK_K``
rows through one masked pointer step after the pipelined loop: a global round trip and an MMA
on register operands that nothing overlaps, once per output tile. Here each program builds,
once per group it has tiles in, descriptors over just that group's rows (``[m_g, P]`` and
``[m_g, Q]``, ``tl.make_tensor_descriptor``): the TMA unit zero-fills the rows past ``m_g``,
so the last partial step is one more iteration of the same pipelined loop. The tile order
(tile ``w`` by program ``w % programs``) and the MMA order are those of ``tmavs``, so the output
is bitwise the same. The store is ``tmavs``'s (``store_wgrad_halves``: two TMA stores of the
column halves through the host descriptor over ``C [G, P, Q]``).

CUDA sm_90 only (``tma_usable`` rules); device-built descriptors live in Triton's global
scratch (128 B per descriptor and program), allocated at launch through ``triton.set_allocator``
(``ensure_allocator``: a torch allocation on the launch stream, also under graph capture).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from primus_turbo.triton.gemm.gemm_kernel import _tile_coords
from primus_turbo.triton.grouped_gemm.grouped_gemm_kernel import _group_rows
from primus_turbo.triton.grouped_gemm.grouped_gemm_tma import store_wgrad_halves


@triton.jit
def variable_k_desc_kernel(
    x_ptr, y_ptr, c_desc, offs_ptr, M, P, Q, G, stride_xm, stride_ym, num_programs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """``C[g] = X_g^T @ Y_g`` for every group, ``cdiv(m_g, BLOCK_K)`` TMA steps per tile."""
    pid = tl.program_id(0)
    num_pid_p = tl.cdiv(P, BLOCK_M)
    num_pid_q = tl.cdiv(Q, BLOCK_N)
    per_group = num_pid_p * num_pid_q
    for g in range(0, G):
        w0 = g * per_group
        first = w0 + (pid + num_programs - w0 % num_programs) % num_programs
        if first < w0 + per_group:  # this program has tiles of group g
            start, end = _group_rows(offs_ptr, g, G, M)
            m_g = (end - start).to(tl.int32)
            rows = tl.maximum(m_g, 1)  # an empty group runs no step; keep the shape valid
            x_desc = tl.make_tensor_descriptor(
                x_ptr + start * stride_xm, shape=[rows, P], strides=[stride_xm, 1],
                block_shape=[BLOCK_K, BLOCK_M],
            )  # fmt: skip
            y_desc = tl.make_tensor_descriptor(
                y_ptr + start * stride_ym, shape=[rows, Q], strides=[stride_ym, 1],
                block_shape=[BLOCK_K, BLOCK_N],
            )  # fmt: skip
            for w in range(first, w0 + per_group, num_programs):
                pid_p, pid_q = _tile_coords(w - w0, num_pid_p, num_pid_q, GROUP_M)
                p0 = pid_p * BLOCK_M
                q0 = pid_q * BLOCK_N
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for kt in range(0, tl.cdiv(m_g, BLOCK_K)):
                    x = x_desc.load([kt * BLOCK_K, p0])
                    y = y_desc.load([kt * BLOCK_K, q0])
                    if UPCAST:
                        x = x.to(tl.float32)
                        y = y.to(tl.float32)
                    acc = tl.dot(x.T, y, acc)
                store_wgrad_halves(c_desc, acc, g, p0, q0, BLOCK_M, BLOCK_N)


def _torch_alloc(size: int, alignment: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_allocator() -> None:
    """Triton's global-scratch allocator for this thread (a ContextVar: the autograd device
    thread starts without one), unless the caller already set their own."""
    from triton.runtime import _allocation

    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_torch_alloc)


def vk_desc_ok(x: torch.Tensor, y: torch.Tensor, c: torch.Tensor) -> bool:
    """``tmavd`` runs where ``tmavs`` does: descriptor-capable x / y (16-byte aligned rows and
    base), a TMA-storable ``c``, 2-byte elements (else the launcher falls back to ``tma``)."""
    from primus_turbo.triton.grouped_gemm.grouped_gemm_tma import (
        variable_k_tma_usable,
        vk_tma_store_ok,
    )

    return variable_k_tma_usable(x, y, False) and vk_tma_store_ok(c)


def launch_variable_k_desc(x, y, c, group_offs, num_groups, cfg, programs, upcast) -> None:
    """``c[g] = x_g^T @ y_g`` with ``variable_k_desc_kernel``; ``c`` as for ``tmavs``
    (``vk_tma_store_ok``), x / y with 16-byte aligned rows (``variable_k_tma_usable``)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from primus_turbo.triton.host_tma import ensure_context

    ensure_context(x.device)
    ensure_allocator()
    m, p = x.shape
    q = y.shape[1]
    c_desc = TensorDescriptor.from_tensor(c, [1, cfg.block_m, cfg.block_n // 2])
    variable_k_desc_kernel[(programs,)](
        x, y, c_desc, group_offs, m, p, q, num_groups, x.stride(0), y.stride(0), programs,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        UPCAST=upcast, **cfg.options,
    )  # fmt: skip


def aot_specs(target: str) -> list:
    """sm_90 only: ``tmavd`` on every TMA wgrad tile, bf16."""
    from primus_turbo.pytorch.core.platform import ArchFamily
    from primus_turbo.triton.aot import AotSpec
    from primus_turbo.triton.grouped_gemm.grouped_gemm_configs import tma_configs

    if target != "sm_90":
        return []
    specs = []
    for cfg in tma_configs(ArchFamily.HOPPER, wgrad=True):
        bm, bn = cfg.block_m, cfg.block_n
        sig = {"x_ptr": "*bf16", "y_ptr": "*bf16", "c_desc": f"tensordesc<bf16[1,{bm},{bn // 2}]>",
               "offs_ptr": "*i64", "M": "i32", "P": "i32:16", "Q": "i32:16", "G": "i32",
               "stride_xm": "i32:16", "stride_ym": "i32:16", "num_programs": "i32"}  # fmt: skip
        cx = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": cfg.block_k, "GROUP_M": cfg.group_m,
              "UPCAST": False}  # fmt: skip
        specs.append(AotSpec(f"grouped_gemm_variable_k_tmavd_bf16_{cfg.name}",
                             variable_k_desc_kernel, sig, cx, cfg.options))  # fmt: skip
    return specs
