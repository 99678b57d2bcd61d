"""Dense GEMM with TMA operand loads (sm_90): the ``tma`` configs of ``gemm_kernel``.

Same tiles as ``gemm_kernel`` (plain ``BLOCK_M x BLOCK_N``, or composite ``BLOCK_M x (BLOCK_N +
BLOCK_N2)`` with two dots sharing the A tile), but A, B (and the narrow block B2) arrive through
host-built TMA descriptors instead of ``cp.async`` pointer loads: one thread issues each tile
copy and the wait is an mbarrier, so the K loop carries no address arithmetic, masks or
per-thread 16-byte copies (with a 16-column B2 block at BLOCK_K=64 the pointer kernel issues
8-byte ``cp.async``). Out-of-range rows, columns and K are zero-filled by the hardware, so
there are no load masks; the store is a masked pointer store. In this repository the TMA
grouped GEMM (bf16, same tiles) was picked over its pointer kernel on most H200 shapes (run
4.2). Needs a K-contiguous A, a K- or N-contiguous B, 16-byte aligned bases and row strides
(``tma_ok``); the launcher falls back to the pointer kernel otherwise. No split-K / stream-K.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from primus_turbo.triton.gemm.gemm_configs import GemmConfig
from primus_turbo.triton.gemm.gemm_kernel import _tile_coords


@triton.jit
def gemm_tma_kernel(
    a_desc, b_desc, b2_desc, c_ptr, M, N, K, stride_cm, stride_cn, num_programs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, TRANS_B: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_N2: tl.constexpr = 0, FLATTEN: tl.constexpr = False, WS: tl.constexpr = False,
):  # fmt: skip
    """``a_desc``: A ``[M, K]`` blocks ``[BLOCK_M, BLOCK_K]``. ``TRANS_B``: ``b_desc`` is B^T
    ``[N, K]`` in blocks ``[BLOCK_N, BLOCK_K]`` (``b2_desc`` ``[BLOCK_N2, BLOCK_K]``), else B
    ``[K, N]`` in blocks ``[BLOCK_K, BLOCK_N]`` (``[BLOCK_K, BLOCK_N2]``). ``b2_desc`` is unused
    when ``BLOCK_N2 == 0`` (the launcher passes ``b_desc``)."""
    TILE_N: tl.constexpr = BLOCK_N + BLOCK_N2
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, TILE_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile_id in tl.range(pid, num_tiles, num_programs, flatten=FLATTEN):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        row0 = pid_m * BLOCK_M
        col0 = pid_n * TILE_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc2 = tl.zeros((BLOCK_M, BLOCK_N2 if BLOCK_N2 > 0 else 16), dtype=tl.float32)
        for kt in tl.range(0, k_tiles, warp_specialize=WS):
            k0 = kt * BLOCK_K
            a = a_desc.load([row0, k0])
            if TRANS_B:
                b = b_desc.load([col0, k0]).T
            else:
                b = b_desc.load([k0, col0])
            if UPCAST:  # the interpreter's bf16 dot fault (see gemm_kernel)
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc)
            if BLOCK_N2 > 0:
                if TRANS_B:
                    b2 = b2_desc.load([col0 + BLOCK_N, k0]).T
                else:
                    b2 = b2_desc.load([k0, col0 + BLOCK_N])
                if UPCAST:
                    b2 = b2.to(tl.float32)
                acc2 = tl.dot(a, b2, acc2)
        rm64 = (row0 + tl.arange(0, BLOCK_M)).to(tl.int64)
        rn64 = (col0 + tl.arange(0, BLOCK_N)).to(tl.int64)
        mask_m = rm64[:, None] < M
        c_rows = c_ptr + rm64[:, None] * stride_cm
        out_ty = c_ptr.dtype.element_ty
        tl.store(c_rows + rn64[None, :] * stride_cn, acc.to(out_ty),
                 mask=mask_m & (rn64 < N)[None, :])  # fmt: skip
        if BLOCK_N2 > 0:
            rn2 = (col0 + BLOCK_N + tl.arange(0, BLOCK_N2)).to(tl.int64)
            tl.store(c_rows + rn2[None, :] * stride_cn, acc2.to(out_ty),
                     mask=mask_m & (rn2 < N)[None, :])  # fmt: skip


def tma_ok(a: torch.Tensor, b: torch.Tensor, m: int, n: int, k: int, sa, sb) -> bool:
    """Whether the descriptors can be built: A K-contiguous (``sa[1] == 1``), B K- or
    N-contiguous, 16-byte aligned bases and leading strides, at least 16 bytes per row."""
    size = a.element_size()
    if sa[1] != 1 or (sa[0] * size) % 16 or a.data_ptr() % 16 or b.data_ptr() % 16:
        return False
    if sb[0] == 1:  # B^T [N, K] rows
        lead, inner = sb[1], k
    elif sb[1] == 1:  # B [K, N] rows
        lead, inner = sb[0], n
    else:
        return False
    return (lead * size) % 16 == 0 and k * size >= 16 and inner * size >= 16 and m > 0


def launch_tma(a, b, c, m, n, k, sa, sb, cfg: GemmConfig, programs: int, upcast: bool,
               flatten: bool) -> None:  # fmt: skip
    """Launch ``gemm_tma_kernel`` for ``c = op(a) @ op(b)`` given as the strided views
    ``(m, k, sa)`` / ``(k, n, sb)`` of ``gemm_kernel._launch`` (``tma_ok`` must hold)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from primus_turbo.triton.host_tma import ensure_context

    ensure_context(a.device)
    bm, bn, bn2, bk = cfg.block_m, cfg.block_n, cfg.block_n2, cfg.block_k
    a_desc = TensorDescriptor(a, [m, k], [sa[0], 1], [bm, bk])
    trans_b = sb[0] == 1
    if trans_b:
        b_desc = TensorDescriptor(b, [n, k], [sb[1], 1], [bn, bk])
        b2_desc = TensorDescriptor(b, [n, k], [sb[1], 1], [bn2, bk]) if bn2 else b_desc
    else:
        b_desc = TensorDescriptor(b, [k, n], [sb[0], 1], [bk, bn])
        b2_desc = TensorDescriptor(b, [k, n], [sb[0], 1], [bk, bn2]) if bn2 else b_desc
    gemm_tma_kernel[(programs,)](
        a_desc, b_desc, b2_desc, c, m, n, k, c.stride(0), c.stride(1), programs,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.group_m, TRANS_B=trans_b, UPCAST=upcast,
        BLOCK_N2=bn2, FLATTEN=flatten, WS=cfg.ws, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )  # fmt: skip


def aot_specs_sm90(configs) -> list:
    """sm_90 specs (from ``gemm_kernel_aot``): bf16 NT (weights ``[N, K]``), descriptors typed
    by their block shapes."""
    from primus_turbo.triton.aot import AotSpec

    specs = []
    for cfg in configs:
        bm, bn, bn2, bk = cfg.block_m, cfg.block_n, cfg.block_n2, cfg.block_k
        sig = {
            "a_desc": f"tensordesc<bf16[{bm}, {bk}]>",
            "b_desc": f"tensordesc<bf16[{bn}, {bk}]>",
            "b2_desc": f"tensordesc<bf16[{bn2 or bn}, {bk}]>",
            "c_ptr": "*bf16", "M": "i32:16", "N": "i32:16", "K": "i32:16",
            "stride_cm": "i32:16", "stride_cn": "i32:1", "num_programs": "i32",
        }  # fmt: skip
        consts = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": cfg.group_m,
                  "TRANS_B": True, "UPCAST": False, "BLOCK_N2": bn2, "FLATTEN": False,
                  "WS": cfg.ws}  # fmt: skip
        opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
        specs.append(AotSpec(f"gemm_tma_bf16_{cfg.name}", gemm_tma_kernel, sig, consts, opts))
    return specs
