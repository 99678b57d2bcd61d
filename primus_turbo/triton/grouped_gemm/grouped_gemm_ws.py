"""Grouped GEMM forward/dgrad with Triton's Hopper warp specialisation (plan ``ws``).

``tl.range(..., warp_specialize=True)`` on sm_90 splits a loop into a producer warpgroup
(TMA loads) and two consumer warpgroups (each half of the ``BLOCK_M`` rows through wgmma),
the CUTLASS "cooperative" layout that ``torch._grouped_mm`` uses; a ``num_warps=4`` config
launches 12 warps. Triton 3.6's pass only accepts a simple loop body: the one-pass tile lookup
of the flat kernels (vector reductions over the group table) inside the specialised loop
aborts the pass, so this kernel walks the groups in an outer scalar loop (two offset loads per
group) and specialises the loop over that group's tiles, rotating the program-to-tile
assignment by the tiles handed out so far (every program gets every ``num_programs``-th tile
of the global sequence, as in the other kernels). Rows past ``offs[G]`` are zeroed by a
second loop. Operand descriptors as in ``grouped_gemm_tma`` (rows of a neighbouring group /
expert only feed output rows / columns that the masked store drops; NN needs
``K % BLOCK_K == 0``). ``TMA_STORE`` (no plan uses it, see ``WS_VARIANTS``): full tiles
leave through a TMA store (two ``[BLOCK_M, BLOCK_N / 2]`` halves), ragged ones masked.
CUDA sm_90+ only (the interpreter runs it too, without the specialisation).

The warp-specialised wgrad (plans ``ws`` / ``wsm`` of the variable-K GEMM, session 5) was
removed: its GPU tests failed (wrong results) on the H200 in run 5.3.
"""

from __future__ import annotations

import triton
import triton.language as tl

from primus_turbo.triton.grouped_gemm.grouped_gemm_tma import _masked_store


@triton.jit
def grouped_gemm_ws_kernel(
    a_desc, b_desc, c_ptr, offs_ptr, M, N, K, G, stride_cm, stride_cn, num_programs, c_desc,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    TRANS_B: tl.constexpr, UPCAST: tl.constexpr, TMA_STORE: tl.constexpr, WS: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    rot = 0
    for g in range(0, G):
        start = tl.minimum(tl.maximum(tl.load(offs_ptr + g), 0), M).to(tl.int32)
        stop = tl.minimum(tl.maximum(tl.load(offs_ptr + g + 1), start), M).to(tl.int32)
        tiles_g = tl.cdiv(stop - start, BLOCK_M) * num_pid_n
        first = (pid - rot + num_programs) % num_programs
        for t in tl.range(first, tiles_g, num_programs, warp_specialize=WS):
            row0 = start + (t // num_pid_n) * BLOCK_M
            col0 = (t % num_pid_n) * BLOCK_N
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for kt in range(0, k_tiles):
                a = a_desc.load([row0, kt * BLOCK_K])
                if TRANS_B:
                    b = b_desc.load([g * N + col0, kt * BLOCK_K])
                    if UPCAST:
                        a = a.to(tl.float32)
                        b = b.to(tl.float32)
                    acc = tl.dot(a, b.T, acc)
                else:
                    b = b_desc.load([g * K + kt * BLOCK_K, col0])
                    if UPCAST:
                        a = a.to(tl.float32)
                        b = b.to(tl.float32)
                    acc = tl.dot(a, b, acc)
            if TMA_STORE:
                if row0 + BLOCK_M <= stop:
                    out = acc.to(c_desc.dtype).reshape(BLOCK_M, 2, BLOCK_N // 2).permute(0, 2, 1)
                    lo_half, hi_half = out.split()
                    c_desc.store([row0, col0], lo_half)
                    c_desc.store([row0, col0 + BLOCK_N // 2], hi_half)
                else:
                    _masked_store(c_ptr, acc, row0, col0, stop, N, stride_cm, stride_cn,
                                  BLOCK_M, BLOCK_N)  # fmt: skip
            else:
                _masked_store(c_ptr, acc, row0, col0, stop, N, stride_cm, stride_cn,
                              BLOCK_M, BLOCK_N)  # fmt: skip
        rot = (rot + tiles_g) % num_programs
    # rows past offs[G] (an over-allocated A): zeros
    tail0 = tl.minimum(tl.maximum(tl.load(offs_ptr + G), 0), M).to(tl.int64)
    tail_tiles = tl.cdiv((M - tail0).to(tl.int32), BLOCK_M) * num_pid_n
    zero = tl.zeros((BLOCK_M, BLOCK_N), dtype=c_ptr.dtype.element_ty)
    for t in range(pid, tail_tiles, num_programs):
        rows = tail0 + (t // num_pid_n) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
        rn = (t % num_pid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        c_ptrs = c_ptr + rows[:, None] * stride_cm + rn.to(tl.int64)[None, :] * stride_cn
        tl.store(c_ptrs, zero, mask=(rows[:, None] < M) & (rn[None, :] < N))


# plan name -> TMA_STORE. ("wss", True) is left out: with the TMA store in the loop body
# Triton 3.6 silently skips the specialisation (one 4-warp group, 128x256 fp32 accumulator:
# 2.3 KB of spills on sm_90).
WS_VARIANTS = {"ws": False}


def launch_ws(a, b, c, group_offs, trans_b, cfg, programs, upcast, variant: str) -> None:
    """``c = grouped(a, op(b))`` with ``grouped_gemm_ws_kernel`` (``variant``: a key of
    ``WS_VARIANTS``; warp specialisation on CUDA only, ``upcast`` means the interpreter)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, k = a.shape
    g = b.shape[0]
    n = b.shape[1] if trans_b else b.shape[2]
    a_desc = TensorDescriptor.from_tensor(a, [cfg.block_m, cfg.block_k])
    if trans_b:
        b_desc = TensorDescriptor.from_tensor(b.view(g * n, k), [cfg.block_n, cfg.block_k])
    else:
        b_desc = TensorDescriptor.from_tensor(b.view(g * k, n), [cfg.block_k, cfg.block_n])
    tma_store = WS_VARIANTS[variant]
    c_desc = TensorDescriptor.from_tensor(c, [cfg.block_m, cfg.block_n // 2]) if tma_store else None
    grouped_gemm_ws_kernel[(programs,)](
        a_desc, b_desc, c, group_offs, m, n, k, g, c.stride(0), c.stride(1), programs, c_desc,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, TRANS_B=trans_b,
        UPCAST=upcast, TMA_STORE=tma_store, WS=a.is_cuda, **cfg.options,
    )  # fmt: skip


def aot_specs(target: str) -> list:
    """sm_90 only: the forward in NT and NN, every warp-specialised config."""
    from primus_turbo.pytorch.core.platform import ArchFamily
    from primus_turbo.triton.aot import AotSpec
    from primus_turbo.triton.grouped_gemm.grouped_gemm_configs import ws_configs

    if target != "sm_90":
        return []
    specs = []
    for cfg in ws_configs(ArchFamily.HOPPER):
        bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
        for lay, trans_b in (("nt", True), ("nn", False)):
            b_block = f"[{bn},{bk}]" if trans_b else f"[{bk},{bn}]"
            for variant, tma_store in WS_VARIANTS.items():
                sig = {"a_desc": f"tensordesc<bf16[{bm},{bk}]>",
                       "b_desc": f"tensordesc<bf16{b_block}>", "c_ptr": "*bf16",
                       "offs_ptr": "*i64", "M": "i32", "N": "i32:16", "K": "i32:16",
                       "G": "i32", "stride_cm": "i32:16", "stride_cn": "i32:1",
                       "num_programs": "i32"}  # fmt: skip
                cx = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "TRANS_B": trans_b,
                      "UPCAST": False, "TMA_STORE": tma_store, "WS": True}  # fmt: skip
                if tma_store:
                    sig["c_desc"] = f"tensordesc<bf16[{bm},{bn // 2}]>"
                else:
                    cx["c_desc"] = None
                name = f"grouped_gemm_{variant}_bf16_{lay}_{cfg.name}"
                specs.append(AotSpec(name, grouped_gemm_ws_kernel, sig, cx, cfg.options))
    return specs
