"""FP8 rowwise grouped GEMM forward with the quantization of ``a`` fused in (plan ``f8q``,
session 11, opt-in; CUDA sm_90 TMA, or the CPU interpreter).

The op's default forward runs two kernels: the rowwise quantization of the bf16 ``a`` (copy
speed: 0.105 / 0.044 ms on Qwen3-30B-A3B gate_up / down, H200) and then the ``f8s`` GEMM
(0.37 / 0.22 ms): the bandwidth-bound quantization and the MMA-bound GEMM run one after the
other. ``f8q`` runs both in ONE persistent launch, side by side: programs ``0 .. Q-1``
(``PRIMUS_TURBO_GROUPED_GEMM_FP8_QFUSE = Q``) quantize ``a`` in segments of ``ROWS`` rows
(segment ``s`` by program ``s % Q``, so the rows come out roughly first to last: rows, scales,
then the segment's ready flag, released at GPU scope), the other programs run the ``f8s`` walk
on 128x128 tiles (two programs per SM) in chunks of their tiles (1, 1, 2, 4, ... up to
``CHUNK``) and, before a chunk, wait until every segment up to the end of its last tile's group
is flagged (the table is in row order; a per-program watermark makes each segment a single
check). A chunk runs as one flattened, pipelined loop: a spin loop inside it would stop
Triton's software pipelining (the first version did: 49 KiB of shared memory, no prefetch).
So the quantization's HBM traffic overlaps the MMAs of the tiles of earlier rows, at the cost
of ``Q`` tile slots and a pipeline restart per chunk.

Progress: only GEMM programs wait, and only on quantizing programs, which never wait and
have the lowest program ids (dispatched first: the forward-progress assumption of CUB's
decoupled look-back); the grid is the persistent one (at most the programs that fit on the
device). Memory order: a quantizing program stores its rows and scales, fences them for the
async proxy (``fence.proxy.async.global``, what TMA reads), syncs the CTA, then one thread
releases the flag (``atom.release.gpu``); a waiting program polls the flags with volatile
loads (no atomics queueing on the flag lines), then ``fence.acq_rel.gpu`` +
``fence.proxy.async.global``, syncs, and only then enters the chunk's loop (TMA loads) and
reads the row scales with ``.cg`` (L2, never a stale L1 line). Numerics: the quantization is
``quant_rows_kernel``'s one-pass rowwise recipe (same fp32 ops, same ``SAT`` flag), the GEMM
``f8s`` on the 128x128 tile, so the output is bitwise the two launches' on that tile (the
default op's when the tuner picks it). ``QFUSE_ELEMS`` (values per quantization step: 2048 /
4096), ``QFUSE_DEPTH`` (steps loaded at once: 2 / 3; Triton does not software-pipeline loads
that feed no dot, plain or TMA, so the quantizing programs prefetch in registers),
``QFUSE_PF`` (steps ahead prefetched to L2 with ``prefetch.global.L2``, no registers: 0 / 2 /
4 / 8), ``QFUSE_ROWS`` (rows per flag) and ``QFUSE_CHUNK`` tune it. The op's backward is
unchanged (it reads the saved ``a``).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from primus_turbo.pytorch.core.platform import ArchFamily, arch_family
from primus_turbo.triton.gemm.gemm_configs import GemmConfig
from primus_turbo.triton.gemm.gemm_kernel import _tile_coords
from primus_turbo.triton.grouped_gemm.grouped_gemm_fp8_tma import (
    _part_table,
    _zero_tail_lens,
    fp8_tma_configs,
)
from primus_turbo.triton.grouped_gemm.grouped_gemm_walk import find_tile, masked_store
from primus_turbo.triton.quantization.quant_kernel import _cast, _finite_abs, _scale_of

_ENV = "PRIMUS_TURBO_GROUPED_GEMM_FP8_QFUSE"
_ENV_ELEMS = "PRIMUS_TURBO_GROUPED_GEMM_FP8_QFUSE_ELEMS"
_ENV_CHUNK = "PRIMUS_TURBO_GROUPED_GEMM_FP8_QFUSE_CHUNK"
_ENV_ROWS = "PRIMUS_TURBO_GROUPED_GEMM_FP8_QFUSE_ROWS"
_ENV_DEPTH = "PRIMUS_TURBO_GROUPED_GEMM_FP8_QFUSE_DEPTH"
_ENV_PF = "PRIMUS_TURBO_GROUPED_GEMM_FP8_QFUSE_PF"
_ELEMS = (2048, 4096)  # 8192 / 16384 spill on sm_90 (the GEMM half is at 254 registers)
_CHUNKS = (4, 8, 16, 32)
_ROWS = (16, 32, 64, 128)


def _env_pick(var: str, default: int, allowed: tuple[int, ...]) -> int:
    """``var`` (read per call) as one of ``allowed``; unset / empty: ``default``."""
    raw = os.environ.get(var, "").strip()
    if not raw:
        return default
    if raw not in tuple(str(v) for v in allowed):
        raise ValueError(f"primus_turbo: {var} expected one of {allowed}, got {raw!r}")
    return int(raw)


@triton.jit
def _async_fence(x):
    """``fence.proxy.async.global`` in every thread; returns ``x`` (int32) so that what must
    follow the fence can depend on it."""
    return tl.inline_asm_elementwise("fence.proxy.async.global;\n\tmov.b32 $0, $1;", "=r,r",
                                     [x], dtype=tl.int32, is_pure=False, pack=1)  # fmt: skip


@triton.jit
def _load_rows(x_ptr, row0, M, K, stride_xm, QBM: tl.constexpr, K_PAD: tl.constexpr):
    """Rows ``[row0, row0 + QBM)`` of ``x`` (``K_PAD`` columns, masked; none past ``M``)."""
    rm = row0 + tl.arange(0, QBM)
    rk = tl.arange(0, K_PAD)
    mask = (rm < M)[:, None] & (rk < K)[None, :]
    return tl.load(x_ptr + rm.to(tl.int64)[:, None] * stride_xm + rk[None, :], mask=mask,
                   other=0.0)  # fmt: skip


@triton.jit
def _prefetch_rows(x_ptr, row0, M, K, stride_xm, QBM: tl.constexpr, K_PAD: tl.constexpr):
    """``prefetch.global.L2`` of rows ``[row0, row0 + QBM)`` of ``x``: one address per 64
    values (a 128-byte line of bf16); no registers held, unlike a load (masked addresses
    fall back to ``x_ptr``)."""
    LINES: tl.constexpr = K_PAD // 64 if K_PAD >= 64 else 1
    rm = row0 + tl.arange(0, QBM)
    rk = tl.arange(0, LINES) * 64
    ptrs = x_ptr + rm.to(tl.int64)[:, None] * stride_xm + rk[None, :]
    ptrs = tl.where((rm < M)[:, None] & (rk < K)[None, :], ptrs, x_ptr)
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.b32 $0, 0;", "=r,l", [ptrs],
                              dtype=tl.int32, is_pure=False, pack=1)  # fmt: skip


@triton.jit
def _quant_step(x, q_ptr, sa_ptr, row0, M, K, stride_qm, QBM: tl.constexpr,
                K_PAD: tl.constexpr, FMAX: tl.constexpr, FMT: tl.constexpr,
                SAT: tl.constexpr):  # fmt: skip
    """Rows ``[row0, row0 + QBM)`` (``x``, loaded): amax, scale and fp8 values as
    ``quant_rows_kernel``'s one pass; stores ``q`` and ``sa``."""
    rk = tl.arange(0, K_PAD)
    rm = row0 + tl.arange(0, QBM)
    rm64 = rm.to(tl.int64)
    mask_m = rm < M
    xf = x.to(tl.float32)
    amax = tl.max(_finite_abs(xf), axis=1)  # = the FAST amax whenever that one is kept
    scale, sinv = _scale_of(amax, FMAX, False, 0)
    if SAT:
        q = (xf * scale[:, None]).to(q_ptr.dtype.element_ty)
    else:
        q = _cast(xf, scale[:, None], FMAX, q_ptr.dtype.element_ty, FMT)
    tl.store(sa_ptr + rm64, sinv, mask=mask_m)
    tl.store(q_ptr + rm64[:, None] * stride_qm + rk[None, :], q,
             mask=mask_m[:, None] & (rk < K)[None, :])  # fmt: skip


@triton.jit
def _release(flags_ptr, seg, FENCE: tl.constexpr):
    """Segment ``seg`` done: proxy fence, CTA barrier, flag = 1 (release, GPU scope)."""
    if FENCE:
        _async_fence(seg)
    tl.debug_barrier()
    tl.atomic_xchg(flags_ptr + seg, 1, sem="release", scope="gpu")


@triton.jit
def _step_row(j, qpid, num_quant, FB: tl.constexpr, QBM: tl.constexpr):
    """First row of this program's step ``j`` (segments ``qpid + n * num_quant``)."""
    steps: tl.constexpr = FB // QBM
    return (qpid + (j // steps) * num_quant) * FB + (j % steps) * QBM


@triton.jit
def _quant_part(x_ptr, q_ptr, sa_ptr, flags_ptr, M, K, stride_xm, stride_qm, qpid, num_quant,
                FB: tl.constexpr, QBM: tl.constexpr, K_PAD: tl.constexpr, FMAX: tl.constexpr,
                FMT: tl.constexpr, SAT: tl.constexpr, FENCE: tl.constexpr,
                DEPTH: tl.constexpr, PF: tl.constexpr):  # fmt: skip
    """Segments ``qpid, qpid + num_quant, ...`` of ``FB`` rows in steps of ``QBM`` rows, each
    segment's flag set after its last step (one fence per segment, not per step). The loads
    run ``DEPTH - 1`` steps ahead in registers (2 or 3; Triton does not software-pipeline
    loads that feed no dot, so this is how a quantizing program keeps bytes in flight);
    ``PF > 0``: the rows ``PF`` steps ahead are prefetched to L2 (bytes in flight without
    registers, so the loads ``DEPTH - 1`` steps ahead hit L2)."""
    steps: tl.constexpr = FB // QBM
    n_seg = tl.cdiv(M, FB)
    n_mine = tl.cdiv(tl.maximum(n_seg - qpid, 0), num_quant)
    x0 = _load_rows(x_ptr, _step_row(0, qpid, num_quant, FB, QBM), M, K, stride_xm, QBM, K_PAD)
    x1 = x0
    if DEPTH == 3:
        x1 = _load_rows(x_ptr, _step_row(1, qpid, num_quant, FB, QBM), M, K, stride_xm, QBM,
                        K_PAD)  # fmt: skip
    for i in tl.range(0, n_mine * steps, num_stages=1):
        if PF > 0:
            _prefetch_rows(x_ptr, _step_row(i + PF, qpid, num_quant, FB, QBM), M, K, stride_xm,
                           QBM, K_PAD)  # fmt: skip
        x_new = _load_rows(x_ptr, _step_row(i + DEPTH - 1, qpid, num_quant, FB, QBM), M, K,
                           stride_xm, QBM, K_PAD)  # fmt: skip
        _quant_step(x0, q_ptr, sa_ptr, _step_row(i, qpid, num_quant, FB, QBM), M, K, stride_qm,
                    QBM, K_PAD, FMAX, FMT, SAT)  # fmt: skip
        if i % steps == steps - 1:
            _release(flags_ptr, qpid + (i // steps) * num_quant, FENCE)
        if DEPTH == 3:
            x0 = x1
            x1 = x_new
        else:
            x0 = x_new


@triton.jit
def _acquire_fence(x):
    """``fence.acq_rel.gpu`` (after the volatile reads that saw the flags: the acquire half of
    the flag handshake) then ``fence.proxy.async.global`` (for the TMA reads that follow);
    returns ``x`` (int32)."""
    return tl.inline_asm_elementwise(
        "fence.acq_rel.gpu;\n\tfence.proxy.async.global;\n\tmov.b32 $0, $1;", "=r,r", [x],
        dtype=tl.int32, is_pure=False, pack=1)  # fmt: skip


@triton.jit
def _wait_prefix(flags_ptr, wm, need, WB: tl.constexpr, FENCE: tl.constexpr):
    """Spin until flags ``[wm, need)`` are all set (volatile reads, ``WB`` flags per probe:
    plain L2 reads, no atomics queueing on the flag lines), then the acquire fence; returns
    the new watermark ``max(wm, need)``."""
    lanes = tl.arange(0, WB)
    while wm < need:
        offs = wm + lanes
        live = offs < need
        v = tl.load(flags_ptr + offs, mask=live, other=1, volatile=True)
        first_unset = tl.min(tl.where(live & (v == 0), lanes, WB), axis=0)
        wm = tl.minimum(wm + first_unset, need)
    if FENCE:
        wm = _acquire_fence(wm)
    tl.debug_barrier()
    return wm


@triton.jit
def _q_store(c_ptr, c_desc, acc, sa_ptr, sb_ptr, g, row0, col0, stop, N,
             stride_cm, stride_cn, stride_sbg, stride_sbn,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TMA_STORE: tl.constexpr):  # fmt: skip
    """``grouped_gemm_fp8_tma._scaled_store`` with the row scales read through L2 (``.cg``:
    they were written by another program during this launch)."""
    rows = row0.to(tl.int64) + tl.arange(0, BLOCK_M).to(tl.int64)
    rn = col0 + tl.arange(0, BLOCK_N)
    sa = tl.load(sa_ptr + rows, mask=rows < stop, other=0.0, cache_modifier=".cg")
    sb = tl.load(sb_ptr + tl.cast(g, tl.int64) * stride_sbg + rn.to(tl.int64) * stride_sbn,
                 mask=rn < N, other=0.0)  # fmt: skip
    acc = acc * sa[:, None] * sb[None, :]
    out = acc.to(c_ptr.dtype.element_ty)
    halves = out.reshape(BLOCK_M, 2, BLOCK_N // 2).permute(0, 2, 1)
    lo_half, hi_half = halves.split()
    if TMA_STORE:
        c_desc.store([row0, col0], lo_half)
        c_desc.store([row0, col0 + BLOCK_N // 2], hi_half)
    else:
        masked_store(c_ptr, lo_half, row0, col0, stop, N, stride_cm, stride_cn,
                     BLOCK_M, BLOCK_N // 2)  # fmt: skip
        masked_store(c_ptr, hi_half, row0, col0 + BLOCK_N // 2, stop, N,
                     stride_cm, stride_cn, BLOCK_M, BLOCK_N // 2)  # fmt: skip


@triton.jit
def _q_tile_loop(a_desc, b_desc, c_ptr, c_desc, sa_ptr, sb_ptr, flags_ptr, N, K, num_pid_n,
                 stride_cm, stride_cn, stride_sbg, stride_sbn,
                 pid, num_programs, gi, lo, hi, first, ends, total, wm,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 GROUP_M: tl.constexpr, FB: tl.constexpr, CHUNK: tl.constexpr,
                 WB: tl.constexpr, FENCE: tl.constexpr, FLATTEN: tl.constexpr,
                 UPCAST: tl.constexpr, TMA_STORE: tl.constexpr):  # fmt: skip
    """``grouped_gemm_fp8_tma._tile_loop`` in chunks of this program's tiles (1, 1, 2, 4, ...
    up to ``CHUNK``): before a chunk, wait for the quantization steps of every row up to the
    end of its last tile's group (the table is in row order, so that covers the chunk), then
    run the chunk as one flattened, pipelined loop with no wait inside (a spin loop in it
    would stop Triton's pipelining). Returns the watermark (steps known done)."""
    k_tiles = tl.cdiv(K, BLOCK_K)
    t_begin = pid + total * 0  # int32 tensors: loop-carried
    while t_begin < total:
        done = (t_begin - pid) // num_programs  # tiles of this program before the chunk
        t_end = tl.minimum(t_begin + tl.minimum(tl.maximum(done, 1), CHUNK) * num_programs,
                           total)  # chunks of 1, 1, 2, 4, ... tiles  # fmt: skip
        t_last = t_begin + (t_end - 1 - t_begin) // num_programs * num_programs
        g_last, start_last, stop_last, t0_last = find_tile(t_last, gi, lo, hi, first, ends)
        wm = _wait_prefix(flags_ptr, wm, tl.cdiv(stop_last, FB), WB, FENCE)
        for t_glob in tl.range(t_begin, t_end, num_programs, flatten=FLATTEN):
            g, start, stop, t0 = find_tile(t_glob, gi, lo, hi, first, ends)
            pid_m, pid_n = _tile_coords(t_glob - t0, tl.cdiv(stop - start, BLOCK_M), num_pid_n,
                                        GROUP_M)  # fmt: skip
            row0 = start + pid_m * BLOCK_M
            if TMA_STORE:
                row0 = tl.minimum(row0, stop - BLOCK_M)
            col0 = pid_n * BLOCK_N
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for kt in range(0, k_tiles):
                a = a_desc.load([row0, kt * BLOCK_K])
                b = b_desc.load([g * N + col0, kt * BLOCK_K])
                if UPCAST:
                    a = a.to(tl.float32)
                    b = b.to(tl.float32)
                acc = tl.dot(a, b.T, acc)
            _q_store(c_ptr, c_desc, acc, sa_ptr, sb_ptr, g, row0, col0, stop, N,
                     stride_cm, stride_cn, stride_sbg, stride_sbn, BLOCK_M, BLOCK_N,
                     TMA_STORE)  # fmt: skip
        t_begin = t_last + num_programs
    return wm


@triton.jit
def grouped_gemm_fp8_qfuse_kernel(
    x_ptr, q_ptr, a_desc, b_desc, c_ptr, c_desc, lens_ptr, sa_ptr, sb_ptr, flags_ptr,
    M, N, K, G, stride_xm, stride_qm, stride_cm, stride_cn, stride_sbg, stride_sbn,
    num_programs, num_quant,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, G_PAD: tl.constexpr, FB: tl.constexpr, QBM: tl.constexpr,
    K_PAD: tl.constexpr,
    CHUNK: tl.constexpr, WB: tl.constexpr, FMAX: tl.constexpr, FMT: tl.constexpr,
    SAT: tl.constexpr, FENCE: tl.constexpr, FLATTEN: tl.constexpr, UPCAST: tl.constexpr,
    DEPTH: tl.constexpr = 2, PF: tl.constexpr = 0,
):  # fmt: skip
    """Plan ``f8q`` (module doc): programs ``< num_quant`` quantize ``x`` into ``q`` / ``sa``
    in steps of ``QBM`` rows, flagging each; the others run the two ``f8s`` loops (groups of
    ``>= BLOCK_M`` rows with TMA stores, then the smaller ones with masked stores) on the
    group table from the sizes (``lens_ptr``), in chunks that first wait for their rows'
    steps; every program then zeroes its share of the rows past the groups."""
    pid = tl.program_id(0)
    if pid < num_quant:
        _quant_part(x_ptr, q_ptr, sa_ptr, flags_ptr, M, K, stride_xm, stride_qm, pid, num_quant,
                    FB, QBM, K_PAD, FMAX, FMT, SAT, FENCE, DEPTH, PF)  # fmt: skip
    else:
        gp = pid - num_quant
        ng = num_programs - num_quant
        num_pid_n = tl.cdiv(N, BLOCK_N)
        gi, lo, hi, first, ends, total = _part_table(lens_ptr, M, G, num_pid_n, BLOCK_M, G_PAD,
                                                     False, True)  # fmt: skip
        wm = _q_tile_loop(a_desc, b_desc, c_ptr, c_desc, sa_ptr, sb_ptr, flags_ptr, N, K,
                          num_pid_n, stride_cm, stride_cn, stride_sbg, stride_sbn,
                          gp, ng, gi, lo, hi, first, ends, total, gp * 0,
                          BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, FB, CHUNK, WB, FENCE, FLATTEN,
                          UPCAST, True)  # fmt: skip
        gp = (gp + ng - total % ng) % ng
        gi, lo, hi, first, ends, total = _part_table(lens_ptr, M, G, num_pid_n, BLOCK_M, G_PAD,
                                                     True, True)  # fmt: skip
        _q_tile_loop(a_desc, b_desc, c_ptr, c_desc, sa_ptr, sb_ptr, flags_ptr, N, K, num_pid_n,
                     stride_cm, stride_cn, stride_sbg, stride_sbn,
                     gp, ng, gi, lo, hi, first, ends, total, wm,
                     BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, FB, CHUNK, WB, FENCE, FLATTEN,
                     UPCAST, False)  # fmt: skip
    _zero_tail_lens(c_ptr, lens_ptr, M, N, G, pid, num_programs, stride_cm, stride_cn,
                    BLOCK_M, BLOCK_N, G_PAD)  # fmt: skip


# ---- env knobs, launcher ---------------------------------------------------------------------


def qfuse_programs() -> int:
    """``PRIMUS_TURBO_GROUPED_GEMM_FP8_QFUSE`` (read per call): ``0`` / unset (default) the
    op's two launches; ``Q >= 1`` plan ``f8q`` with ``Q`` quantizing programs (of the
    persistent grid, two per SM; at most half of it)."""
    raw = os.environ.get(_ENV, "").strip()
    if not raw:
        return 0
    try:
        q = int(raw)
    except ValueError:
        q = -1
    if q < 0:
        raise ValueError(f"primus_turbo: {_ENV} expected 0 (off) or a program count >= 1, "
                         f"got {raw!r}")  # fmt: skip
    return q


def qfuse_elems() -> int:
    """``PRIMUS_TURBO_GROUPED_GEMM_FP8_QFUSE_ELEMS``: values a quantizing program converts per
    step (rows of ``next_pow2(K)``; the next step's are loaded meanwhile): 2048 / 4096
    (default). ``K`` up to it takes plan ``f8q``."""
    return _env_pick(_ENV_ELEMS, 4096, _ELEMS)


def qfuse_rows() -> int:
    """``PRIMUS_TURBO_GROUPED_GEMM_FP8_QFUSE_ROWS``: rows per ready flag (a quantizing
    program's segment, one release fence each): 16 / 32 (default) / 64 / 128."""
    return _env_pick(_ENV_ROWS, 32, _ROWS)


def qfuse_depth() -> int:
    """``PRIMUS_TURBO_GROUPED_GEMM_FP8_QFUSE_DEPTH``: quantization steps a quantizing program
    has loaded at once (the current one and 1 / 2 ahead): 2 / 3 (default)."""
    return _env_pick(_ENV_DEPTH, 3, (2, 3))


def qfuse_prefetch() -> int:
    """``PRIMUS_TURBO_GROUPED_GEMM_FP8_QFUSE_PF``: steps ahead a quantizing program prefetches
    its rows to L2 (``prefetch.global.L2``, no registers): 0 (off) / 2 / 4 (default) / 8."""
    return _env_pick(_ENV_PF, 4, (0, 2, 4, 8))


def qfuse_chunk() -> int:
    """``PRIMUS_TURBO_GROUPED_GEMM_FP8_QFUSE_CHUNK``: the most tiles a GEMM program runs
    between two waits (its chunks grow 1, 1, 2, 4, ... up to it): 4 / 8 (default) / 16 / 32.
    Each wait ends a pipelined run of tiles (one memory latency, one CTA barrier)."""
    return _env_pick(_ENV_CHUNK, 8, _CHUNKS)


def qfuse_config(family: ArchFamily) -> GemmConfig:
    """The ``f8s`` 128x128 one-warpgroup 3-stage tile (two programs per SM: a quantizing
    program shares its SM with a GEMM program); the first interpreter tile on the CPU."""
    return fp8_tma_configs(family)[0]


def qfuse_usable(a: torch.Tensor, qb: torch.Tensor, out_dtype: torch.dtype, fp8_dtype) -> bool:
    """Env on and everything plan ``f8q`` needs: CUDA sm_90+ (or the interpreter), a 2-D
    contiguous 16-bit / fp32 ``a`` with ``16 <= K`` and ``K`` a multiple of 16 and its padded
    row within one step, descriptor-ready fp8 weights, a 2-byte output with 16-byte rows."""
    from primus_turbo.triton.grouped_gemm.grouped_gemm_fp8_tma import (
        _descriptor_ok,
        fp8_tma_device_ok,
    )

    if qfuse_programs() == 0 or not fp8_tma_device_ok(a.device):
        return False
    m, k = a.shape
    n = qb.shape[1]
    if k < 16 or k % 16 or triton.next_power_of_2(k) > qfuse_elems():
        return False
    if torch.empty(0, dtype=out_dtype).element_size() != 2 or (n * 2) % 16:
        return False
    if a.device.type == "cuda" and fp8_dtype != torch.float8_e4m3fn:
        return False
    return qb.is_contiguous() and _descriptor_ok(qb) and a.dtype.itemsize in (2, 4)


def grouped_gemm_fp8_qfuse(
    a: torch.Tensor,
    qb: torch.Tensor,
    sb: torch.Tensor,
    group_lens: torch.Tensor,
    out_dtype: torch.dtype,
    fp8_dtype: torch.dtype,
    num_quant: int | None = None,
) -> torch.Tensor:
    """``[M, N]`` of ``out_dtype``: ``a [M, K]`` (high precision) quantized rowwise to
    ``fp8_dtype`` and multiplied by ``qb [G, N, K]`` fp8 with scales ``sb [G, N]``, groups of
    ``group_lens`` rows (rows past their sum zero), in one launch (plan ``f8q``). The caller
    checks ``qfuse_usable``."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel as gk
    from primus_turbo.triton.grouped_gemm.grouped_gemm_walk import operand_descs
    from primus_turbo.triton.quantization.quant_launch import (
        _fmax,
        _interp_fmt,
        _nvidia_sat,
        _u8,
        _v3,
    )

    a = a.contiguous()
    m, k = a.shape
    g, n = qb.shape[0], qb.shape[1]
    c = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if m == 0 or n == 0:
        return c
    family = arch_family(a.device)
    cfg = qfuse_config(family)
    q = torch.empty((m, k), dtype=fp8_dtype, device=a.device)
    sa = torch.empty(m, dtype=torch.float32, device=a.device)
    bound = (-(-m // cfg.block_m) + g + 1) * -(-n // cfg.block_n)
    programs = max(2, gk._programs(bound, cfg, a.device, family))
    nq = max(1, qfuse_programs() if num_quant is None else num_quant)
    if family == ArchFamily.CPU:  # the interpreter runs programs one by one: any count works
        programs = max(programs, nq + 1)
    nq = min(nq, programs - 1)  # at least one GEMM program (persistent grid: all resident)
    k_pad = triton.next_power_of_2(k)
    qbm = max(1, min(256, qfuse_elems() // k_pad))
    fb = max(qbm, qfuse_rows())
    flags = torch.zeros(-(-m // fb), dtype=torch.int32, device=a.device)  # one per segment
    interp = gk._interpreting()
    a_desc, b_desc, *_ = operand_descs(q, qb, True, cfg)
    c_desc = TensorDescriptor.from_tensor(c, [cfg.block_m, cfg.block_n // 2])
    sat = _v3() and _nvidia_sat(a)  # quant_rows_kernel's one-pass flag (K <= 16384)
    grouped_gemm_fp8_qfuse_kernel[(programs,)](
        a, _u8(q), a_desc, b_desc, c, c_desc, group_lens.contiguous(), sa, sb, flags,
        m, n, k, g, a.stride(0), q.stride(0), c.stride(0), c.stride(1), sb.stride(0),
        sb.stride(1), programs, nq,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        G_PAD=triton.next_power_of_2(max(g, 2)), FB=fb, QBM=qbm, K_PAD=k_pad, CHUNK=qfuse_chunk(),
        WB=128, DEPTH=qfuse_depth(), PF=0 if interp else qfuse_prefetch(),
        FMAX=_fmax(fp8_dtype),
        FMT=_interp_fmt(fp8_dtype), SAT=sat, FENCE=not interp, FLATTEN=not interp,
        UPCAST=interp, **cfg.options,
    )  # fmt: skip
    return c


# ---- ahead-of-time check ---------------------------------------------------------------------


def aot_specs(target: str) -> list:
    """sm_90 only (TMA): the 128x128 tile, bf16 ``a`` and output, E4M3, K padded to 1024 /
    2048 (Qwen3-30B-A3B down / gate_up), every ``QFUSE_ELEMS`` x ``QFUSE_DEPTH``."""
    from primus_turbo.triton.aot import AotSpec

    if target != "sm_90":
        return []
    cfg = qfuse_config(ArchFamily.HOPPER)
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    sig = {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "a_desc": f"tensordesc<fp8e4nv[{bm},{bk}]>",
           "b_desc": f"tensordesc<fp8e4nv[{bn},{bk}]>", "c_ptr": "*bf16",
           "c_desc": f"tensordesc<bf16[{bm},{bn // 2}]>", "lens_ptr": "*i64",
           "sa_ptr": "*fp32", "sb_ptr": "*fp32", "flags_ptr": "*i32", "M": "i32",
           "N": "i32:16", "K": "i32:16", "G": "i32", "stride_xm": "i32:16",
           "stride_qm": "i32:16", "stride_cm": "i32:16", "stride_cn": "i32:1",
           "stride_sbg": "i32:16", "stride_sbn": "i32:1", "num_programs": "i32",
           "num_quant": "i32"}  # fmt: skip
    specs = []
    grid = [(k, e, d, pf) for k in (1024, 2048) for e in _ELEMS for d in (2, 3) for pf in (0, 4)]
    for k_pad, elems, depth, pf in grid:
        consts = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": cfg.group_m,
                  "G_PAD": 128, "FB": 32, "QBM": elems // k_pad, "K_PAD": k_pad, "CHUNK": 8,
                  "WB": 128, "DEPTH": depth, "PF": pf,
                  "FMAX": float(torch.finfo(torch.float8_e4m3fn).max), "FMT": (0, 0, 0, 0),
                  "SAT": True, "FENCE": True, "FLATTEN": True, "UPCAST": False}  # fmt: skip
        specs.append(AotSpec(f"grouped_gemm_fp8_qfuse_k{k_pad}_e{elems}_d{depth}_p{pf}_{cfg.name}",
                             grouped_gemm_fp8_qfuse_kernel, sig, consts, cfg.options))  # fmt: skip
    return specs
