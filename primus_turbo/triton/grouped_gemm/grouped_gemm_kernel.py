"""Grouped GEMMs for MoE experts in Triton, persistent and free of host synchronisation.

Two kernels, both with fp32 accumulation and operands addressed through strides (so every
transpose is a stride swap, never a copy):

* ``grouped_gemm_kernel``: ``C[r, :] = A[r, :] @ B[g]`` for the rows ``r`` of group ``g``
  (``offs[g] <= r < offs[g+1]``). ``A [M, K]``, ``B [G, K, N]`` (any strides), ``C [M, N]``.
  Forward and dgrad.
* ``variable_k_kernel``: ``C[g] = X_g^T @ Y_g`` over the rows of group ``g``; ``X [M, P]``,
  ``Y [M, Q]``, ``C [G, P, Q]``. The wgrad, whose reduction length differs per group.

Grid mapping. The host never reads the group sizes, so the forward tile space (each group's
``ceil(m_g / BLOCK_M) * ceil(N / BLOCK_N)`` tiles, concatenated over groups) is discovered
in-kernel: a fixed number of programs each load the int64 offsets once as one ``[G_PAD]``
vector, build the per-group tile counts and their inclusive scan in registers, and take the
tiles ``t`` of the global sequence with ``t % num_programs == pid``; a tile's group is the number
of scan entries ``<= t`` (a vector compare and sum, no per-group scalar loop). Within a group
the tiles are swizzled in bands of ``GROUP_M`` row tiles so concurrently running programs share
B columns in L2. A pseudo-group ``G`` covers the
rows past ``offs[G]`` (up to ``M``) and writes zeros there, so an over-allocated ``A`` gives a
defined output. Offsets are clamped to ``[0, M]`` so malformed sizes can never address memory
outside the tensors. The variable-K tile space ``G * ceil(P/BM) * ceil(Q/BN)`` is known on the
host; each tile loops over its group's rows (zero rows -> a zero tile).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from primus_turbo.pytorch.core.platform import (
    ArchFamily,
    arch_family,
    is_graph_capturing,
    num_compute_units,
    triton_interpret,
)
from primus_turbo.triton.aot import AOT_TARGETS, AotSpec, triton_dtype_name
from primus_turbo.triton.gemm.gemm_configs import GemmConfig
from primus_turbo.triton.gemm.gemm_kernel import _config_tuning_enabled, _tile_coords, _tile_mma
from primus_turbo.triton.grouped_gemm.grouped_gemm_configs import (
    flat_config_ok,
    forward_plans,
    grouped_gemm_configs,
    kernel_variant,
    select_grouped_config,
    select_variable_k_config,
    variable_k_plans,
    variable_k_variant,
)
from primus_turbo.triton.grouped_gemm.grouped_gemm_tune import _tune_min_work, time_candidates


@triton.jit
def _group_rows(offs_ptr, g, G, M):
    """Rows ``[start, end)`` of group ``g`` (``g == G``: the tail past the last offset)."""
    start = tl.load(offs_ptr + g).to(tl.int64)
    end = tl.load(offs_ptr + tl.minimum(g + 1, G)).to(tl.int64)
    end = tl.where(g < G, end, M)
    start = tl.minimum(tl.maximum(start, 0), M)
    end = tl.minimum(tl.maximum(end, start), M)
    return start, end


@triton.jit
def _group_table(offs_ptr, G, M, num_pid_n, BLOCK_M: tl.constexpr, G_PAD: tl.constexpr):
    """Every group's rows and tile range, as ``[G_PAD]`` register vectors (one vector load of
    the offsets instead of a dependent scalar load per group). Index ``G`` is the tail
    pseudo-group (rows past ``offs[G]``), indices past ``G`` are empty."""
    gi = tl.arange(0, G_PAD)
    lo = tl.load(offs_ptr + tl.minimum(gi, G), mask=gi <= G, other=0).to(tl.int64)
    hi = tl.load(offs_ptr + tl.minimum(gi + 1, G), mask=gi < G, other=0).to(tl.int64)
    hi = tl.where(gi < G, hi, M)
    lo = tl.where(gi <= G, tl.minimum(tl.maximum(lo, 0), M), M)
    hi = tl.where(gi <= G, tl.minimum(tl.maximum(hi, lo), M), M)
    tiles = tl.cdiv((hi - lo).to(tl.int32), BLOCK_M) * num_pid_n
    ends = tl.cumsum(tiles, axis=0)  # inclusive: group g owns tiles [ends[g] - tiles[g], ends[g])
    return gi, lo, hi, tiles, ends


@triton.jit
def grouped_gemm_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    offs_ptr,
    M,
    N,
    K,
    G,
    stride_am,
    stride_ak,
    stride_bg,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    num_programs,
    as_ptr,
    bs_ptr,
    stride_as,
    stride_bsg,
    stride_bsn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
    UPCAST: tl.constexpr,
    SCALED: tl.constexpr = False,
    G_PAD: tl.constexpr = 2,
):
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    gi, lo, hi, tiles, ends = _group_table(offs_ptr, G, M, num_pid_n, BLOCK_M, G_PAD)
    total = tl.sum(tiles, axis=0)
    for t_glob in range(pid, total, num_programs):
        # the group of this tile: how many groups end at or before it (vector compare + sum)
        g = tl.sum((ends <= t_glob).to(tl.int32), axis=0)
        here = gi == g
        start = tl.sum(tl.where(here, lo, 0), axis=0)
        m_g = (tl.sum(tl.where(here, hi, 0), axis=0) - start).to(tl.int32)
        t = t_glob - tl.sum(tl.where(here, ends - tiles, 0), axis=0)
        num_pid_m = tl.cdiv(m_g, BLOCK_M)
        k_end = tl.where(g < G, k_tiles, 0)  # the tail pseudo-group only writes zeros
        b_base = b_ptr + tl.cast(g, tl.int64) * stride_bg
        pid_m, pid_n = _tile_coords(t, num_pid_m, num_pid_n, GROUP_M)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        # 64-bit row indices from plain aranges keep the contiguity visible to Triton's axis
        # analysis (vector loads) while rows past 2**31 / M*K past 2**31 stay addressable.
        rows = start + rm.to(tl.int64)
        rn64 = rn.to(tl.int64)
        mask_m = rm[:, None] < m_g
        mask_n = rn[None, :] < N
        acc = _tile_mma(
            a_ptr, b_base, rows, rn64, mask_m, mask_n, 0, k_end, K,
            stride_am, stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, UPCAST,
        )  # fmt: skip
        if SCALED:  # fp8: per-row scale of A, per-(group, column) scale of B
            sa = tl.load(as_ptr + rows * stride_as, mask=rm < m_g, other=0.0)
            bs_base = bs_ptr + tl.cast(g, tl.int64) * stride_bsg
            sb = tl.load(bs_base + rn64 * stride_bsn, mask=rn < N, other=0.0)
            acc = acc * sa[:, None] * sb[None, :]
        c_ptrs = c_ptr + rows[:, None] * stride_cm + rn64[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m & mask_n)


@triton.jit
def variable_k_kernel(
    x_ptr,
    y_ptr,
    c_ptr,
    offs_ptr,
    M,
    P,
    Q,
    G,
    stride_xm,
    stride_xp,
    stride_ym,
    stride_yq,
    stride_cg,
    stride_cp,
    stride_cq,
    num_programs,
    xs_ptr,
    ys_ptr,
    stride_xs,
    stride_ys,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    UPCAST: tl.constexpr,
    SCALED: tl.constexpr = False,
):
    pid = tl.program_id(0)
    num_pid_p = tl.cdiv(P, BLOCK_M)
    num_pid_q = tl.cdiv(Q, BLOCK_N)
    per_group = num_pid_p * num_pid_q
    offs_k = tl.arange(0, BLOCK_K)
    for w in range(pid, G * per_group, num_programs):
        g = w // per_group
        pid_p, pid_q = _tile_coords(w % per_group, num_pid_p, num_pid_q, GROUP_M)
        start, end = _group_rows(offs_ptr, g, G, M)
        m_g = (end - start).to(tl.int32)
        rp = pid_p * BLOCK_M + tl.arange(0, BLOCK_M)
        rq = pid_q * BLOCK_N + tl.arange(0, BLOCK_N)
        rp64 = rp.to(tl.int64)
        rq64 = rq.to(tl.int64)
        mask_p = rp[:, None] < P
        mask_q = rq[None, :] < Q
        x_ptrs = x_ptr + rp64[:, None] * stride_xp + (start + offs_k)[None, :] * stride_xm
        y_ptrs = y_ptr + (start + offs_k)[:, None] * stride_ym + rq64[None, :] * stride_yq
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(0, tl.cdiv(m_g, BLOCK_K)):
            r_left = m_g - kt * BLOCK_K
            x = tl.load(x_ptrs, mask=mask_p & (offs_k[None, :] < r_left), other=0.0)
            y = tl.load(y_ptrs, mask=mask_q & (offs_k[:, None] < r_left), other=0.0)
            if UPCAST:
                x = x.to(tl.float32)
                y = y.to(tl.float32)
            acc = tl.dot(x, y, acc)
            x_ptrs += BLOCK_K * stride_xm
            y_ptrs += BLOCK_K * stride_ym
        if SCALED:  # fp8: per-column scales of X and Y (shared by every group)
            sx = tl.load(xs_ptr + rp64 * stride_xs, mask=rp < P, other=0.0)
            sy = tl.load(ys_ptr + rq64 * stride_ys, mask=rq < Q, other=0.0)
            acc = acc * sx[:, None] * sy[None, :]
        c_ptrs = (
            c_ptr
            + tl.cast(g, tl.int64) * stride_cg
            + rp64[:, None] * stride_cp
            + rq64[None, :] * stride_cq
        )
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_p & mask_q)


# ---- launchers -----------------------------------------------------------------------------

# Programs per launch on the CPU interpreter: more than one so the persistent walk is exercised.
_INTERPRETER_PROGRAMS = 3


@functools.cache
def _interpreting() -> bool:
    return triton_interpret()


_tuned: dict[tuple, GemmConfig] = {}


def _bucket(x: int) -> int:
    """Nearby row counts share a tuning result (the group sizes themselves are not known)."""
    return 1 << max(x - 1, 0).bit_length()


def _choose(key: tuple, default, launch, family: ArchFamily, work: int = 1 << 62, candidates=None):
    """The heuristic's config, or (on a GPU, first call per key, not while capturing a graph,
    ``work = M * N * K`` at least ``_tune_min_work()``) the fastest of the family's configs
    timed on this call's inputs. Timing synchronises once per key;
    ``PRIMUS_TURBO_TRITON_TUNE=0`` keeps the heuristic (no synchronisation at all)."""
    choice = _tuned.get(key)  # an earlier timing's answer also holds while capturing a graph
    if choice is not None:
        return choice
    if family == ArchFamily.CPU or is_graph_capturing() or not _config_tuning_enabled():
        return default
    if work < _tune_min_work():
        return default
    if choice is None:
        cands = list(candidates if candidates is not None else grouped_gemm_configs(family))
        timings = time_candidates(cands, launch)
        choice = min(timings, key=timings.get) if timings else default
        _tuned[key] = choice
        _tune_times[key] = timings
    return choice


_tune_times: dict[tuple, dict] = {}  # key -> {candidate: ms} of the timing that chose _tuned[key]


def _flat_tma_usable(a: torch.Tensor, b: torch.Tensor, trans_b: bool, scaled: bool) -> bool:
    from primus_turbo.triton.grouped_gemm.grouped_gemm_tma import flat_tma_usable

    return flat_tma_usable(a, b, trans_b, scaled)


def _tma_usable(a: torch.Tensor, b: torch.Tensor, trans_b: bool) -> bool:
    from primus_turbo.triton.grouped_gemm.grouped_gemm_tma import tma_usable

    return tma_usable(a, b, trans_b)


def _programs(work_bound: int, cfg: GemmConfig, device: torch.device, family: ArchFamily) -> int:
    if family == ArchFamily.CPU:
        return max(1, min(work_bound, _INTERPRETER_PROGRAMS))
    return max(1, min(work_bound, num_compute_units(device) * cfg.programs_per_cu))


def grouped_gemm_triton(
    a: torch.Tensor,
    b: torch.Tensor,
    group_offs: torch.Tensor,
    trans_b: bool,
    out_dtype: torch.dtype | None = None,
    config: GemmConfig | None = None,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """``C[rows of g] = a[rows of g] @ op(b[g])`` with the persistent Triton kernel.

    Args:
        a: ``[M, K]`` fp16/bf16, rows packed by group.
        b: ``[G, K, N]``, or ``[G, N, K]`` when ``trans_b``; same dtype as ``a``.
        group_offs: int64 ``[G + 1]`` exclusive prefix sum of the group sizes, on a's device.
        out_dtype: default ``a.dtype``.
        config: tile config (default: the heuristic's choice).
        scales: fp8 operands only: ``(a_scale [M] or [M, 1], b_scale [G, N])`` fp32
            dequantisation factors (a 0-stride expand gives tensorwise scaling).
    Returns:
        ``[M, N]``; rows past ``group_offs[G]`` are zero.
    """
    m, k = a.shape
    g = b.shape[0]
    n = b.shape[1] if trans_b else b.shape[2]
    c = torch.empty((m, n), dtype=out_dtype or a.dtype, device=a.device)
    if m == 0 or n == 0:
        return c
    if k == 0 or g == 0:
        return c.zero_()
    sbk, sbn = (b.stride(2), b.stride(1)) if trans_b else (b.stride(1), b.stride(2))
    family = arch_family(a.device)
    sa, sb = scales if scales is not None else (c, c)
    sa_stride = sa.stride(0) if scales is not None else 0
    sb_strides = (sb.stride(0), sb.stride(1)) if scales is not None else (0, 0)

    use_tma = scales is None and family == ArchFamily.HOPPER and _tma_usable(a, b, trans_b)
    g_pad = triton.next_power_of_2(g + 1)  # the group table also holds the tail pseudo-group

    upcast = _interpreting() and a.dtype == torch.bfloat16
    flags = dict(EVEN_K=False, UPCAST=upcast, SCALED=scales is not None)
    flatten = family in (ArchFamily.HOPPER, ArchFamily.OTHER_GPU) and torch.version.hip is None

    def launch(plan: tuple[str, GemmConfig]) -> None:
        variant, cfg = plan
        bound = (-(-m // cfg.block_m) + g + 1) * -(-n // cfg.block_n)
        programs = _programs(bound, cfg, a.device, family)
        flags["EVEN_K"] = k % cfg.block_k == 0
        if variant.startswith("tma"):  # grouped_gemm_tma.TMA_VARIANTS
            from primus_turbo.triton.grouped_gemm.grouped_gemm_tma import launch_flat_tma

            return launch_flat_tma(
                a, b, c, group_offs, trans_b, cfg, programs, flatten, upcast, variant
            )
        if variant == "flat":
            from primus_turbo.triton.grouped_gemm.grouped_gemm_flat import launch_flat

            strides = (a.stride(0), a.stride(1), b.stride(0), sbk, sbn, c.stride(0), c.stride(1))
            return launch_flat(
                a, b, c, group_offs, m, n, k, g, strides, (sa, sb, sa_stride, *sb_strides),
                cfg, programs, dict(flags, FLATTEN=flatten),
            )  # fmt: skip
        if use_tma:
            from primus_turbo.triton.grouped_gemm.grouped_gemm_tma import launch_tma

            return launch_tma(a, b, c, group_offs, trans_b, cfg, programs)
        grouped_gemm_kernel[(programs,)](
            a, b, c, group_offs, m, n, k, g, a.stride(0), a.stride(1), b.stride(0), sbk, sbn,
            c.stride(0), c.stride(1), programs, sa, sb, sa_stride, *sb_strides,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
            G_PAD=g_pad, **flags, **cfg.options,
        )  # fmt: skip

    mode = "table" if use_tma else kernel_variant()
    tma_ok = mode in ("tma", "tune") and _flat_tma_usable(a, b, trans_b, scales is not None)
    if config is not None:
        plan = ("flat" if mode == "flat" else "table", config)
    else:
        cfg = select_grouped_config(m, n, k, g, family, num_compute_units(a.device))
        plans = forward_plans(family, mode, tma_ok, k, trans_b, m // g, n)
        default = ("table", cfg) if mode == "tune" else plans[0]
        if mode != "tune" and any(p[1] == cfg for p in plans):
            default = next(p for p in plans if p[1] == cfg)  # the heuristic's tile, this kernel
        key = ("fwd", _bucket(m), n, k, g, a.dtype, c.dtype, sbk == 1, a.stride(1) == 1, a.device,
               use_tma, mode, tma_ok)  # fmt: skip
        work = m * n * k
        plan = plans[0] if len(plans) == 1 else _choose(key, default, launch, family, work, plans)
    launch(plan)
    return c


def variable_k_triton(
    x: torch.Tensor,
    y: torch.Tensor,
    group_offs: torch.Tensor,
    num_groups: int,
    out_dtype: torch.dtype,
    config: GemmConfig | None = None,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """``C[g] = x[rows of g]^T @ y[rows of g]`` for every group (the grouped-GEMM wgrad).

    Args:
        x: ``[M, P]``; y: ``[M, Q]`` (same dtype, fp16/bf16, any strides).
        group_offs: int64 ``[G + 1]`` on x's device.
        scales: fp8 operands only: ``(x_scale [P], y_scale [Q])`` fp32 per-column factors.
    Returns:
        ``[G, P, Q]`` of ``out_dtype``; groups with no rows give zeros.
    """
    m, p = x.shape
    q = y.shape[1]
    c = torch.empty((num_groups, p, q), dtype=out_dtype, device=x.device)
    if num_groups == 0 or p == 0 or q == 0:
        return c
    if m == 0:
        return c.zero_()
    family = arch_family(x.device)
    sx, sy = scales if scales is not None else (c, c)
    s_strides = (sx.stride(-1), sy.stride(-1)) if scales is not None else (0, 0)

    upcast = _interpreting() and x.dtype == torch.bfloat16

    def launch(plan: tuple[str, GemmConfig]) -> None:
        variant, cfg = plan
        tiles = num_groups * -(-p // cfg.block_m) * -(-q // cfg.block_n)
        programs = _programs(tiles, cfg, x.device, family)
        if variant == "tmavd":  # device-built per-group descriptors (session 13)
            from primus_turbo.triton.grouped_gemm import grouped_gemm_vk_desc as vkd

            if vkd.vk_desc_ok(x, y, c):
                return vkd.launch_variable_k_desc(
                    x, y, c, group_offs, num_groups, cfg, programs, upcast
                )
        if variant in ("tma", "tmavs", "tmavd"):  # tmavs: TMA-store epilogue (session 8)
            from primus_turbo.triton.grouped_gemm.grouped_gemm_tma import (
                launch_variable_k_tma,
                vk_tma_store_ok,
            )

            store = variant in ("tmavs", "tmavd") and vk_tma_store_ok(c)
            return launch_variable_k_tma(
                x, y, c, group_offs, num_groups, cfg, programs, upcast, store
            )
        variable_k_kernel[(programs,)](
            x,
            y,
            c,
            group_offs,
            m,
            p,
            q,
            num_groups,
            x.stride(0),
            x.stride(1),
            y.stride(0),
            y.stride(1),
            c.stride(0),
            c.stride(1),
            c.stride(2),
            programs,
            sx,
            sy,
            *s_strides,
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
            GROUP_M=cfg.group_m,
            UPCAST=upcast,
            SCALED=scales is not None,
            **cfg.options,
        )

    if config is not None:
        launch(("table", config))
        return c
    from primus_turbo.triton.grouped_gemm.grouped_gemm_tma import variable_k_tma_usable

    mode = variable_k_variant()
    tma_ok = mode != "table" and variable_k_tma_usable(x, y, scales is not None)
    plans = variable_k_plans(family, mode, tma_ok, m // num_groups, p, q)
    cfg = select_variable_k_config(p, q, m, num_groups, family, num_compute_units(x.device))
    default = next((pl for pl in plans if pl[1] == cfg), plans[0])
    if mode == "tune":
        default = ("table", cfg)
    key = ("vk", _bucket(m), p, q, num_groups, x.dtype, c.dtype, x.stride(1) == 1,
           y.stride(1) == 1, x.device, mode, tma_ok)  # fmt: skip
    plan = plans[0] if len(plans) == 1 else _choose(key, default, launch, family, m * p * q, plans)
    launch(plan)
    return c


# ---- ahead-of-time check -------------------------------------------------------------------

_AOT_FAMILY = {"gfx942": ArchFamily.CDNA3, "gfx950": ArchFamily.CDNA4, "sm_90": ArchFamily.HOPPER}


def aot_specs(target: str) -> list[AotSpec]:
    """Every config of the target's family for bf16: the forward as launched with ``trans_b``
    (weights ``[G, N, K]``, the GroupedLinear layout), the dgrad layout (``[G, N, K]`` read as
    ``[K, N]`` rows) and the wgrad kernel (``X = grad [M, N]``, ``Y = a [M, K]``)."""
    assert target in AOT_TARGETS, target
    family = _AOT_FAMILY[target]
    cus = 304 if family != ArchFamily.HOPPER else 132
    default = select_grouped_config(65536, 4096, 7168, 32, family, cus)
    t = triton_dtype_name(torch.bfloat16)
    common = {"a_ptr": f"*{t}", "b_ptr": f"*{t}", "c_ptr": f"*{t}", "offs_ptr": "*i64"}
    sizes = {"M": "i32", "N": "i32:16", "K": "i32:16", "G": "i32"}
    layouts = {
        "nt": {"stride_bk": "i32:1", "stride_bn": "i32:16"},
        "nn": {"stride_bk": "i32:16", "stride_bn": "i32:1"},
    }
    specs = []
    for cfg in grouped_gemm_configs(family):
        for lay, bstrides in layouts.items():
            signature = {
                **common,
                **sizes,
                "stride_am": "i32:16",
                "stride_ak": "i32:1",
                "stride_bg": "i32:16",
                **bstrides,
                "stride_cm": "i32:16",
                "stride_cn": "i32:1",
                "num_programs": "i32",
                "as_ptr": "*fp32",
                "bs_ptr": "*fp32",
                "stride_as": "i32",
                "stride_bsg": "i32",
                "stride_bsn": "i32",
            }
            specs.append(
                AotSpec(
                    name=f"grouped_gemm_{t}_{lay}_{cfg.name}",
                    fn=grouped_gemm_kernel,
                    signature=signature,
                    constexprs={
                        **cfg.tile_constexprs,
                        "EVEN_K": True,
                        "UPCAST": False,
                        "SCALED": False,
                        "G_PAD": 256,  # up to 255 groups (Qwen3-MoE: 128 experts)
                    },
                    options=cfg.options,
                    default=cfg == default and lay == "nt",
                )
            )
        vk_signature = {
            "x_ptr": f"*{t}",
            "y_ptr": f"*{t}",
            "c_ptr": f"*{t}",
            "offs_ptr": "*i64",
            "M": "i32",
            "P": "i32:16",
            "Q": "i32:16",
            "G": "i32",
            "stride_xm": "i32:16",
            "stride_xp": "i32:1",
            "stride_ym": "i32:16",
            "stride_yq": "i32:1",
            "stride_cg": "i32:16",
            "stride_cp": "i32:16",
            "stride_cq": "i32:1",
            "num_programs": "i32",
            "xs_ptr": "*fp32",
            "ys_ptr": "*fp32",
            "stride_xs": "i32",
            "stride_ys": "i32",
        }
        specs.append(
            AotSpec(
                name=f"grouped_gemm_variable_k_{t}_{cfg.name}",
                fn=variable_k_kernel,
                signature=vk_signature,
                constexprs={**cfg.tile_constexprs, "UPCAST": False, "SCALED": False},
                options=cfg.options,
            )
        )
    # fp8 (grouped_gemm_fp8): the scaled epilogue on the default tile, e4m3 operands (FNUZ on
    # gfx942), bf16 output.
    f8 = "fp8e4b8" if target == "gfx942" else "fp8e4nv"
    for spec in [s for s in specs if s.default] + [
        s for s in specs if s.name.startswith("grouped_gemm_variable_k") and default.name in s.name
    ]:
        sig = {**spec.signature}
        for ptr in ("a_ptr", "b_ptr", "x_ptr", "y_ptr"):
            if ptr in sig:
                sig[ptr] = f"*{f8}"
        name = spec.name.replace(f"_{t}_", "_fp8_", 1)
        constexprs = {**spec.constexprs, "SCALED": True}
        specs.append(AotSpec(name, spec.fn, sig, constexprs, spec.options))
    specs += _flat_aot_specs(target, [s for s in specs if s.fn is grouped_gemm_kernel])
    from primus_turbo.triton.grouped_gemm.grouped_gemm_fixup import aot_specs as fixup_specs
    from primus_turbo.triton.grouped_gemm.grouped_gemm_tma import aot_specs as tma_specs
    from primus_turbo.triton.grouped_gemm.grouped_gemm_vk_desc import aot_specs as vkd_specs

    return specs + fixup_specs(target) + tma_specs(target) + vkd_specs(target)


def _flat_aot_specs(target: str, forward_specs: list[AotSpec]) -> list[AotSpec]:
    """The flat variant with every forward spec's signature and config (flattened loop on
    sm_90 only, as launched)."""
    from primus_turbo.triton.grouped_gemm.grouped_gemm_flat import grouped_gemm_flat_kernel

    out = []
    ok = {cfg.name for cfg in grouped_gemm_configs(_AOT_FAMILY[target]) if flat_config_ok(cfg)}
    for spec in forward_specs:
        if not any(spec.name.endswith(f"_{name}") for name in ok):
            continue
        constexprs = {**spec.constexprs, "FLATTEN": target == "sm_90"}
        name = spec.name.replace("grouped_gemm_", "grouped_gemm_flat_", 1)
        out.append(AotSpec(name, grouped_gemm_flat_kernel, spec.signature, constexprs,
                           spec.options))  # fmt: skip
    return out
