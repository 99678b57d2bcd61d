"""Dense GEMM in Triton: ``C[M, N] = A[M, K] @ B[K, N]`` with fp32 accumulation.

Operands are addressed through strides, so the four layouts (A or A^T, B or B^T) are the same
kernel with swapped strides; no transpose is materialised. Inputs fp16/bf16 (fp32 in the
interpreter tier), output fp16/bf16/fp32.

Grid mapping: a persistent grid of ``num_programs <= num_tiles`` programs walks the output tiles
with stride ``num_programs``; tile ids are swizzled in groups of ``GROUP_M`` rows of tiles so that
consecutive programs share B columns in L2. With ``num_programs == num_tiles`` this is the classic
one-tile-per-program launch. Row/column offsets are int64 so outputs past 2**31 elements are safe.

Split-K (``SPLIT``, for outputs with few tiles and a long K), one launch: work item ``w`` is
K slice ``w % split_k`` of tile ``w // split_k`` (the slices of one tile run side by side, so
their partials are still in L2 when summed). Every slice stores its fp32 partial in the
workspace ``ws[tile, slice]`` and bumps the tile's arrival counter (acq_rel); the program that
arrives last adds the ``split_k`` partials in slice order 0, 1, ... (bitwise deterministic,
whichever program finishes last), writes the output dtype and puts the counter back to zero
for the next call. No program ever waits, so no residency assumption is needed.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import torch
import triton
import triton.language as tl

from primus_turbo.pytorch.core.logging import get_logger
from primus_turbo.pytorch.core.platform import (
    ArchFamily,
    arch_family,
    is_graph_capturing,
    num_compute_units,
    triton_interpret,
)
from primus_turbo.triton.gemm.gemm_configs import (
    GemmConfig,
    gemm_configs,
    select_config,
    select_split_k,
    use_stream_k,
)
from primus_turbo.triton.gemm.gemm_env import (  # noqa: F401  (tests reach them through here)
    FLATTEN_MODES,
    TMA_MODES,
    _flatten_for,
    _flatten_mode,
    _narrow_enabled,
    _narrow_forced,
    _narrow_plans,
    _tma_mode,
)


@triton.jit
def _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    width = GROUP_M * num_pid_n
    group_id = tile_id // width
    first_m = group_id * GROUP_M
    group_size = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile_id % width) % group_size
    pid_n = (tile_id % width) // group_size
    return pid_m, pid_n


@triton.jit
def _tile_mma(
    a_ptr, b_ptr, rm64, rn64, mask_m, mask_n, kt_start, kt_end, K,
    stride_am, stride_ak, stride_bk, stride_bn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """fp32 ``A[rm, k] @ B[k, rn]`` over the K tiles ``[kt_start, kt_end)`` of one output tile."""
    offs_k = tl.arange(0, BLOCK_K)
    # the K start as one 64-bit scalar offset: k0 * stride can pass 2**31 (split-K / stream-K
    # slices of a K-strided operand such as A^T); the per-element offsets stay small
    k0 = tl.cast(kt_start, tl.int64) * BLOCK_K
    a_ptrs = a_ptr + k0 * stride_ak + rm64[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + k0 * stride_bk + offs_k[:, None] * stride_bk + rn64[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(kt_start, kt_end):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=mask_m, other=0.0)
            b = tl.load(b_ptrs, mask=mask_n, other=0.0)
        else:
            k_left = K - kt * BLOCK_K
            a = tl.load(a_ptrs, mask=mask_m & (offs_k[None, :] < k_left), other=0.0)
            b = tl.load(b_ptrs, mask=mask_n & (offs_k[:, None] < k_left), other=0.0)
        if UPCAST:
            # The CPU interpreter mis-computes bf16 x bf16 dots; fp32 operands are exact.
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def _tile_mma2(
    a_ptr, b_ptr, rm64, rn64, rn2_64, mask_m, mask_n, mask_n2, K,
    stride_am, stride_ak, stride_bk, stride_bn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_N2: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """Composite tile: fp32 ``A[rm, :] @ B[:, rn]`` and ``A[rm, :] @ B[:, rn2]`` over all of K,
    two dots per K step sharing one A tile (the tile is ``BLOCK_N + BLOCK_N2`` wide)."""
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm64[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + rn64[None, :] * stride_bn
    b2_ptrs = b_ptr + offs_k[:, None] * stride_bk + rn2_64[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N2), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=mask_m, other=0.0)
            b = tl.load(b_ptrs, mask=mask_n, other=0.0)
            b2 = tl.load(b2_ptrs, mask=mask_n2, other=0.0)
        else:
            k_left = K - kt * BLOCK_K
            a = tl.load(a_ptrs, mask=mask_m & (offs_k[None, :] < k_left), other=0.0)
            b = tl.load(b_ptrs, mask=mask_n & (offs_k[:, None] < k_left), other=0.0)
            b2 = tl.load(b2_ptrs, mask=mask_n2 & (offs_k[:, None] < k_left), other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
            b2 = b2.to(tl.float32)
        acc = tl.dot(a, b, acc)
        acc2 = tl.dot(a, b2, acc2)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
        b2_ptrs += BLOCK_K * stride_bk
    return acc, acc2


@triton.jit
def gemm_kernel(
    a_ptr, b_ptr, c_ptr, ws_ptr, cnt_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    num_programs, split_k, k_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr,
    SPLIT: tl.constexpr = False, RED_M: tl.constexpr = 16, BLOCK_N2: tl.constexpr = 0,
    FLATTEN: tl.constexpr = False,
):  # fmt: skip
    """``split_k`` slices of ``k_per_split`` K tiles per output tile when ``SPLIT`` (else
    ``split_k == 1`` and ``ws_ptr``/``cnt_ptr``/``k_per_split`` are unused). ``BLOCK_N2 > 0``:
    composite tiles ``BLOCK_M x (BLOCK_N + BLOCK_N2)`` (two dots sharing A; never with SPLIT).
    ``FLATTEN`` (CUDA): the tile loop and the K loop become one pipelined loop, so the next
    tile's first loads are in flight during this tile's epilogue (short-K shapes)."""
    tl.static_assert(not (SPLIT and BLOCK_N2 > 0), "split-K takes plain tiles only")
    TILE_N: tl.constexpr = BLOCK_N + BLOCK_N2
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, TILE_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    for work_id in tl.range(pid, num_tiles * split_k, num_programs, flatten=FLATTEN):
        if SPLIT:
            tile_id = work_id // split_k
            k_slice = work_id % split_k
            kt_start = k_slice * k_per_split
            kt_end = tl.minimum(kt_start + k_per_split, k_tiles)
        else:
            tile_id = work_id
            kt_start = 0
            kt_end = k_tiles
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * TILE_N + tl.arange(0, BLOCK_N)
        # Pointers come from the plain aranges (64-bit) so that Triton's axis analysis sees the
        # contiguous dimension whichever layout A and B have and emits vector loads; edges are
        # masked (a clamped index such as where(rm < M, rm, 0) would hide the contiguity).
        rm64 = rm.to(tl.int64)
        rn64 = rn.to(tl.int64)
        mask_m = rm[:, None] < M
        mask_n = rn[None, :] < N
        if BLOCK_N2 > 0:
            rn2 = pid_n * TILE_N + BLOCK_N + tl.arange(0, BLOCK_N2)
            rn2_64 = rn2.to(tl.int64)
            mask_n2 = rn2[None, :] < N
            acc, acc2 = _tile_mma2(
                a_ptr, b_ptr, rm64, rn64, rn2_64, mask_m, mask_n, mask_n2, K,
                stride_am, stride_ak, stride_bk, stride_bn,
                BLOCK_M, BLOCK_N, BLOCK_N2, BLOCK_K, EVEN_K, UPCAST,
            )  # fmt: skip
            c2_ptrs = c_ptr + rm64[:, None] * stride_cm + rn2_64[None, :] * stride_cn
            tl.store(c2_ptrs, acc2.to(c_ptr.dtype.element_ty), mask=mask_m & mask_n2)
        else:
            acc = _tile_mma(
                a_ptr, b_ptr, rm64, rn64, mask_m, mask_n, kt_start, kt_end, K,
                stride_am, stride_ak, stride_bk, stride_bn,
                BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, UPCAST,
            )  # fmt: skip
        if SPLIT:
            offs_tile = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
            ws_tile = ws_ptr + tile_id.to(tl.int64) * split_k * (BLOCK_M * BLOCK_N)
            tl.store(ws_tile + k_slice * (BLOCK_M * BLOCK_N) + offs_tile, acc)
            tl.debug_barrier()  # all threads' partial stores precede the release below
            arrived = tl.atomic_add(cnt_ptr + tile_id, 1, sem="acq_rel")
            if arrived == split_k - 1:
                # last slice of this tile to finish: fixed-order sum, read from L2 (.cg), in
                # chunks of RED_M rows (up to 64 values per thread, see _red_m): few dependent round
                # trips, yet the sum never holds a whole fp32 tile (spills)
                for r in range(0, BLOCK_M, RED_M):
                    rows = r + tl.arange(0, RED_M)
                    offs = rows[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
                    total = tl.load(ws_tile + offs, cache_modifier=".cg")
                    for q in range(1, split_k):
                        total += tl.load(ws_tile + q * (BLOCK_M * BLOCK_N) + offs,
                                         cache_modifier=".cg")  # fmt: skip
                    rm_r = pid_m * BLOCK_M + rows
                    c_ptrs = c_ptr + rm_r.to(tl.int64)[:, None] * stride_cm
                    c_ptrs += rn64[None, :] * stride_cn
                    mask = (rm_r[:, None] < M) & mask_n
                    tl.store(c_ptrs, total.to(c_ptr.dtype.element_ty), mask=mask)
                tl.atomic_xchg(cnt_ptr + tile_id, 0)
        else:
            c_ptrs = c_ptr + rm64[:, None] * stride_cm + rn64[None, :] * stride_cn
            tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m & mask_n)


@triton.jit
def gemm_streamk_kernel(
    a_ptr, b_ptr, c_ptr, ws_ptr, flag_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    iters_per_program,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """Stream-K: the ``tiles * k_tiles`` MAC iterations are split evenly over the programs.

    Program ``p`` owns iterations ``[p * W, (p + 1) * W)`` and walks them tile by tile from the
    END of its range backwards. A tile covered by one program is stored directly. A tile split
    over programs ``first..last`` gets fp32 partials from ``first..last-1`` and is finished by
    ``last``, the owner of its final K slice, which adds them in program order (deterministic)
    and resets their flags for the next call. A program writes at most one partial (the piece
    where its range ends inside a tile), so the workspace is one ``BLOCK_M x BLOCK_N`` fp32
    slot and one flag per program: ``ws[p]``, then ``flag[p] = 1`` with release semantics.
    Because every program does its partial-only pieces first and its single waiting piece
    last, waits are short and cannot deadlock when all programs are resident (grid <= CUs);
    in the interpreter, programs run in increasing order, so ``first..last-1`` finish first.
    """
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    total = num_pid_m * num_pid_n * k_tiles
    start = pid * iters_per_program
    end = tl.minimum(start + iters_per_program, total)
    offs_tile = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    it_end = end
    while it_end > start:
        tile_id = (it_end - 1) // k_tiles
        tile_start = tile_id * k_tiles
        kt_start = tl.maximum(start, tile_start) - tile_start
        kt_end = it_end - tile_start
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rm64 = rm.to(tl.int64)
        rn64 = rn.to(tl.int64)
        mask_m = rm[:, None] < M
        mask_n = rn[None, :] < N
        acc = _tile_mma(
            a_ptr, b_ptr, rm64, rn64, mask_m, mask_n, kt_start, kt_end, K,
            stride_am, stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, UPCAST,
        )  # fmt: skip
        if kt_end < k_tiles:
            # not the final K slice: publish the partial for the tile's finishing program
            tl.store(ws_ptr + pid * (BLOCK_M * BLOCK_N) + offs_tile, acc)
            tl.atomic_xchg(flag_ptr + pid, 1, sem="release")
        else:
            for q in range(tile_start // iters_per_program, pid):
                while tl.atomic_cas(flag_ptr + q, 1, 0, sem="acquire") != 1:
                    pass
                acc += tl.load(ws_ptr + q * (BLOCK_M * BLOCK_N) + offs_tile)
            c_ptrs = c_ptr + rm64[:, None] * stride_cm + rn64[None, :] * stride_cn
            tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m & mask_n)
        it_end = tile_start + kt_start


# ---- launcher ------------------------------------------------------------------------------

# A plan is (config, split_k, stream_k); tuned plans are cached per shape bucket.
Plan = tuple[GemmConfig, int, bool]
_tuned: dict[tuple, Plan] = {}
_flags: dict[tuple, torch.Tensor] = {}


def _launch(a, b, c, m, n, k, sa, sb, cfg: GemmConfig, family: ArchFamily, split_k: int = 1):
    """Launch one config; with ``split_k > 1`` the K range of every tile is cut into that many
    slices (fewer if K is short) and reduced inside the same launch (see the module doc)."""
    # plain integer ceil-div: triton.cdiv is a @jit function, slow to call from the host
    tiles = -(-m // cfg.block_m) * -(-n // cfg.tile_n)
    k_per_split = 0
    if split_k > 1:
        assert not cfg.block_n2, "split-K takes plain tiles only"
        k_tiles = -(-k // cfg.block_k)
        k_per_split = -(-k_tiles // min(split_k, k_tiles))
        split_k = -(-k_tiles // k_per_split)  # no empty slices
    items = tiles * split_k
    if family == ArchFamily.CPU:
        programs = items
    else:
        programs = min(items, num_compute_units(a.device) * cfg.programs_per_cu)
    if cfg.tma and split_k == 1 and _tma_mode(family) != "0":
        from primus_turbo.triton.gemm import gemm_tma_kernel as tk

        if tk.tma_ok(a, b, m, n, k, sa, sb):  # else: the pointer kernel, same tile
            upcast = _interpreting() and a.dtype == torch.bfloat16
            flat = _flatten_for(cfg, family)
            return tk.launch_tma(a, b, c, m, n, k, sa, sb, cfg, programs, upcast, flat)
    if split_k > 1:
        ws = torch.empty(items * cfg.block_m * cfg.block_n, device=c.device, dtype=torch.float32)
        counters = _zeroed_counters(c.device, tiles)
    else:
        ws = counters = c  # unused by the kernel
    gemm_kernel[(programs,)](
        a, b, c, ws, counters, m, n, k,
        sa[0], sa[1], sb[0], sb[1], c.stride(0), c.stride(1),
        programs, split_k, k_per_split,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        EVEN_K=k % cfg.block_k == 0, UPCAST=_interpreting() and a.dtype == torch.bfloat16,
        SPLIT=split_k > 1, RED_M=_red_m(cfg), BLOCK_N2=cfg.block_n2,
        FLATTEN=split_k == 1 and _flatten_for(cfg, family), **cfg.options,
    )  # fmt: skip


def _red_m(cfg: GemmConfig) -> int:
    """Rows per chunk of the split-K reduction (a power of two).

    A chunk holds ``max(4096, min(2048 * num_warps, tile / 2))`` fp32 values: up to 64 per
    thread of a 32-wide warp (32 on a 64-wide wavefront), so that the running sum and one loaded
    slice together need no more registers than the accumulator (dead by then) did; never fewer
    than the 4096 of the first version. Each chunk costs ``split_k`` dependent L2 round trips
    (the loads of slice ``q + 1`` issue only after slice ``q`` is added), so fewer, larger chunks
    cut the reducer's latency: on sm_90 m256n128 w8 at ``split_k=3`` went from 8 chunks of 16
    values per thread (24 round trips) to 2 chunks of 64 (6), same 222 registers, no spills
    (docs/gemm_notes.md, "split-K on sm_90: static analysis")."""
    values = max(4096, min(2048 * cfg.num_warps, cfg.block_m * cfg.block_n // 2))
    return max(1, min(cfg.block_m, values // cfg.block_n))


def _zeroed_counters(device: torch.device, count: int) -> torch.Tensor:
    """Zeroed int32 counters/flags (at least ``count``), kept per (device, stream) across calls.

    The split-K and stream-K kernels leave every entry they touch back at zero, so one zeroing
    at allocation suffices; a separate buffer per stream keeps concurrent GEMMs apart.
    """
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device, stream)
    flags = _flags.get(key)
    if flags is None or flags.numel() < count:
        flags = torch.zeros(max(count, 1024), dtype=torch.int32, device=device)
        _flags[key] = flags
    return flags


def _launch_stream_k(a, b, c, m, n, k, sa, sb, cfg: GemmConfig, family: ArchFamily, programs=0):
    """Stream-K launch: one program per CU (all resident, so the partial hand-off cannot stall);
    ``programs`` overrides the count (tests use a few programs to force split tiles)."""
    assert not cfg.block_n2, "stream-K takes plain tiles only"
    k_tiles = -(-k // cfg.block_k)
    total = -(-m // cfg.block_m) * -(-n // cfg.block_n) * k_tiles
    if programs <= 0:
        programs = 4 if family == ArchFamily.CPU else num_compute_units(a.device)
    per_program = -(-total // min(programs, total))
    programs = -(-total // per_program)  # no empty programs
    ws = torch.empty((programs, cfg.block_m * cfg.block_n), device=c.device, dtype=torch.float32)
    gemm_streamk_kernel[(programs,)](
        a, b, c, ws, _zeroed_counters(c.device, programs), m, n, k,
        sa[0], sa[1], sb[0], sb[1], c.stride(0), c.stride(1), per_program,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        EVEN_K=k % cfg.block_k == 0, UPCAST=_interpreting() and a.dtype == torch.bfloat16,
        **cfg.options,
    )  # fmt: skip


def _run(a, b, c, m, n, k, sa, sb, plan: Plan, family: ArchFamily) -> None:
    cfg, split_k, stream_k = plan
    if stream_k:
        _launch_stream_k(a, b, c, m, n, k, sa, sb, cfg, family)
    else:
        _launch(a, b, c, m, n, k, sa, sb, cfg, family, split_k)


def _tune_key(m, n, k, a, b, c, sa, sb):
    # Round M/N/K to powers of two so that nearby shapes share a tuning result; keep the
    # layout (which stride is 1) since it changes the best config.
    def bucket(x):
        return 1 << max(x - 1, 0).bit_length()

    return (bucket(m), bucket(n), bucket(k), a.dtype, c.dtype, sa[1] == 1, sb[1] == 1, a.device)


def _candidates(m: int, n: int, k: int, family: ArchFamily, cus: int) -> list[Plan]:
    """Every plan the tuner times: each config; split-K where ``select_split_k`` splits (its
    factor and, from 4 up, half of it); stream-K (opt-in) where the last wave is poorly filled.
    ``PRIMUS_TURBO_GEMM_SPLIT_K``: ``auto`` = plain and split plans, ``1`` = only the split
    plans if any config splits, ``0`` (default) = no split plans."""
    mode = _split_k_mode()
    plain: list[Plan] = []
    split: list[Plan] = []
    tma_plain = _tma_mode(family) == "1"
    for cand in gemm_configs(family):
        plain.append((cand, 1, False))
        if tma_plain:
            plain.append((dataclasses.replace(cand, tma=True), 1, False))
        factor = select_split_k(m, n, k, cand, cus) if mode != "0" else 1
        if factor > 1:
            split.append((cand, factor, False))
            if factor >= 4:  # half the slices: half the partial traffic (a runtime argument,
                split.append((cand, factor // 2, False))  # so no extra compile)
        if _stream_k_enabled() and use_stream_k(m, n, k, cand, cus):
            plain.append((cand, 1, True))
    if mode == "1" and split:
        return split
    return plain + split


def _pick_config(a, b, c, m, n, k, sa, sb, family: ArchFamily) -> Plan:
    cus = num_compute_units(a.device)
    narrows = _narrow_plans(m, n, k, family, cus)
    narrow = narrows[0] if narrows else None
    if is_graph_capturing():
        # The plan tuned before the capture (e.g. in the warm-up) if any, else the heuristic;
        # no split-K while capturing: its counter buffer must not be first allocated in a graph
        tuned = _tuned.get((*_tune_key(m, n, k, a, b, c, sa, sb), narrows))
        if tuned is not None and tuned[1] == 1:
            return tuned
        return narrow or select_config(m, n, k, family, cus), 1, False
    if family == ArchFamily.CPU or not _config_tuning_enabled():
        if narrow is not None:
            return narrow, 1, False
        cfg = select_config(m, n, k, family, cus)
        return cfg, select_split_k(m, n, k, cfg, cus) if _split_k_mode() != "0" else 1, False
    # the composite config depends on the exact N, so it is part of the key (shapes of one
    # power-of-two bucket with different composite choices are tuned apart)
    key = (*_tune_key(m, n, k, a, b, c, sa, sb), narrows)
    choice = _tuned.get(key)
    if choice is None:
        timings = {}
        candidates = _candidates(m, n, k, family, cus)
        candidates += [(cfg, 1, False) for cfg in narrows]
        for plan in candidates:
            try:
                timings[plan] = triton.testing.do_bench(
                    lambda plan=plan: _run(a, b, c, m, n, k, sa, sb, plan, family),
                    warmup=5,
                    rep=20,
                    return_mode="median",
                )
            except Exception:  # e.g. out of shared memory for this tile on this chip
                continue
        choice = min(timings, key=timings.get)
        _tuned[key] = choice
        log = get_logger()
        if log.isEnabledFor(logging.INFO):
            log.info(
                "gemm tune M=%d N=%d K=%d: %s split_k=%d stream_k=%s (%.1f us)",
                m, n, k, choice[0].name, choice[1], choice[2], timings[choice] * 1e3,
            )  # fmt: skip
    return choice


@functools.cache
def _interpreting() -> bool:
    # Fixed per process: @triton.jit already chose interpreter or compiler at import time.
    return triton_interpret()


SPLIT_K_MODES = ("0", "1", "auto")


@functools.cache
def _split_k_mode() -> str:
    """``PRIMUS_TURBO_GEMM_SPLIT_K``: ``0`` (default) never split K, ``1`` split wherever the
    rule (``select_split_k``) splits for some config, ``auto`` let the tuner time the split plans
    next to the plain ones. Without tuning (CPU, ``PRIMUS_TURBO_TRITON_TUNE=0``) ``auto`` follows
    the rule for the heuristic's config. Read once per process. Off by default: on the H200
    (session 3) forced split-K made DeepSeek-V3 kv_a slower (0.27x torch.matmul vs 0.52x plain)
    and ``auto`` picked plans that the benchmark then timed slower than the plain kernel."""
    import os

    value = os.environ.get("PRIMUS_TURBO_GEMM_SPLIT_K", "0").strip().lower() or "0"
    if value not in SPLIT_K_MODES:
        raise ValueError(f"PRIMUS_TURBO_GEMM_SPLIT_K must be one of {SPLIT_K_MODES}, got {value!r}")
    return value


@functools.cache
def _stream_k_enabled() -> bool:
    """Stream-K candidates join the tuning only with ``PRIMUS_TURBO_GEMM_STREAM_K=1``.

    Opt-in: on the H200 (2026-11-29, run 3) the tuner picked stream-K for DeepSeek-V3 kv_a
    (4096x576x7168) and the benchmark then measured it slower than the data-parallel kernel
    (fwd 0.39x vs 0.52x torch.matmul), so the default keeps it out until that is understood."""
    from primus_turbo.pytorch.core.checks import env_flag

    return env_flag("PRIMUS_TURBO_GEMM_STREAM_K", False)


@functools.cache
def _config_tuning_enabled() -> bool:
    from primus_turbo.pytorch.core.checks import env_flag

    return env_flag("PRIMUS_TURBO_TRITON_TUNE", True)


def gemm_triton(
    a: torch.Tensor, b: torch.Tensor, trans_a: bool, trans_b: bool, out_dtype: torch.dtype
) -> torch.Tensor:
    """``op(a) @ op(b)`` with the Triton kernel; ``op`` transposes when the flag is set.

    Args:
        a: ``[M, K]`` (``[K, M]`` if ``trans_a``), fp16/bf16, any strides.
        b: ``[K, N]`` (``[N, K]`` if ``trans_b``), same dtype as ``a``.
        out_dtype: fp16/bf16/fp32.
    Returns:
        ``[M, N]`` contiguous tensor of ``out_dtype``.
    """
    m, k = (a.shape[1], a.shape[0]) if trans_a else (a.shape[0], a.shape[1])
    n = b.shape[0] if trans_b else b.shape[1]
    sa = (a.stride(1), a.stride(0)) if trans_a else (a.stride(0), a.stride(1))
    sb = (b.stride(1), b.stride(0)) if trans_b else (b.stride(0), b.stride(1))
    c = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if m == 0 or n == 0:
        return c
    if k == 0:
        return c.zero_()
    family = arch_family(a.device)
    _run(a, b, c, m, n, k, sa, sb, _pick_config(a, b, c, m, n, k, sa, sb, family), family)
    return c


# ---- ahead-of-time check -------------------------------------------------------------------


def aot_specs(target: str):
    """The AOT specs of this module's kernels (built in ``gemm_kernel_aot``)."""
    from primus_turbo.triton.gemm.gemm_kernel_aot import aot_specs as specs

    return specs(target)
