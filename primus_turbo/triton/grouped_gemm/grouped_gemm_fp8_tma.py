"""FP8 (rowwise / tensorwise) grouped GEMM forward with TMA operand loads (sm_90).

``C[rows of g] = (A[rows of g] * sa[rows]) @ (B[g] * sb[g])^T`` for ``A [M, K]`` fp8 (E4M3),
``B [G, N, K]`` fp8 (the ``trans_b`` layout every fp8 GEMM of ``grouped_gemm_fp8`` uses: both
operands K-major, what an fp8 wgmma wants), ``sa [M]`` fp32 per row (a 0-stride expand for
tensorwise) and ``sb [G, N]`` fp32 per expert and output column, applied in the epilogue.

The kernels are the bf16 ones launched with ``SCALED=True`` (the scaled epilogue of
``grouped_gemm_walk.scale_tile``): plans ``f8tma`` / ``f8tmas`` run
``grouped_gemm_tma.grouped_gemm_flat_tma_kernel`` (the warp-specialised plan ``f8ws`` was
removed: it deadlocked on the H200 at the DeepSeek-V3 shapes in run 6.1). The flat walk (the
in-kernel group table, one multi-operand reduction per tile, ``tl.range(flatten=...)`` so the
next tile's first TMA loads are issued during this tile's epilogue, tail rows past ``offs[G]``
zeroed by a second loop): the host never reads the group sizes. A is one descriptor over
``[M, K]``, B one over ``b`` viewed as ``[G * N, K]``; a tile crossing the end of its group (or
of ``N``) reads the next group's rows (expert's rows), which only feed output rows (columns) the
masked store drops; K and the end of each tensor are zero-filled by the hardware. The two
scale vectors of a tile are loaded before its K loop (their latency hides under the MMAs). fp8
tiles: ``BLOCK_K = 128``.

Session 8's ``grouped_gemm_fp8_pre_kernel`` (plan ``f8s``: TMA-store epilogue, ragged last
tiles moved up inside their group; see its docstring) is what the tuner times by default;
``PRIMUS_TURBO_GROUPED_GEMM_FP8_KERNEL`` (``fp8_kernel_set``) selects the plan families.
Selected by ``PRIMUS_TURBO_GROUPED_GEMM_FP8_TMA`` (``1`` default: these kernels where usable;
``0``: the pointer kernels of ``grouped_gemm_kernel``, as before session 5) through
``grouped_gemm_fp8_triton``; ``PRIMUS_TURBO_GROUPED_GEMM_FP8_CONFIG`` (comma-separated config
names) restricts the tuner's candidates. CUDA sm_90+ only (no TMA on AMD: the pointer path).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from primus_turbo.pytorch.core.platform import ArchFamily, arch_family
from primus_turbo.triton.gemm.gemm_configs import GemmConfig
from primus_turbo.triton.gemm.gemm_kernel import _tile_coords
from primus_turbo.triton.grouped_gemm.grouped_gemm_tma import grouped_gemm_flat_tma_kernel
from primus_turbo.triton.grouped_gemm.grouped_gemm_walk import (
    find_tile,
    group_table,
    masked_store,
    operand_descs,
    zero_rows_from,
    zero_tail,
)

# ---- session 8: the fp8 kernel with the TMA-store epilogue (plan f8s) ------------------------


@triton.jit
def _scaled_store(c_ptr, c_desc, acc, sa_ptr, sb_ptr, g, row0, col0, stop, N,
                  stride_cm, stride_cn, stride_sa, stride_sbg, stride_sbn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  TMA_STORE: tl.constexpr):  # fmt: skip
    """``acc * sa[rows, None] * sb[g, None, cols]`` stored at ``(row0, col0)`` in two column
    halves (each converted and stored on its own: fewer live registers): TMA stores of
    ``c_desc`` with ``TMA_STORE`` (the caller guarantees every row lies in the group; clipped
    at ``N`` by the hardware), else masked pointer stores (rows ``>= stop`` dropped)."""
    rows = row0.to(tl.int64) + tl.arange(0, BLOCK_M).to(tl.int64)
    rn = col0 + tl.arange(0, BLOCK_N)
    sa = tl.load(sa_ptr + rows * stride_sa, mask=rows < stop, other=0.0)
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
def _lens_rows(lens_ptr, M, G, G_PAD: tl.constexpr):
    """``(gi, lo, hi)`` of ``group_table`` from the group SIZES (``lens_ptr``: int64 ``[G]``):
    the exclusive / inclusive prefix sums in the kernel, the same clamps, so the same table as
    from ``group_offsets(lens)`` (session 9: no zero-fill and cumsum launches on the host)."""
    gi = tl.arange(0, G_PAD)
    n = tl.load(lens_ptr + gi, mask=gi < G, other=0)
    end = tl.cumsum(n, axis=0)
    lo = tl.minimum(tl.maximum(end - n, 0), M).to(tl.int32)
    hi = tl.minimum(tl.maximum(end, lo), M).to(tl.int32)
    return gi, lo, hi


@triton.jit
def _part_table(offs_ptr, M, G, num_pid_n, BLOCK_M: tl.constexpr, G_PAD: tl.constexpr,
                SMALL: tl.constexpr, LENS: tl.constexpr = False):  # fmt: skip
    """The group table (``group_table``) of one part of the walk: the groups of ``>= BLOCK_M``
    rows, or with ``SMALL`` the smaller ones. ``LENS``: ``offs_ptr`` holds the group sizes
    (``_lens_rows``) instead of the ``[G + 1]`` offsets."""
    if LENS:
        gi, lo, hi = _lens_rows(offs_ptr, M, G, G_PAD)
    else:
        gi, lo, hi, first, ends, total = group_table(offs_ptr, M, G, num_pid_n, BLOCK_M, G_PAD)
    n = hi - lo
    if SMALL:
        mt = tl.where(n < BLOCK_M, tl.cdiv(n, BLOCK_M), 0)
    else:
        mt = tl.where(n >= BLOCK_M, tl.cdiv(n, BLOCK_M), 0)
    tiles = mt * num_pid_n
    ends = tl.cumsum(tiles, axis=0)
    return gi, lo, hi, ends - tiles, ends, tl.sum(tiles, axis=0)


@triton.jit
def _tile_loop(a_desc, b_desc, c_ptr, c_desc, sa_ptr, sb_ptr, N, K, num_pid_n,
               stride_cm, stride_cn, stride_sa, stride_sbg, stride_sbn,
               pid, num_programs, gi, lo, hi, first, ends, total,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               GROUP_M: tl.constexpr, FLATTEN: tl.constexpr, UPCAST: tl.constexpr,
               TMA_STORE: tl.constexpr):  # fmt: skip
    """The persistent walk over the table's tiles ``pid, pid + num_programs, ...``. With
    ``TMA_STORE`` (every tile fits inside its group) a group's ragged last tile is moved up to
    end at the group's last row: it recomputes rows of the tile before it (the same values,
    bitwise: same operands, same MMA order) and every store stays in the group, so no tile
    needs a mask."""
    k_tiles = tl.cdiv(K, BLOCK_K)
    for t_glob in tl.range(pid, total, num_programs, flatten=FLATTEN):
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
        _scaled_store(c_ptr, c_desc, acc, sa_ptr, sb_ptr, g, row0, col0, stop, N,
                      stride_cm, stride_cn, stride_sa, stride_sbg, stride_sbn,
                      BLOCK_M, BLOCK_N, TMA_STORE)  # fmt: skip


@triton.jit
def grouped_gemm_fp8_pre_kernel(
    a_desc, b_desc, c_ptr, c_desc, offs_ptr, sa_ptr, sb_ptr, M, N, K, G,
    stride_cm, stride_cn, stride_sa, stride_sbg, stride_sbn, num_programs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, G_PAD: tl.constexpr, FLATTEN: tl.constexpr, UPCAST: tl.constexpr,
    LENS: tl.constexpr = False,
):  # fmt: skip
    """Plan ``f8s``: the ``f8tma`` walk (flat persistent loop over the in-kernel group table,
    flattened with its K loop so the next tile's first TMA loads are issued during this tile's
    epilogue; rows past ``offs[G]`` zeroed by a last loop) with a TMA-store epilogue in two
    column halves: groups of at least ``BLOCK_M`` rows in a first loop whose tiles all leave
    through TMA stores (the ragged last tile moved up, see ``_tile_loop``), the smaller groups
    in a second loop with masked stores (a branch between the two stores in one flattened loop
    fails in Triton 3.6's loop fusion); the second loop continues the round-robin where the
    first ended. Session 9: ``LENS`` (``offs_ptr`` holds the int64 group sizes ``[G]``: the
    tables and the tail from their prefix sums; the op's default forward when the caller
    gives no ``group_offs``)."""
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    gi, lo, hi, first, ends, total = _part_table(offs_ptr, M, G, num_pid_n, BLOCK_M, G_PAD,
                                                 False, LENS)  # fmt: skip
    _tile_loop(a_desc, b_desc, c_ptr, c_desc, sa_ptr, sb_ptr, N, K, num_pid_n,
               stride_cm, stride_cn, stride_sa, stride_sbg, stride_sbn,
               pid, num_programs, gi, lo, hi, first, ends, total,
               BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, FLATTEN, UPCAST, True)  # fmt: skip
    pid = (pid + num_programs - total % num_programs) % num_programs
    gi, lo, hi, first, ends, total = _part_table(offs_ptr, M, G, num_pid_n, BLOCK_M, G_PAD,
                                                 True, LENS)  # fmt: skip
    _tile_loop(a_desc, b_desc, c_ptr, c_desc, sa_ptr, sb_ptr, N, K, num_pid_n,
               stride_cm, stride_cn, stride_sa, stride_sbg, stride_sbn,
               pid, num_programs, gi, lo, hi, first, ends, total,
               BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, FLATTEN, UPCAST, False)  # fmt: skip
    if LENS:
        _zero_tail_lens(c_ptr, offs_ptr, M, N, G, pid, num_programs, stride_cm, stride_cn,
                        BLOCK_M, BLOCK_N, G_PAD)  # fmt: skip
    else:
        zero_tail(c_ptr, offs_ptr, M, N, G, pid, num_programs, stride_cm, stride_cn, BLOCK_M,
                  BLOCK_N)  # fmt: skip


@triton.jit
def _zero_tail_lens(c_ptr, lens_ptr, M, N, G, pid, num_programs, stride_cm, stride_cn,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, G_PAD: tl.constexpr):  # fmt: skip
    """``zero_tail`` with the tail's first row the sum of the group sizes (``LENS``)."""
    gi = tl.arange(0, G_PAD)
    total = tl.sum(tl.load(lens_ptr + gi, mask=gi < G, other=0), axis=0)
    tail0 = tl.minimum(tl.maximum(total, 0), M).to(tl.int64)
    zero_rows_from(c_ptr, tail0, M, N, pid, num_programs, stride_cm, stride_cn, BLOCK_M, BLOCK_N)


# ---- configs, env knobs, launcher ------------------------------------------------------------


def fp8_tma_configs(family: ArchFamily) -> tuple[GemmConfig, ...]:
    """Candidate tiles (BLOCK_K = 128: 128 fp8 bytes per row, one 128-byte swizzle line), the
    untuned default first. sm_90: 128x128 one warpgroup 3 stages with two programs per SM (96
    KiB each: one program's epilogue under the other's MMAs; the fastest fp8 GEMM alone at both
    DeepSeek-V3 shapes in H200 run 6.2: gate_up 2.847 / down 1.554 ms vs 128x256 s3 2.950 /
    1.666; its 4-stage ring, 128 KiB, would not fit two per SM), 128x256 (8 warps: 128 fp32
    accumulator registers per thread) with 3 / 4 stages (144 / 192 KiB ring; s4 2.925 / 1.656).
    The tuner (``grouped_gemm_kernel._choose``) times them all per shape. Removed: 128x128
    BLOCK_K 64 with 5 / 6 stages, two per SM (H200 call 13.6, ``f8s`` alone, graph: 0.88-0.94x
    the 128x128 BLOCK_K 128 tile on Qwen3-30B-A3B and gpt-oss-20b, also on K = 768); 256x128 s3
    (slowest, 3.067 / 1.786 ms); 64x256 w4 s4 (half the ragged rows at each group's end, meant
    for many small groups: lost on Qwen3-30B-A3B down in calls 7.x, 0.264-0.306 vs 0.235-0.251
    ms, and as ``f8s`` in H200 call 8.2, 0.986x / 0.938x ``f8tma`` 128x128 on gate_up / down
    where ``f8s`` 128x128 reached 1.035x / 1.073x). CPU (interpreter): tiny tiles."""
    if family == ArchFamily.CPU:
        return (GemmConfig(16, 16, 32, 2, 1, 1), GemmConfig(32, 16, 64, 1, 1, 1))
    return (
        GemmConfig(128, 128, 128, 8, 4, 3, programs_per_cu=2),
        GemmConfig(128, 256, 128, 8, 8, 3),
        GemmConfig(128, 256, 128, 8, 8, 4),
    )


def _tma_store_cfg(cfg: GemmConfig, family: ArchFamily) -> bool:
    """Tiles of plan ``f8tmas``: the 8-warp 3-stage ones (the 32 KiB store staging on top of a
    4-stage ring exceeds sm_90's shared memory); the first CPU tile."""
    if family == ArchFamily.CPU:
        return cfg == fp8_tma_configs(family)[0]
    return cfg.num_warps == 8 and cfg.num_stages == 3


@functools.cache
def fp8_tma_enabled() -> bool:
    """``PRIMUS_TURBO_GROUPED_GEMM_FP8_TMA``: ``1`` (default) this kernel where usable, ``0`` the
    pointer kernels."""
    from primus_turbo.pytorch.core.checks import env_flag

    return env_flag("PRIMUS_TURBO_GROUPED_GEMM_FP8_TMA", True)


@functools.cache
def fp8_config_filter() -> tuple[str, ...]:
    """``PRIMUS_TURBO_GROUPED_GEMM_FP8_CONFIG``: comma-separated names (``m128n256k128g8w8s3``)
    of the candidates to keep; empty (default): all of ``fp8_tma_configs``."""
    import os

    raw = os.environ.get("PRIMUS_TURBO_GROUPED_GEMM_FP8_CONFIG", "").strip()
    return tuple(x.strip() for x in raw.split(",") if x.strip())


def fp8_tma_plans(family: ArchFamily) -> list[tuple[str, GemmConfig]]:
    """The tuner's candidates (``PRIMUS_TURBO_GROUPED_GEMM_FP8_KERNEL``: ``pre`` default, the
    session-8 ``f8s`` plans; ``tma`` session 7's ``f8tma`` / ``f8tmas``; ``all`` both),
    restricted to the names in ``PRIMUS_TURBO_GROUPED_GEMM_FP8_CONFIG`` when set.
    (Small-expert tiles 64x128 / 128x64, timed in H200 call 7.2 on Qwen3-30B-A3B, never won
    the tuner: removed.)"""
    kernels = fp8_kernel_set()
    cands = []
    if kernels in ("tma", "all"):
        cands += [("f8tma", cfg) for cfg in fp8_tma_configs(family)]
        cands += [("f8tmas", cfg) for cfg in fp8_tma_configs(family)
                  if _tma_store_cfg(cfg, family)]  # fmt: skip
    if kernels in ("pre", "all"):
        cands += [(v, cfg) for v in PRE_VARIANTS for cfg in fp8_tma_configs(family)]
    names = fp8_config_filter()
    if not names:
        return cands
    kept = [p for p in cands if p[1].name in names or f"{p[0]}:{p[1].name}" in names]
    if not kept:
        have = sorted(f"{p[0]}:{p[1].name}" for p in cands)
        raise ValueError(
            f"primus_turbo: PRIMUS_TURBO_GROUPED_GEMM_FP8_CONFIG expected config names in {have}, "
            f"got {names}"
        )
    return kept


# Session-8 plans of ``grouped_gemm_fp8_pre_kernel``. Measured and removed after H200 call 8.1
# (fp8 GEMM alone, graph): f8h (f8tma with the epilogue in two halves), f8ph / f8sp (the scale
# lines prefetched to L1), the 128x128 two-warpgroup tile capped at 128 registers: at best
# +0.5-5 % over f8tma where f8s gained 2.6-11 %. After call 8.2: f8sm (a group's remainder of
# <= 64 rows and the groups below 128 rows in 64-row tiles: Qwen3-30B-A3B's MMA padding 11.1 ->
# 6.2 %, but 0.985-1.006x / 0.948-1.019x f8tma on gate_up / down vs f8s 1.035-1.039x / 1.073x;
# op level KERNEL=mixed 1.51 / 1.44 vs 1.46 / 1.44 bf16 with a bf16 peer 5 % apart: noise).
# Shared memory of f8s (16 / 32 KiB store staging): 128x128 s3 115224 B (two CTAs per SM),
# 128x256 s3 181272 B, s4 230432 B.
PRE_VARIANTS = ("f8s",)


def _stores_by_tma(variant: str) -> bool:
    return variant == "f8tmas" or variant in PRE_VARIANTS


@functools.cache
def fp8_kernel_set() -> str:
    """``PRIMUS_TURBO_GROUPED_GEMM_FP8_KERNEL``: which plans the tuner times. ``pre``
    (default: session 8's ``f8s``, see ``grouped_gemm_fp8_pre_kernel``), ``tma`` (session 7's
    ``f8tma`` / ``f8tmas``, for A/B), ``all`` (both)."""
    from primus_turbo.triton.grouped_gemm.grouped_gemm_configs import _env_choice

    return _env_choice("PRIMUS_TURBO_GROUPED_GEMM_FP8_KERNEL", "pre", ("pre", "tma", "all"))


def _descriptor_ok(t: torch.Tensor) -> bool:
    """1-byte elements, unit inner stride, 16-byte aligned base and outer strides."""
    if t.element_size() != 1 or t.stride(-1) != 1 or t.data_ptr() % 16:
        return False
    return all(s % 16 == 0 for s in t.stride()[:-1])


def fp8_tma_device_ok(device: torch.device) -> bool:
    """Env on, and CUDA sm_90+ (or the CPU interpreter)."""
    from primus_turbo.pytorch.core.platform import triton_interpret

    if not fp8_tma_enabled():
        return False
    if device.type == "cpu":
        return triton_interpret()
    if device.type != "cuda" or torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def fp8_tma_usable(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> bool:
    """CUDA sm_90+ (or the CPU interpreter), env on, fp8 ``a [M, K]`` and contiguous
    ``b [G, N, K]`` with 16-byte rows (``K % 16 == 0``)."""
    if not fp8_tma_device_ok(a.device):
        return False
    if not b.is_contiguous() or a.shape[1] < 16:
        return False
    return _descriptor_ok(a) and _descriptor_ok(b)


def launch_fp8_tma(
    a, b, c, group_offs, sa, sb, cfg: GemmConfig, programs: int, variant: str = "f8tma",
    lens: bool = False,
) -> None:  # fmt: skip
    """One launch of plan ``variant`` (``f8tma`` flat TMA kernel, ``f8tmas`` with the TMA-store
    epilogue, ``f8s`` the session-8 kernel). ``f8s`` only: ``lens`` (``group_offs`` is the
    int64 group sizes ``[G]``)."""
    if lens and variant not in PRE_VARIANTS:
        raise ValueError(f"launch_fp8_tma: lens needs plan {PRE_VARIANTS}, got {variant}")
    from triton.tools.tensor_descriptor import TensorDescriptor

    from primus_turbo.triton.grouped_gemm.grouped_gemm_kernel import _interpreting

    a_desc, b_desc, m, n, k, g = operand_descs(a, b, True, cfg)
    interp = _interpreting()
    args = (a_desc, b_desc, c, group_offs, m, n, k, g, c.stride(0), c.stride(1), programs)
    scales = {"sa_ptr": sa, "sb_ptr": sb, "stride_sa": sa.stride(0), "stride_sbg": sb.stride(0),
              "stride_sbn": sb.stride(1), "SCALED": True}  # fmt: skip
    if variant in PRE_VARIANTS:
        c_desc = TensorDescriptor.from_tensor(c, [cfg.block_m, cfg.block_n // 2])
        grouped_gemm_fp8_pre_kernel[(programs,)](
            a_desc, b_desc, c, c_desc, group_offs, sa, sb, m, n, k, g, c.stride(0), c.stride(1),
            sa.stride(0), sb.stride(0), sb.stride(1), programs,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
            G_PAD=triton.next_power_of_2(max(g, 2)), FLATTEN=not interp, UPCAST=interp,
            LENS=lens,
            **cfg.options,
        )  # fmt: skip
        return
    store = {}
    if variant == "f8tmas":
        c_desc = TensorDescriptor.from_tensor(c, [cfg.block_m, cfg.block_n // 2])
        store = {"c_desc": c_desc, "TMA_STORE": True}
    # f8tmas: not flattened (Triton 3.6 fails on the TMA-store branch in a flattened loop with
    # the scale loads: "'scf.if' op region control flow edge ... source has 1 operands")
    grouped_gemm_flat_tma_kernel[(programs,)](
        *args, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m, TRANS_B=True, G_PAD=triton.next_power_of_2(max(g, 2)),
        FLATTEN=not interp and not store,
        UPCAST=interp, **store, **scales, **cfg.options,
    )  # fmt: skip


def grouped_gemm_fp8_tma(
    a: torch.Tensor,
    b: torch.Tensor,
    group_offs: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    out_dtype: torch.dtype,
    config: GemmConfig | None = None,
    variant: str = "f8tma",
    group_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[M, N]`` of ``out_dtype`` (rows past ``group_offs[G]`` zero); operands as in the module
    doc (the caller checks ``fp8_tma_usable``). The tile is the config tuner's choice per shape
    (``grouped_gemm_kernel._choose``: timed on the first call on a GPU unless capturing or
    ``PRIMUS_TURBO_TRITON_TUNE=0``) or ``config`` (with ``variant``: ``f8tma`` / ``f8tmas``).
    ``group_offs=None`` (with ``group_lens``): the ``f8s`` plans build the group table from the
    sizes in the kernel (``LENS``); other plans get ``group_offsets(group_lens)``."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel as gk

    m, k = a.shape
    g, n = b.shape[0], b.shape[1]
    c = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if m == 0 or n == 0:
        return c
    if k == 0 or g == 0:
        return c.zero_()
    family = arch_family(a.device)
    sa = a_scale.reshape(-1)
    sb = b_scale
    plans = fp8_tma_plans(family) if config is None else [(variant, config)]
    if config is None and (c.element_size() != 2 or (n * 2) % 16):  # TMA store: 2-byte out
        plans = [p for p in plans if not _stores_by_tma(p[0])] or [("f8tma", plans[0][1])]
    pre_only = all(p[0] in PRE_VARIANTS for p in plans)
    lens = group_offs is None and pre_only
    if group_offs is None and not lens:
        from primus_turbo.pytorch.reference.grouped_gemm import group_offsets

        group_offs = group_offsets(group_lens)
    offs_arg = group_lens.contiguous() if lens else group_offs

    def launch(plan: tuple[str, GemmConfig]) -> None:
        cfg = plan[1]
        bound = (-(-m // cfg.block_m) + g + 1) * -(-n // cfg.block_n)
        programs = gk._programs(bound, cfg, a.device, family)
        launch_fp8_tma(a, b, c, offs_arg, sa, sb, cfg, programs, plan[0], lens)

    if config is not None:
        launch(plans[0])
        return c
    default = plans[0]
    key = ("fp8fwd", gk._bucket(m), n, k, g, a.dtype, out_dtype, a.device, tuple(plans))
    work = m * n * k
    plan = plans[0] if len(plans) == 1 else gk._choose(key, default, launch, family, work, plans)
    launch(plan)
    return c


# ---- ahead-of-time check ---------------------------------------------------------------------


def aot_specs(target: str) -> list:
    """sm_90 only (TMA descriptors are CUDA-only): every fp8 config, E4M3 operands, bf16 out."""
    from primus_turbo.triton.aot import AotSpec

    if target != "sm_90":
        return []
    specs = []
    base = fp8_tma_configs(ArchFamily.HOPPER)
    for cfg in base:
        bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
        sig = {"a_desc": f"tensordesc<fp8e4nv[{bm},{bk}]>",
               "b_desc": f"tensordesc<fp8e4nv[{bn},{bk}]>", "c_ptr": "*bf16", "offs_ptr": "*i64",
               "sa_ptr": "*fp32", "sb_ptr": "*fp32", "M": "i32", "N": "i32:16", "K": "i32:16",
               "G": "i32", "stride_cm": "i32:16", "stride_cn": "i32:1", "stride_sa": "i32",
               "stride_sbg": "i32:16", "stride_sbn": "i32:1", "num_programs": "i32"}  # fmt: skip
        consts = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": cfg.group_m,
                  "TRANS_B": True, "G_PAD": 256, "FLATTEN": True, "UPCAST": False,
                  "N_MAJOR": False, "SCALED": True}  # fmt: skip
        specs.append(AotSpec(f"grouped_gemm_fp8_tma_{cfg.name}", grouped_gemm_flat_tma_kernel,
                             sig, {**consts, "c_desc": None, "TMA_STORE": False},
                             cfg.options))  # fmt: skip
        if _tma_store_cfg(cfg, ArchFamily.HOPPER):
            sig_s = {**sig, "c_desc": f"tensordesc<bf16[{bm},{bn // 2}]>"}
            specs.append(AotSpec(f"grouped_gemm_fp8_tmas_{cfg.name}",
                                 grouped_gemm_flat_tma_kernel, sig_s,
                                 {**consts, "TMA_STORE": True, "FLATTEN": False},
                                 cfg.options))  # fmt: skip
    for variant in PRE_VARIANTS:
        for cfg in base:
            bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
            sig = {"a_desc": f"tensordesc<fp8e4nv[{bm},{bk}]>",
                   "b_desc": f"tensordesc<fp8e4nv[{bn},{bk}]>", "c_ptr": "*bf16",
                   "c_desc": f"tensordesc<bf16[{bm},{bn // 2}]>", "offs_ptr": "*i64",
                   "sa_ptr": "*fp32", "sb_ptr": "*fp32", "M": "i32", "N": "i32:16",
                   "K": "i32:16", "G": "i32", "stride_cm": "i32:16", "stride_cn": "i32:1",
                   "stride_sa": "i32", "stride_sbg": "i32:16", "stride_sbn": "i32:1",
                   "num_programs": "i32"}  # fmt: skip
            consts = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": cfg.group_m,
                      "G_PAD": 256, "FLATTEN": True, "UPCAST": False, "LENS": False}  # fmt: skip
            specs.append(AotSpec(f"grouped_gemm_fp8_{variant}_{cfg.name}",
                                 grouped_gemm_fp8_pre_kernel, sig, consts,
                                 cfg.options))  # fmt: skip
            # session 9: the table from the group sizes (the op's default forward)
            specs.append(AotSpec(f"grouped_gemm_fp8_{variant}_lens_{cfg.name}",
                                 grouped_gemm_fp8_pre_kernel, sig, {**consts, "LENS": True},
                                 cfg.options))  # fmt: skip
    return specs
