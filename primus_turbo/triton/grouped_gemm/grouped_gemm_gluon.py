"""Hopper wgrad of the grouped GEMM in Gluon (plans ``gl`` / ``gls`` of the variable-K GEMM).

``C[g] = X_g^T @ Y_g`` over the rows of group ``g`` (``X [M, P]``, ``Y [M, Q]``, ``C [G, P, Q]``),
like ``grouped_gemm_tma.variable_k_tma_kernel``, but written in Gluon (Triton's explicit
layout / shared-memory / barrier language) so the pipeline runs ACROSS tiles: Triton cannot
flatten a tile loop whose inner trip count (``ceil(m_g / BLOCK_K)``) varies per group, so the
TMA kernel drains its operand ring at the end of every tile and refills it at the start of the
next (a few microseconds per ~25 us tile at DeepSeek-V3 sizes). Here one loop runs over all
K steps of all of this program's tiles: a producer index runs ``NUM_BUF - 1`` steps ahead of
the consumer, so the next tile's first loads are in flight while this tile's last wgmma and
its epilogue run.

* Steps: every tile has ``max(1, ceil(m_g / BLOCK_K))`` steps of ``BLOCK_K`` rows, loaded by
  TMA from ``[start + k * BLOCK_K, p0]`` / ``[.., q0]``; a step that reaches past the group's
  rows (the last one, or the single step of an empty group) is zeroed past them in shared
  memory before its wgmma (both operands: rows of the next group may hold inf / nan).
* ``X`` enters the wgmma transposed (an M-major A operand from shared memory).
* Epilogue (``TMA_STORE``): the tile goes through a ``[BLOCK_M, BLOCK_N]`` shared buffer and
  a TMA store of ``C`` viewed as ``[G * P, Q]`` (``P % BLOCK_M == 0``: no tile crosses into the
  next group's rows; clipped at ``Q`` by the hardware); the store's wait is deferred to the
  next epilogue. Otherwise a masked pointer store from the wgmma registers (no shared
  buffer: one more ring stage fits).
* The number of K steps of this program is computed up front from the ``[G_PAD]`` offsets
  vector (tiles of group ``g`` are ``[g * T, (g + 1) * T)`` of the global sequence; this
  program takes every ``num_programs``-th one from ``pid``).

CUDA sm_90 only (Gluon's Hopper ops; no interpreter): the launchers check the device.
"""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)


@gluon.constexpr_function
def _mma_layout(block_m, block_n, num_warps):
    """wgmma accumulator layout: warps stacked along M (4-warp atoms), the widest N
    instruction that divides ``block_n``."""
    warps = [4, 1]
    while warps[0] * warps[1] != num_warps:
        if block_m > 16 * warps[0]:
            warps[0] *= 2
        else:
            warps[1] *= 2
    m_reps = -(-block_m // 16)
    n_reps = -(-num_warps // m_reps)
    max_n = max(block_n // n_reps, 8)
    n = 256
    while n > max_n or block_n % n != 0:
        n -= 8
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=warps, instr_shape=[16, n, 16])


@gluon.constexpr_function
def _rows_layout(cols, num_warps):
    """A blocked layout for a ``[rows, cols]`` bf16 tile, 8 contiguous elements per thread."""
    tc = min(32, max(cols // 8, 1))
    return gl.BlockedLayout([1, 8], [32 // tc, tc], [num_warps, 1], [1, 0])


@gluon.jit
def _vk_tile(w, offs_ptr, M, G, per_group, num_pid_p, num_pid_q,
             BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
             GROUP_M: gl.constexpr):  # fmt: skip
    """Tile ``w`` of the global sequence: ``(g, first row, rows, K steps, p0, q0)``; output
    tiles of a group in bands of ``GROUP_M`` P-tiles (``w`` past the last tile: clamped to
    the last group, its loads are predicated off)."""
    gw = w // per_group
    g = gl.minimum(gw, G - 1)
    t = w - gw * per_group
    width = GROUP_M * num_pid_q
    first_p = (t // width) * GROUP_M
    size_p = gl.maximum(gl.minimum(num_pid_p - first_p, GROUP_M), 1)
    pid_p = first_p + (t % width) % size_p
    pid_q = (t % width) // size_p
    start = gl.minimum(gl.maximum(gl.load(offs_ptr + g), 0), M).to(gl.int32)
    stop = gl.minimum(gl.maximum(gl.load(offs_ptr + g + 1), start), M).to(gl.int32)
    rows = stop - start
    steps = gl.maximum(gl.cdiv(rows, BLOCK_K), 1)
    return g, start, rows, steps, pid_p * BLOCK_M, pid_q * BLOCK_N


@gluon.jit
def _vk_issue(t, total, x_desc, y_desc, bars, x_bufs, y_bufs, row, p0, q0,
              NUM_BUF: gl.constexpr):  # fmt: skip
    """TMA loads of step ``t`` (``t < total``) into ring slot ``t % NUM_BUF``."""
    slot = t % NUM_BUF
    pred = t < total
    bar = bars.index(slot)
    mbarrier.expect(bar, x_desc.block_type.nbytes + y_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(x_desc, [row, p0], bar, x_bufs.index(slot), pred)
    tma.async_copy_global_to_shared(y_desc, [row, q0], bar, y_bufs.index(slot), pred)


@gluon.jit
def _zero_rows_past(buf, valid, BLOCK_K: gl.constexpr, COLS: gl.constexpr, num_warps: gl.constexpr):
    """Rows ``>= valid`` of the ``[BLOCK_K, COLS]`` shared tile ``buf`` set to zero."""
    layout: gl.constexpr = _rows_layout(COLS, num_warps)
    v = buf.load(layout)
    r = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(1, layout))
    keep = gl.expand_dims(r < valid, 1)
    buf.store(gl.where(keep, v, gl.zeros_like(v)))


@gluon.jit
def variable_k_gluon_kernel(
    x_desc, y_desc, c_desc, c_ptr, offs_ptr, M, P, Q, G, stride_cg, stride_cp, num_programs,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr,
    NUM_BUF: gl.constexpr, G_PAD: gl.constexpr, TMA_STORE: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    pid = gl.program_id(0)
    num_pid_p = gl.cdiv(P, BLOCK_M)
    num_pid_q = gl.cdiv(Q, BLOCK_N)
    per_group = num_pid_p * num_pid_q

    # K steps of this program (tiles pid, pid + num_programs, ...), from the offsets vector
    vec: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    gi = gl.arange(0, G_PAD, layout=vec)
    real = gi < G
    lo = gl.load(offs_ptr + gi, mask=real, other=0)
    hi = gl.load(offs_ptr + gi + 1, mask=real, other=0)
    lo = gl.minimum(gl.maximum(lo, 0), M).to(gl.int32)
    hi = gl.minimum(gl.maximum(hi, lo), M).to(gl.int32)
    steps_g = gl.where(real, gl.maximum(gl.cdiv(hi - lo, BLOCK_K), 1), 0)
    w_lo = gi * per_group
    w_hi = w_lo + per_group
    n_hi = gl.where(w_hi > pid, (w_hi - pid + num_programs - 1) // num_programs, 0)
    n_lo = gl.where(w_lo > pid, (w_lo - pid + num_programs - 1) // num_programs, 0)
    total = gl.sum((n_hi - n_lo) * steps_g, axis=0)

    dtype: gl.constexpr = x_desc.dtype
    x_bufs = gl.allocate_shared_memory(dtype, [NUM_BUF] + x_desc.block_type.shape, x_desc.layout)
    y_bufs = gl.allocate_shared_memory(dtype, [NUM_BUF] + y_desc.block_type.shape, y_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_BUF):
        mbarrier.init(bars.index(i), count=1)
    if TMA_STORE:
        c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)

    mma: gl.constexpr = _mma_layout(BLOCK_M, BLOCK_N, num_warps)
    acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=mma)

    # producer: tile pw, step pk; consumer: tile cw, step ck
    pw = pid
    pk = 0
    _g, p_start, _r, p_steps, p_p0, p_q0 = _vk_tile(
        pw, offs_ptr, M, G, per_group, num_pid_p, num_pid_q, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M
    )
    cw = pid
    ck = 0
    c_g, _s, c_rows, c_steps, c_p0, c_q0 = _vk_tile(
        cw, offs_ptr, M, G, per_group, num_pid_p, num_pid_q, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M
    )
    for i in gl.static_range(NUM_BUF - 1):
        _vk_issue(i, total, x_desc, y_desc, bars, x_bufs, y_bufs, p_start + pk * BLOCK_K,
                  p_p0, p_q0, NUM_BUF)  # fmt: skip
        pk += 1
        if pk == p_steps:
            pw += num_programs
            pk = 0
            _g, p_start, _r, p_steps, p_p0, p_q0 = _vk_tile(
                pw, offs_ptr, M, G, per_group, num_pid_p, num_pid_q,
                BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)  # fmt: skip

    for s in range(total):
        slot = s % NUM_BUF
        mbarrier.wait(bars.index(slot), (s // NUM_BUF) & 1)
        xs = x_bufs.index(slot)
        ys = y_bufs.index(slot)
        valid = c_rows - ck * BLOCK_K
        if valid < BLOCK_K:  # the group's last (partial) step, or an empty group's only one
            _zero_rows_past(xs, valid, BLOCK_K, BLOCK_M, num_warps)
            _zero_rows_past(ys, valid, BLOCK_K, BLOCK_N, num_warps)
            fence_async_shared()
            gl.thread_barrier()
        acc = warpgroup_mma(xs.permute((1, 0)), ys, acc, use_acc=ck > 0, is_async=True)
        # <= 1 wgmma in flight: step s - 1's is done, its ring slot takes step s + NUM_BUF - 1
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        _vk_issue(s + NUM_BUF - 1, total, x_desc, y_desc, bars, x_bufs, y_bufs,
                  p_start + pk * BLOCK_K, p_p0, p_q0, NUM_BUF)  # fmt: skip
        pk += 1
        if pk == p_steps:
            pw += num_programs
            pk = 0
            _g, p_start, _r, p_steps, p_p0, p_q0 = _vk_tile(
                pw, offs_ptr, M, G, per_group, num_pid_p, num_pid_q,
                BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)  # fmt: skip
        if ck == c_steps - 1:  # the tile's last step: epilogue (next tile's loads in flight)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            out = acc.to(dtype)
            if TMA_STORE:
                tma.store_wait(pendings=0)  # the previous tile's store left the buffer
                gl.thread_barrier()  # (only the issuing thread's wait means anything)
                c_smem.store(out)
                fence_async_shared()
                gl.thread_barrier()
                tma.async_copy_shared_to_global(c_desc, [c_g * P + c_p0, c_q0], c_smem)
            else:
                rp = c_p0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma))
                rq = c_q0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
                base = c_ptr + c_g.to(gl.int64) * stride_cg
                ptrs = base + gl.expand_dims(rp.to(gl.int64) * stride_cp, 1)
                ptrs = ptrs + gl.expand_dims(rq, 0)
                mask = gl.expand_dims(rp < P, 1) & gl.expand_dims(rq < Q, 0)
                gl.store(ptrs, out, mask=mask)
            cw += num_programs
            ck = 0
            c_g, _s, c_rows, c_steps, c_p0, c_q0 = _vk_tile(
                cw, offs_ptr, M, G, per_group, num_pid_p, num_pid_q,
                BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)  # fmt: skip
        else:
            ck += 1
    if TMA_STORE:
        tma.store_wait(pendings=0)
    for i in gl.static_range(NUM_BUF):
        mbarrier.invalidate(bars.index(i))


# plan name -> TMA_STORE (the ring depth is the config's num_stages)
GLUON_VK_VARIANTS = {"gl": False, "gls": True}


def gluon_vk_usable(x, y, c, variant: str, cfg) -> bool:
    """CUDA sm_90+ (not ROCm), 2-byte operands with TMA-able layouts, the output in their
    dtype; ``gls`` also needs ``P % BLOCK_M == 0`` and 16-byte output rows (``C`` viewed as
    ``[G * P, Q]``)."""
    import torch

    if not (x.is_cuda and torch.version.hip is None) or c.dtype != x.dtype:
        return False  # (the kernel stores in the operands' dtype)
    if torch.cuda.get_device_capability(x.device)[0] < 9:
        return False
    from primus_turbo.triton.grouped_gemm.grouped_gemm_tma import _tma_layout_ok

    if not (_tma_layout_ok(x) and _tma_layout_ok(y)):
        return False
    if GLUON_VK_VARIANTS[variant]:
        p, q = c.shape[1], c.shape[2]
        return c.is_contiguous() and p % cfg.block_m == 0 and (q * 2) % 16 == 0
    return c.stride(2) == 1


def _desc(t, block):
    """A Gluon TMA descriptor of ``t`` (bf16 / fp16) with the default NVMMA layout."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    gdt = gl.bfloat16 if t.dtype == torch.bfloat16 else gl.float16
    layout = gl.NVMMASharedLayout.get_default_for(block, gdt)
    return TensorDescriptor.from_tensor(t, block, layout)


def launch_variable_k_gluon(x, y, c, group_offs, num_groups, cfg, programs, variant) -> None:
    """``c[g] = x_g^T @ y_g`` with ``variable_k_gluon_kernel`` (``variant``: a key of
    ``GLUON_VK_VARIANTS``; check ``gluon_vk_usable`` first)."""
    m, p = x.shape
    q = y.shape[1]
    tma_store = GLUON_VK_VARIANTS[variant]
    x_desc = _desc(x, [cfg.block_k, cfg.block_m])
    y_desc = _desc(y, [cfg.block_k, cfg.block_n])
    c_desc = _desc(c.view(num_groups * p, q), [cfg.block_m, cfg.block_n]) if tma_store else None
    variable_k_gluon_kernel[(programs,)](
        x_desc, y_desc, c_desc, c, group_offs, m, p, q, num_groups, c.stride(0), c.stride(1),
        programs, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m, NUM_BUF=cfg.num_stages,
        G_PAD=triton.next_power_of_2(max(num_groups, 2)), TMA_STORE=tma_store,
        num_warps=cfg.num_warps,
    )  # fmt: skip


def aot_specs(target: str) -> list:
    """sm_90 only: every Gluon wgrad plan (``gluon_vk_configs``), bf16."""
    from primus_turbo.pytorch.core.platform import ArchFamily
    from primus_turbo.triton.aot import AotSpec
    from primus_turbo.triton.grouped_gemm.grouped_gemm_configs import gluon_vk_plans

    if target != "sm_90":
        return []
    specs = []
    for variant, cfg in gluon_vk_plans(ArchFamily.HOPPER):
        bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
        sig = {"x_desc": _sig_desc([bk, bm]), "y_desc": _sig_desc([bk, bn]), "c_ptr": "*bf16",
               "offs_ptr": "*i64", "M": "i32", "P": "i32:16", "Q": "i32:16", "G": "i32",
               "stride_cg": "i32:16", "stride_cp": "i32:16", "num_programs": "i32"}  # fmt: skip
        cx = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": cfg.group_m,
              "NUM_BUF": cfg.num_stages, "G_PAD": 256, "TMA_STORE": GLUON_VK_VARIANTS[variant],
              "num_warps": cfg.num_warps}  # fmt: skip
        if cx["TMA_STORE"]:
            sig["c_desc"] = _sig_desc([bm, bn])
        else:
            cx["c_desc"] = None
        name = f"grouped_gemm_variable_k_{variant}_bf16_{cfg.name}"
        specs.append(AotSpec(name, variable_k_gluon_kernel, sig, cx, cfg.options))
    return specs


def _sig_desc(block) -> str:
    """The JIT's type string of a Gluon bf16 descriptor with the default NVMMA layout."""
    layout = gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16)
    return f"tensordesc<bf16[{block[0]}, {block[1]}],{layout!r}>"
