"""Grouped GEMM wgrad, plan ``vkf`` / ``vkfs`` (session 11, opt-in): ``C[g] = X_g^T @ Y_g``
with ONE pipelined loop over every (output tile, full K step) pair of a program, so the
next tile's first TMA loads are in flight during this tile's epilogue and that tile's tail
rows.

Why: ``variable_k_tma_kernel`` (plans ``tma`` / ``tmavs``) runs a separate K loop per output
tile (the trip count is the group's row count, so ``tl.range(flatten=True)`` cannot fuse the
tile and K loops: ``FuseNestedLoops`` needs inner bounds invariant to the outer loop). With
~2048 rows per expert (DeepSeek-V3, Mixtral-8x7B) a tile has only 32 K steps, and each pays
the pipeline fill, the masked tail step (``m_g % BLOCK_K`` rows, global-latency bound) and
the epilogue unhidden; the bf16 step is 0.97-0.99x torch._grouped_mm on these shapes.

How (the loop the fusion pass would emit, written by hand, as session 4's ``fused`` wgrad):
the counter runs over this program's total full K steps (from the group table, in registers);
a new tile starts when the previous tile's steps are done. A tile's last step (in an ``if``)
loads the NEXT tile's tail rows (the last ``m_g % BLOCK_K``: masked pointer loads, issued
before this tile's last MMA is waited for, so their latency hides behind it), stores this
tile, and starts the next tile's accumulator with one MMA of the tail rows into a fresh
accumulator; iteration 0 does this for the program's first tile as the last step of a
virtual tile that stores nothing. So:
* every loop step is a whole ``BLOCK_K``-row TMA step inside its group and both MMA operands
  come from shared memory (session 4's ``fused`` plan, 2x slower than ``tma`` and removed,
  masked its A operand in registers);
* the loop's MMA reads the carried accumulator directly and no non-MMA instruction writes it
  (a reset select after the MMA, or the tail MMA read from it in the ``if``, made ptxas
  serialise every wgmma: "C7515 ... wgmma.mma_async instructions are serialized", which also
  hit session 4's kernel); the sm_90 TTGIR keeps one wgmma in flight (``pendings = 1``);
* a group with fewer than ``BLOCK_K`` rows (no full step) gets one step whose TMA box starts
  at row ``M`` (past the tensor: the hardware zero-fills it).
Bookkeeping is branch-free and load-free (selects and one reduction over the ``[G_PAD]``
table) and every loop-carried value feeds the step's load coordinates, so the software
pipeliner keeps it in its first stage (4 TMA copies peeled before the loop; with the load row
not depending on the carried step count the loop compiled unpipelined). Summation order:
tail rows first, then the full steps (the ``tma`` plan: full steps, then the tail).
``TMA_STORE`` (``vkfs``): the tile leaves through ``c_desc`` (``[G, P, Q]``, two
``[1, BLOCK_M, BLOCK_N / 2]`` halves, clipped at ``P`` / ``Q``) as in ``tmavs``.
CUDA sm_90+ (host TMA descriptors) or the CPU interpreter.
"""

from __future__ import annotations

import triton
import triton.language as tl

from primus_turbo.triton.gemm.gemm_kernel import _tile_coords


@triton.jit
def _add2(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _tail_tile(x_ptr, y_ptr, start, end, p0, q0, P, Q, stride_xm, stride_ym,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               UPCAST: tl.constexpr):  # fmt: skip
    """The operands ``(xt [BLOCK_M, BLOCK_K], yt [BLOCK_K, BLOCK_N])`` of the last
    ``(end - start) % BLOCK_K`` rows of the group (masked pointer loads, zeros past them) for
    the output tile at ``(p0, q0)``."""
    n_full = (end - start) // BLOCK_K
    rem = (end - start) - n_full * BLOCK_K
    offs_k = tl.arange(0, BLOCK_K)
    rp = p0 + tl.arange(0, BLOCK_M)
    rq = q0 + tl.arange(0, BLOCK_N)
    r = (start + n_full * BLOCK_K).to(tl.int64) + offs_k.to(tl.int64)
    xt = tl.load(x_ptr + r[None, :] * stride_xm + rp.to(tl.int64)[:, None],
                 mask=(rp[:, None] < P) & (offs_k[None, :] < rem), other=0.0)  # fmt: skip
    yt = tl.load(y_ptr + r[:, None] * stride_ym + rq.to(tl.int64)[None, :],
                 mask=(rq[None, :] < Q) & (offs_k[:, None] < rem), other=0.0)  # fmt: skip
    if UPCAST:
        xt = xt.to(tl.float32)
        yt = yt.to(tl.float32)
    return xt, yt


@triton.jit
def _tile_rows(tile, per_group, num_pid_p, num_pid_q, gi, lo, hi,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):  # fmt: skip
    """``(g, p0, q0, start, end)`` of output tile ``tile`` (group ``g``'s rows
    ``[start, end)`` from the ``[G_PAD]`` table; a tile past the last group gets no rows)."""
    g = tile // per_group
    pid_p, pid_q = _tile_coords(tile - g * per_group, num_pid_p, num_pid_q, GROUP_M)
    here = gi == g
    start, end = tl.reduce((tl.where(here, lo, 0), tl.where(here, hi, 0)), 0, _add2)
    return g, pid_p * BLOCK_M, pid_q * BLOCK_N, start, end


@triton.jit
def variable_k_flat_kernel(
    x_desc, y_desc, x_ptr, y_ptr, c_ptr, offs_ptr, M, P, Q, G,
    stride_xm, stride_ym, stride_cg, stride_cp, stride_cq, num_programs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, G_PAD: tl.constexpr, UPCAST: tl.constexpr,
    c_desc=None, TMA_STORE: tl.constexpr = False,
):  # fmt: skip
    pid = tl.program_id(0)
    num_pid_p = tl.cdiv(P, BLOCK_M)
    num_pid_q = tl.cdiv(Q, BLOCK_N)
    per_group = num_pid_p * num_pid_q
    # group table in registers: rows [lo, hi) and loop steps max(full steps, 1) per group
    gi = tl.arange(0, G_PAD)
    real = gi < G
    lo = tl.load(offs_ptr + tl.minimum(gi, G), mask=real, other=0)
    hi = tl.load(offs_ptr + tl.minimum(gi + 1, G), mask=real, other=0)
    lo = tl.minimum(tl.maximum(lo, 0), M).to(tl.int32)
    hi = tl.minimum(tl.maximum(hi, lo), M).to(tl.int32)
    steps_g = tl.maximum((hi - lo) // BLOCK_K, 1)
    # this program's tiles are w = pid + i * num_programs; below index x there are
    # cdiv(x - pid, num_programs) of them (numerators >= -pid > -num_programs: never negative)
    below_hi = tl.cdiv((gi + 1) * per_group - pid, num_programs)
    below_lo = tl.cdiv(gi * per_group - pid, num_programs)
    total = tl.sum(tl.where(real, (below_hi - below_lo) * steps_g, 0), axis=0)

    # Iteration 0 is the last (and only) step of a virtual tile ``pid - num_programs`` that
    # stores nothing: it starts the accumulator of this program's first tile with that tile's
    # tail rows, as each tile's last step does for the next tile (a tail MMA before the loop
    # would keep its shared memory next to the operand ring: over sm_90's 227 KiB).
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    tile = pid - num_programs
    kt = -1
    steps = 1
    for _ in range(0, total + 1):
        # branch-free, load-free bookkeeping; every carried value feeds the load coordinates
        new = kt + 1 == steps
        tile = tl.where(new, tile + num_programs, tile)
        kt = tl.where(new, 0, kt + 1)
        real_tile = tile >= 0
        # (the virtual tile looks up tile 0: in-range coordinates for its zero-filled box)
        g, p0, q0, start, end = _tile_rows(tl.maximum(tile, 0), per_group, num_pid_p,
                                           num_pid_q, gi, lo, hi, BLOCK_M, BLOCK_N,
                                           GROUP_M)  # fmt: skip
        n_full = tl.where(real_tile, (end - start) // BLOCK_K, 0)
        steps = tl.maximum(n_full, 1)
        # no full step (or the virtual tile): a box past the tensor, zero-filled. The
        # ``steps``-clamped form keeps the carried ``steps`` in the load coordinates: without
        # it the loop is not pipelined
        row = tl.where(n_full > 0, start + tl.minimum(kt, steps - 1) * BLOCK_K, M)
        x = x_desc.load([row, p0])
        y = y_desc.load([row, q0])
        if UPCAST:
            x = x.to(tl.float32)
            y = y.to(tl.float32)
        acc = tl.dot(x.T, y, acc)
        if kt + 1 == steps:  # the tile's last step: store, then the next tile's tail rows
            # the next tile's tail operands first: their load latency overlaps this step's MMA
            _, p0n, q0n, sn, en = _tile_rows(tile + num_programs, per_group, num_pid_p,
                                             num_pid_q, gi, lo, hi, BLOCK_M, BLOCK_N,
                                             GROUP_M)  # fmt: skip
            xt, yt = _tail_tile(x_ptr, y_ptr, sn, en, p0n, q0n, P, Q, stride_xm, stride_ym,
                                BLOCK_M, BLOCK_N, BLOCK_K, UPCAST)  # fmt: skip
            if real_tile:
                rp = p0 + tl.arange(0, BLOCK_M)
                rq = q0 + tl.arange(0, BLOCK_N)
                if TMA_STORE:
                    half: tl.constexpr = BLOCK_N // 2
                    out = acc.to(c_desc.dtype).reshape(BLOCK_M, 2, half).permute(0, 2, 1)
                    lo_half, hi_half = out.split()
                    c_desc.store([g, p0, q0], lo_half.reshape(1, BLOCK_M, half))
                    c_desc.store([g, p0, q0 + half], hi_half.reshape(1, BLOCK_M, half))
                else:
                    c_ptrs = c_ptr + g.to(tl.int64) * stride_cg
                    c_ptrs += rp.to(tl.int64)[:, None] * stride_cp
                    c_ptrs += rq.to(tl.int64)[None, :] * stride_cq
                    mask = (rp[:, None] < P) & (rq[None, :] < Q)
                    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)
            acc = tl.dot(xt, yt)


def launch_variable_k_flat(
    x, y, c, group_offs, num_groups, cfg, programs, upcast, tma_store: bool = False
) -> None:
    """``c[g] = x_g^T @ y_g`` with ``variable_k_flat_kernel`` (operands as for
    ``launch_variable_k_tma``: 2-byte, unit column stride, 16-byte aligned rows; ``tma_store``:
    ``c`` fresh and contiguous with 16-byte rows, ``vk_tma_store_ok``)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from primus_turbo.triton.host_tma import ensure_context

    ensure_context(x.device)
    m, p = x.shape
    q = y.shape[1]
    x_desc = TensorDescriptor.from_tensor(x, [cfg.block_k, cfg.block_m])
    y_desc = TensorDescriptor.from_tensor(y, [cfg.block_k, cfg.block_n])
    knobs = {}
    if tma_store:
        c_block = [1, cfg.block_m, cfg.block_n // 2]
        knobs = {"TMA_STORE": True, "c_desc": TensorDescriptor.from_tensor(c, c_block)}
    variable_k_flat_kernel[(programs,)](
        x_desc, y_desc, x, y, c, group_offs, m, p, q, num_groups, x.stride(0), y.stride(0),
        c.stride(0), c.stride(1), c.stride(2), programs,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        G_PAD=triton.next_power_of_2(max(num_groups, 2)), UPCAST=upcast, **knobs, **cfg.options,
    )  # fmt: skip


def aot_specs(target: str) -> list:
    """sm_90 only (host TMA descriptors are CUDA-only): ``vkf`` and ``vkfs`` on every
    ``VK_FLAT_TILES`` tile, bf16."""
    from primus_turbo.triton.aot import AotSpec
    from primus_turbo.triton.grouped_gemm.grouped_gemm_configs import VK_FLAT_TILES

    if target != "sm_90":
        return []
    specs = []
    for cfg in VK_FLAT_TILES:
        bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
        sig = {"x_desc": f"tensordesc<bf16[{bk},{bm}]>", "y_desc": f"tensordesc<bf16[{bk},{bn}]>",
               "x_ptr": "*bf16", "y_ptr": "*bf16", "c_ptr": "*bf16", "offs_ptr": "*i64",
               "M": "i32", "P": "i32:16", "Q": "i32:16", "G": "i32", "stride_xm": "i32:16",
               "stride_ym": "i32:16", "stride_cg": "i32:16", "stride_cp": "i32:16",
               "stride_cq": "i32:1", "num_programs": "i32"}  # fmt: skip
        cx = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": cfg.group_m,
              "G_PAD": 256, "UPCAST": False}  # fmt: skip
        specs.append(AotSpec(f"grouped_gemm_variable_k_vkf_bf16_{cfg.name}",
                             variable_k_flat_kernel, sig,
                             {**cx, "c_desc": None, "TMA_STORE": False}, cfg.options))  # fmt: skip
        sig_s = {**sig, "c_desc": f"tensordesc<bf16[1,{bm},{bn // 2}]>"}
        specs.append(AotSpec(f"grouped_gemm_variable_k_vkfs_bf16_{cfg.name}",
                             variable_k_flat_kernel, sig_s, {**cx, "TMA_STORE": True},
                             cfg.options))  # fmt: skip
    return specs
