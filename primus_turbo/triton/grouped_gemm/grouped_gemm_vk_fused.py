"""Grouped GEMM wgrad, "fused" variant (a candidate of the wgrad tuner; forced with
``PRIMUS_TURBO_GROUPED_GEMM_VK=fused``): ``C[g] = X_g^T @ Y_g`` with ONE pipelined loop over
every (output tile, K step) pair of a program (CUDA sm_90+, TMA operand loads).

Why: ``variable_k_tma_kernel`` runs a separate K loop per output tile (the group's row count is
the trip count, so Triton cannot flatten the tile and K loops: ``FuseNestedLoops`` needs inner
bounds invariant to the outer loop), then one masked pointer step for the group's last
``m_g % BLOCK_K`` rows and the store. Each tile therefore pays the pipeline fill, the exposed
latency of the masked step and the epilogue without overlap: with ~32 K steps per tile
(DeepSeek-V3, ~2048 rows per expert) that is about a tenth of the tile's time, and the H200
wgrad ran at 0.86-0.97x torch._grouped_mm (run 4.2).

How: the loop is linearised by hand, as the fused loops that ``tl.range(..., flatten=True)``
emits: the loop counter runs over this program's total K steps (computed up front from the
group table); a new tile starts when the previous one's steps are done, and the last step of a
tile stores and resets the accumulator (in an ``if``), so the software pipeliner issues the
next tiles' first TMA loads while this tile finishes. For the pipeliner to take the loop
(sm_90 TTGIR: prologue copies before the loop, 6 TMA copy sites like the ``tma`` kernel's K
loop), the tile bookkeeping must stay in its first stage: branch-free selects, no loads (the
group's rows come from the ``[G_PAD]`` table in registers through one two-value reduction
per step), and every loop-carried value (tile, step, step count) feeding this step's load
coordinates. With the bookkeeping in an ``if``, through scalar loads of the offsets, or with
the step counter only used by the store, the scheduler put a carried value in a later stage
and every TMA copy stayed synchronous.
Every step is a TMA load; the rows of a step past the group's end (the last, partial step;
empty groups get one all-masked step so their block is written as zeros) are zeroed in the X
tile, which is the MMA's A operand taken from registers; Y rows past the end (the next
group's first rows, or zero fill past ``M``) then meet zeros. Caveat: a non-finite value in
those rows of Y gives ``0 * inf = nan`` in this group's block (the ``tma`` / ``table``
kernels do not read them).
"""

from __future__ import annotations

import triton
import triton.language as tl

from primus_turbo.triton.gemm.gemm_kernel import _tile_coords


@triton.jit
def _add2(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def variable_k_fused_kernel(
    x_desc, y_desc, c_ptr, offs_ptr, M, P, Q, G,
    stride_cg, stride_cp, stride_cq, num_programs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, G_PAD: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    num_pid_p = tl.cdiv(P, BLOCK_M)
    num_pid_q = tl.cdiv(Q, BLOCK_N)
    per_group = num_pid_p * num_pid_q
    # this program's K steps: tiles w = pid + i * num_programs; group g holds the w in
    # [g * per_group, (g + 1) * per_group), each with max(cdiv(m_g, BLOCK_K), 1) steps
    gi = tl.arange(0, G_PAD)
    real = gi < G
    lo = tl.load(offs_ptr + tl.minimum(gi, G), mask=real, other=0)
    hi = tl.load(offs_ptr + tl.minimum(gi + 1, G), mask=real, other=0)
    lo = tl.minimum(tl.maximum(lo, 0), M).to(tl.int32)
    hi = tl.minimum(tl.maximum(hi, lo), M).to(tl.int32)
    steps_g = tl.maximum(tl.cdiv(hi - lo, BLOCK_K), 1)
    # tiles of this program below index x: cdiv(x - pid, num_programs) for x > pid, else 0
    below_hi = tl.maximum(tl.cdiv((gi + 1) * per_group - pid, num_programs), 0)
    below_lo = tl.maximum(tl.cdiv(gi * per_group - pid, num_programs), 0)
    total = tl.sum(tl.where(real, (below_hi - below_lo) * steps_g, 0), axis=0)

    offs_k = tl.arange(0, BLOCK_K)
    rp0 = tl.arange(0, BLOCK_M)
    rq0 = tl.arange(0, BLOCK_N)
    tile = pid - num_programs
    kt = -1
    steps = 0
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, total):
        # branch-free bookkeeping, no loads (the group table is in registers), and every
        # loop-carried value feeds this step's load coordinates: the scheduler then keeps it
        # all in the first pipeline stage (a carried value computed in a later stage, or one
        # behind a scalar load, is a cross-stage recurrence and the loop stays unpipelined)
        new = kt + 1 == steps
        tile = tl.where(new, tile + num_programs, tile)
        kt = tl.where(new, 0, kt + 1)
        g = tile // per_group
        pid_p, pid_q = _tile_coords(tile - g * per_group, num_pid_p, num_pid_q, GROUP_M)
        here = gi == g
        start, end = tl.reduce((tl.where(here, lo, 0), tl.where(here, hi, 0)), 0, _add2)
        steps = tl.maximum(tl.cdiv(end - start, BLOCK_K), 1)
        p0 = pid_p * BLOCK_M
        q0 = pid_q * BLOCK_N
        row = start + tl.minimum(kt, steps - 1) * BLOCK_K
        x = x_desc.load([row, p0])
        y = y_desc.load([row, q0])
        x = tl.where((row + offs_k)[:, None] < end, x, tl.zeros_like(x))
        if UPCAST:
            x = x.to(tl.float32)
            y = y.to(tl.float32)
        acc = tl.dot(x.T, y, acc)
        if kt + 1 == steps:  # the tile's last step: store, reset
            rp = p0 + rp0
            rq = q0 + rq0
            c_ptrs = c_ptr + g.to(tl.int64) * stride_cg + rp.to(tl.int64)[:, None] * stride_cp
            c_ptrs += rq.to(tl.int64)[None, :] * stride_cq
            mask = (rp[:, None] < P) & (rq[None, :] < Q)
            tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)


def launch_variable_k_fused(x, y, c, group_offs, num_groups, cfg, programs, upcast) -> None:
    """``c[g] = x_g^T @ y_g`` with ``variable_k_fused_kernel`` (operands as for
    ``launch_variable_k_tma``: 2-byte, unit column stride, 16-byte aligned rows)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, p = x.shape
    q = y.shape[1]
    x_desc = TensorDescriptor.from_tensor(x, [cfg.block_k, cfg.block_m])
    y_desc = TensorDescriptor.from_tensor(y, [cfg.block_k, cfg.block_n])
    variable_k_fused_kernel[(programs,)](
        x_desc, y_desc, c, group_offs, m, p, q, num_groups,
        c.stride(0), c.stride(1), c.stride(2), programs,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        G_PAD=triton.next_power_of_2(max(num_groups, 2)), UPCAST=upcast, **cfg.options,
    )  # fmt: skip


def aot_specs(target: str) -> list:
    """sm_90 only: the fused wgrad, bf16, the tiles the tuner times (``HOPPER_WINNERS``; every
    other TMA tile also compiles without spills: 145-254 registers, checked once)."""
    from primus_turbo.pytorch.core.platform import ArchFamily
    from primus_turbo.triton.aot import AotSpec
    from primus_turbo.triton.grouped_gemm.grouped_gemm_configs import HOPPER_WINNERS, tma_configs

    if target != "sm_90":
        return []
    specs = []
    timed = {name for variant, name in HOPPER_WINNERS["vk"] if variant == "fused"}
    for cfg in [c for c in tma_configs(ArchFamily.HOPPER) if c.name in timed]:
        bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
        sig = {"x_desc": f"tensordesc<bf16[{bk},{bm}]>", "y_desc": f"tensordesc<bf16[{bk},{bn}]>",
               "c_ptr": "*bf16", "offs_ptr": "*i64", "M": "i32", "P": "i32:16", "Q": "i32:16",
               "G": "i32", "stride_cg": "i32:16", "stride_cp": "i32:16", "stride_cq": "i32:1",
               "num_programs": "i32"}  # fmt: skip
        constexprs = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": cfg.group_m,
                      "G_PAD": 256, "UPCAST": False}  # fmt: skip
        specs.append(AotSpec(f"grouped_gemm_variable_k_fused_bf16_{cfg.name}",
                             variable_k_fused_kernel, sig, constexprs, cfg.options))  # fmt: skip
    return specs
