"""Tile configs for the grouped Triton GEMMs, as data per arch family, and the pure heuristics.

Nothing here imports Triton or touches a device, so the choice is unit-tested on the CPU. The
per-group row counts live on the device and are never read by the host, so the heuristics see
only what the host knows: the total rows ``M``, the group count ``G``, ``N`` and ``K``.
"""

from __future__ import annotations

import functools

from primus_turbo.pytorch.core.platform import ArchFamily
from primus_turbo.triton.gemm.gemm_configs import GemmConfig


def _amd(bm, bn, bk, warps, stages, waves=0, per_cu=1, group_m=8):
    opts = (("matrix_instr_nonkdim", 16), ("waves_per_eu", waves))
    return GemmConfig(bm, bn, bk, group_m, warps, stages, per_cu, opts)


def configs_cdna3() -> list[GemmConfig]:
    """gfx942: 64 KiB LDS, 2-stage pipeline; no 256x256 tile (spills VGPRs with 8 warps)."""
    return [
        _amd(256, 128, 64, 8, 2, waves=2),
        _amd(128, 256, 64, 8, 2, waves=2),
        _amd(128, 128, 64, 4, 2, waves=2, per_cu=2),
        _amd(64, 128, 64, 4, 2, per_cu=2),
    ]


def configs_cdna4() -> list[GemmConfig]:
    """gfx950: 160 KiB LDS."""
    return [
        _amd(256, 128, 64, 8, 2, waves=2),
        _amd(128, 256, 64, 8, 2, waves=2),
        _amd(128, 128, 64, 4, 2, waves=2, per_cu=2),
        _amd(64, 128, 64, 4, 2, per_cu=2),
    ]


def configs_hopper() -> list[GemmConfig]:
    """sm_90: the dense GEMM's best tile (128x256x64, 8 warps, 3 stages) first.

    The last two target many small groups with a short K (Qwen3-MoE: 128 experts, ~512 rows
    each, K = 2048 / 768, where the H200 ran at ~0.53x torch._grouped_mm): with 12-32 K steps
    per tile, the pipeline fill and the epilogue of every tile weigh a lot, so
    * 128x128x64, 1 warpgroup, 3 stages, two resident programs per SM (96 KiB of shared memory
      and ~230 registers x 128 threads each, so two fit; 8 warps would need 2 x 37K registers):
      one program's epilogue and prologue overlap the other's main loop;
    * 64x256x64 (1 warpgroup, 4 stages, 160 KiB): half the ragged-row waste of a 128-row tile
      at the end of each group, the wide N side keeps the A re-reads low.
    The config tuner times all of them on the first call per shape."""
    return [
        GemmConfig(128, 256, 64, 8, 8, 3),
        GemmConfig(256, 128, 64, 8, 8, 3),
        GemmConfig(128, 128, 64, 8, 4, 4),
        GemmConfig(64, 128, 64, 8, 4, 4, programs_per_cu=2),
        GemmConfig(128, 128, 64, 8, 4, 3, programs_per_cu=2),
        GemmConfig(64, 256, 64, 8, 4, 4),
    ]


def configs_interpreter() -> list[GemmConfig]:
    """Small tiles for the CPU interpreter (masks matter there, speed does not)."""
    return [GemmConfig(16, 16, 16, 2, 1, 1), GemmConfig(32, 32, 32, 4, 4, 1)]


CONFIGS_BY_FAMILY = {
    ArchFamily.CDNA3: configs_cdna3,
    ArchFamily.CDNA4: configs_cdna4,
    ArchFamily.HOPPER: configs_hopper,
    ArchFamily.OTHER_GPU: configs_hopper,
    ArchFamily.CPU: configs_interpreter,
}


@functools.cache
def grouped_gemm_configs(family: ArchFamily) -> tuple[GemmConfig, ...]:
    """The family's configs (built once per process)."""
    return tuple(CONFIGS_BY_FAMILY[family]())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@functools.lru_cache(maxsize=4096)
def select_grouped_config(
    m: int, n: int, k: int, g: int, family: ArchFamily, num_cus: int
) -> GemmConfig:
    """Config for the grouped GEMM ``[M, K] x [G, K, N]`` from host-known sizes only.

    The average group has ``M / G`` rows. Take the largest tile whose M side wastes at most a
    quarter of an average group (ragged last tiles of each group are pure waste) and that still
    gives every CU a tile; fall back to the smallest tile.
    """
    configs = grouped_gemm_configs(family)
    if family == ArchFamily.CPU:
        return configs[0]
    avg = max(m // max(g, 1), 1)
    best = configs[-1]
    best_area = 0
    for cfg in configs:
        tiles_per_group = _cdiv(avg, cfg.block_m) * _cdiv(n, cfg.block_n)
        waste = _cdiv(avg, cfg.block_m) * cfg.block_m - avg
        fits = tiles_per_group * g >= num_cus and waste * 4 <= max(avg, cfg.block_m)
        area = cfg.block_m * cfg.block_n
        if fits and area > best_area:
            best, best_area = cfg, area
    return best


@functools.lru_cache(maxsize=4096)
def select_variable_k_config(
    p: int, q: int, m: int, g: int, family: ArchFamily, num_cus: int
) -> GemmConfig:
    """Config for the variable-K GEMM ``C_g[P, Q] = X_g^T @ Y_g`` (wgrad): the output tile
    space ``G * ceil(P/BM) * ceil(Q/BN)`` is known on the host; the reduction length per group
    (about ``M / G`` rows) is not."""
    configs = grouped_gemm_configs(family)
    if family == ArchFamily.CPU:
        return configs[0]
    best = configs[-1]
    best_area = 0
    for cfg in configs:
        tiles = g * _cdiv(p, cfg.block_m) * _cdiv(q, cfg.block_n)
        area = cfg.block_m * cfg.block_n
        if tiles >= num_cus and area > best_area:
            best, best_area = cfg, area
    return best


# ---- kernel variants and the tuner's candidate plans (env knobs for A/B runs) ----------------


def _env_choice(var: str, default: str, allowed: tuple[str, ...]) -> str:
    import os

    mode = os.environ.get(var, default).strip().lower() or default
    if mode not in allowed:
        raise ValueError(
            f"primus_turbo: {var} expected one of {', '.join(repr(x) for x in allowed)}, "
            f"got {mode!r}"
        )
    return mode


@functools.cache
def kernel_variant() -> str:
    """``PRIMUS_TURBO_GROUPED_GEMM_KERNEL``: the forward/dgrad kernel. ``table`` (the original
    ``grouped_gemm_kernel``), ``flat`` (``grouped_gemm_flat``: flattened, pipelined tile loop
    and a one-pass tile lookup), ``tma`` (the flat walk with TMA operand loads,
    ``grouped_gemm_flat_tma_kernel``; CUDA sm_90+ with aligned contiguous operands, else
    ``flat``), or ``tune`` (default): the config tuner times every variant's configs on the
    first call per shape (``table`` with the heuristic's config where nothing is timed).
    (Session 6's Gluon forward/dgrad ``glf`` / ``glfs`` and the 4-stage flat plan ``flat4``
    were removed: 7.5-7.9 ms and 5.26 ms vs flat 5.14 ms, DeepSeek-V3 gate_up, H200 run 6.2.)"""
    return _env_choice("PRIMUS_TURBO_GROUPED_GEMM_KERNEL", "tune", ("table", "flat", "tma", "tune"))


@functools.cache
def variable_k_variant() -> str:
    """``PRIMUS_TURBO_GROUPED_GEMM_VK``: the wgrad kernel. ``table`` (``variable_k_kernel``,
    pointer loads masked every step), ``tma`` (``variable_k_tma_kernel``: TMA loads for the
    whole K steps of a group, one masked pointer step for its last rows; where usable, else
    ``table``), or ``tune`` (default): timed on the first call per shape. (A "fused" one-loop
    TMA wgrad was tried in session 4 and removed: 2x slower than ``tma`` on every key of the
    H200 run 4.3; session 6's Gluon wgrad ``gl`` / ``gls`` too: 6.75-7.5 ms vs tma 5.51 ms,
    DeepSeek-V3 gate_up, run 6.2.)"""
    return _env_choice("PRIMUS_TURBO_GROUPED_GEMM_VK", "tune", ("table", "tma", "tune"))


@functools.cache
def config_filter(var: str) -> tuple[str, ...]:
    """``PRIMUS_TURBO_GROUPED_GEMM_CONFIG`` (forward/dgrad) / ``..._VK_CONFIG`` (wgrad): a
    comma-separated list of config names (``m128n256k64g8w8s4``: that tile in every kernel
    variant) or ``variant:name`` plans (``tma:m256n128k64g8w8s3``) that restricts the tuner's
    candidates; one that fits means no timing at all. Empty (default): no restriction."""
    import os

    raw = os.environ.get(var, "").strip()
    return tuple(x.strip() for x in raw.split(",") if x.strip())


def flat_config_ok(cfg: GemmConfig) -> bool:
    """The flat variant keeps more values live across the flattened loop: with one warpgroup a
    tile above 64x128 spills on sm_90 (255 registers; the AOT report), so those are left out."""
    return cfg.num_warps >= 8 or cfg.block_m * cfg.block_n <= 64 * 128


def tma_configs(family: ArchFamily, wgrad: bool = False) -> tuple[GemmConfig, ...]:
    """Configs of the TMA kernels (flat forward/dgrad walk and wgrad): every tile, since TMA
    loads need no address registers (the flat pointer kernel's one-warpgroup spills do not
    occur: 64x256 w4 182 and 128x128 w4 185 registers on sm_90), plus the 128x256 tile with
    4 stages (192 KiB operand ring, 183-190 registers, no spills)."""
    base = grouped_gemm_configs(family)
    if family in (ArchFamily.HOPPER, ArchFamily.OTHER_GPU):
        # + 256x128 with 4 stages for the wgrad (the M-major X tile: 192 KiB ring)
        base = (GemmConfig(128, 256, 64, 8, 8, 4), GemmConfig(256, 128, 64, 8, 8, 4), *base)
        # + session 8: GROUP_M 16 (a forward/dgrad winner, call 8.1); ``wgrad``: + the
        # GROUP_M 16 128x256 s4 wgrad tile (``S8_VK_G16``: plan ``tmavs``, call 8.2)
        base = (*base, S8_G16, *((S8_VK_G16,) if wgrad else ()))
    return base


# Session 8: the 128x256 TMA tile walking an expert's row tiles in bands of GROUP_M = 16 (a
# DeepSeek-V3 expert's 2048 rows: a wave of 132 programs reads half of the expert's B columns
# and all its A rows, ~58 MB, instead of 8 row tiles and all of B, ~73 MB, on gate_up). H200
# call 8.1 (graph, interleaved, vs the tuner's default): forward DeepSeek-V3 gate_up 1.063 /
# down 1.040, Mixtral-8x7B 1.026 / 1.035; dgrad DeepSeek-V3 1.014 / 1.060: a default
# forward/dgrad candidate (``HOPPER_WINNERS``). (BLOCK_K 128 with 2 stages lost everywhere,
# 0.82-0.88, and was removed, as were the two-half epilogue plans ``flate`` / ``tmae``:
# -6%..+4%, never clearly ahead of GROUP_M 16.)
S8_G16 = GemmConfig(128, 256, 64, 16, 8, 3)

# Session 8, wgrad tile: the 128x256 s4 tile in GROUP_M 16 bands (a wave covers more row
# tiles of one expert's output). The variable-K wgrad walks 32 x 7168 x 4096 / (256 x 128)
# = 28672 tiles of only 2048 / 64 = 32 K steps each on DeepSeek-V3 gate_up (the forward: 8192
# tiles of 112 steps), and its loop cannot be flattened (the K trip count is the group's row
# count), so every tile pays an unhidden epilogue and a pipeline refill: plan ``tmavs`` (the
# TMA-store epilogue) on this tile and on 256x128 s4 won call 8.2 (``VK_STORE_TILES``).
# Removed after call 8.2 (graph, vs torch._grouped_mm, DeepSeek-V3 gate_up / down): the 2-CTA
# tile ``m128n128k64g8w8s3_maxnreg128`` (8 warps capped at 128 registers) 0.883 / 0.917 with
# ``tma``, 0.923 / 0.941 with ``tmavs``; ``tma`` on GROUP_M 16 256x128 s4 0.946 / 0.959 (and
# ``tma`` / ``tmavs`` on the other GROUP_M 16 tiles, never ahead in the tuner's timing).
S8_VK_G16 = GemmConfig(128, 256, 64, 16, 8, 4)


# Session-5 variants of the flat TMA kernel (``grouped_gemm_tma.TMA_VARIANTS``): TMA-store
# epilogue (``tmas``), N-major walk inside a group (``tman``), both (``tmasn``); only for the
# 3-stage 8-warp tiles (4 stages + the 32 KiB store staging exceed sm_90's shared memory).
TMA_EXTRA_VARIANTS = ("tmas", "tman", "tmasn")


def _tma_extra_ok(cfg: GemmConfig) -> bool:
    return cfg.num_warps == 8 and cfg.num_stages == 3 and cfg.block_m * cfg.block_n >= 128 * 256


# The (kernel, config) plans that won at least one key on the H200 (run 4.2, DeepSeek-V3 and
# Qwen3-30B-A3B, kernels alone vs torch._grouped_mm): the tuner's default candidates on Hopper,
# so the first call compiles 3-4 kernels per GEMM instead of ~13.
#   forward/dgrad: tma 128x256 s3 / s4 (most keys), flat 128x256 s3 (DeepSeek-V3 dgrad: 1.00
#   and 1.06 vs 0.92 / 0.98 with TMA; DeepSeek-V3 down forward);
#   wgrad: tma 256x128 w8 (DeepSeek-V3 gate_up), tma 128x128 w4 (Qwen3), table 128x128 w4
#   (DeepSeek-V3 down), tma 256x128 w8 s4 (run 4.3: best wgrad on both DeepSeek-V3 shapes).
# Session 5 adds the flat TMA kernel with a TMA-store epilogue / N-major walk for DeepSeek-V3
# (its warp-specialised plans ``ws`` were removed in session 6: the kernel deadlocked on the
# H200, run 6.1). They are NOT default
# candidates (the tuner would keep a wrong-but-fast kernel):
# ``PRIMUS_TURBO_GROUPED_GEMM_CANDIDATES=s5`` adds them to the timed winners until they are
# verified and measured. Session 5's warp-specialised wgrad plans (``ws`` / ``wsm``) were
# removed: their GPU tests gave wrong results on the H200 (run 5.3); no wgrad plan is added.
HOPPER_WINNERS_S4_FWD = (
    ("tma", "m128n256k64g8w8s3"),
    ("tma", "m128n256k64g8w8s4"),
    ("flat", "m128n256k64g8w8s3"),
)
HOPPER_WINNERS = {
    # + session 8: the GROUP_M 16 TMA tile (``S8_G16``, call 8.1)
    "fwd": (*HOPPER_WINNERS_S4_FWD, ("tma", S8_G16.name)),
    "vk": (
        ("tma", "m256n128k64g8w8s3"),
        ("tma", "m256n128k64g8w8s4"),
        ("tma", "m128n128k64g8w4s3"),
        ("table", "m128n128k64g8w4s3"),
        # + session 8: the TMA-store wgrad plans (call 8.2, see ``VK_STORE_TILES``)
        ("tmavs", "m256n128k64g8w8s4"),
        ("tmavs", "m128n256k64g16w8s4"),
    ),
}
HOPPER_S5_PLANS = {
    "fwd": (
        ("tmas", "m128n256k64g8w8s3"),
        ("tman", "m128n256k64g8w8s3"),
    ),
    "vk": (),
}
# plan kinds of session 5 (opt-in, see HOPPER_S5_PLANS)
S5_VARIANTS = TMA_EXTRA_VARIANTS


# Session 8: the wgrad plan ``tmavs`` (the variable-K TMA kernel with a TMA-store epilogue:
# a 3D descriptor over ``[G, P, Q]`` clips rows at the group's edge; two ``[1, BM, BN / 2]``
# halves through one 32 KiB staging buffer) on these tiles. H200 call 8.2 (graph, L2 flushed,
# vs torch._grouped_mm, DeepSeek-V3 gate_up / down wgrad): 256x128 s4 1.031 / 0.956,
# GROUP_M 16 128x256 s4 1.009 / 1.010, the tuner's old pick (tma 256x128 s4 / table 128x128
# w4) 1.004 / 0.908. (``tmavs`` on the 2-CTA 128x128 w4 tile lost: 0.924 / 0.937, removed.)
VK_STORE_TILES = (GemmConfig(256, 128, 64, 8, 8, 4), S8_VK_G16)
# plan kinds of the session-8 wgrad
S8_VK_VARIANTS = ("tmavs", "tmavd")


def vk_tma_store_cfg_ok(cfg: GemmConfig) -> bool:
    """Plan ``tmavs`` of the wgrad runs on ``VK_STORE_TILES`` (4 stages + 32 KiB of staging:
    229408 B of sm_90's 227 KiB, 218 registers, no spills)."""
    return cfg in VK_STORE_TILES


# Large experts (``M // G`` at least this, the DeepSeek-V3 / Mixtral regime of 2048 rows per
# group): the wgrad takes ONE ``tmavs`` plan by the output's shape instead of the tuner's pick.
# The tuner times back-to-back launches with a warm L2 and ranks these plans differently from
# the graph timing with L2 flushed (call 8.2, DeepSeek-V3 down, P x Q = 7168 x 2048: tuner
# tmavs 128x256 GROUP_M 16 3.62 ms, last of 12, tmavs 256x128 3.34 ms; graph 3.26 vs 3.45 ms;
# gate_up 4096 x 7168: tuner 6.89 vs 6.35 ms, graph 6.33 vs 6.19 ms, and the tuner's pick tma
# 256x128 s4 6.36 ms). So ``P >= Q`` takes GROUP_M 16 128x256, else 256x128 (both graph
# winners); no timing, no host sync. Measured on DeepSeek-V3 only: two points of one regime.
VK_STORE_MIN_AVG_ROWS = 2048


# Session 13: plan ``tmavd`` (``grouped_gemm_vk_desc``: per-group TMA descriptors built on the
# device, a group's last partial K step inside the pipelined loop instead of a masked pointer
# step after it) on the GROUP_M 16 128x256 tile, for groups of ``VK_DESC_MIN_AVG_ROWS`` rows on
# average. H200 calls 13.1 / 13.2 (``bench_grouped_gemm_plans.py --gemms wgrad``, graph, L2
# flushed, 3 interleaved rounds), x the session-8 rule's ``tmavs`` plan: DeepSeek-V3 gate_up
# 1.025 / 1.020, down 1.002 / 1.019, Mixtral-8x7B gate_up 1.018, down 1.016 (``tmavd`` 256x128:
# 1.020 / 1.009, 1.008 / 1.016, 1.017, 0.990); gpt-oss-20b (1024 rows per expert, the tuner's
# pick until now) 1.110 / 1.070 (the tuner had picked ``table`` 128x128, 0.85 / 0.91 of
# torch._grouped_mm). Qwen3-30B-A3B (512 rows: a descriptor pair per tile) 0.94 / 0.85: the
# tuner keeps it.
VK_DESC_MIN_AVG_ROWS = 1024


def vk_large_expert_plan(p: int, q: int) -> tuple[str, GemmConfig]:
    """The wgrad plan for large experts of output ``[P, Q]``: ``tmavd`` GROUP_M 16 128x256
    (``vk_device_descriptors``), else session 8's ``tmavs`` by ``P >= Q``."""
    if vk_device_descriptors():
        return ("tmavd", S8_VK_G16)
    return ("tmavs", S8_VK_G16 if p >= q else VK_STORE_TILES[0])


def vk_large_expert_rows() -> int:
    """The average rows per group from which the wgrad takes ``vk_large_expert_plan``."""
    return VK_DESC_MIN_AVG_ROWS if vk_device_descriptors() else VK_STORE_MIN_AVG_ROWS


@functools.cache
def vk_device_descriptors() -> bool:
    """``PRIMUS_TURBO_GROUPED_GEMM_VK_DESC`` (default 1, session 13): large experts' wgrad runs
    ``tmavd``; ``0`` keeps session 8's ``tmavs`` rule (A/B)."""
    from primus_turbo.pytorch.core.checks import env_flag

    return env_flag("PRIMUS_TURBO_GROUPED_GEMM_VK_DESC", True)


@functools.cache
def candidate_set() -> str:
    """``PRIMUS_TURBO_GROUPED_GEMM_CANDIDATES``: ``winners`` (default: on Hopper the tuner
    times only ``HOPPER_WINNERS``; no session-5 plan anywhere, also not for small groups),
    ``s4`` (the same; the name of session 5 round 1), ``s5`` (the winners plus the unverified
    session-5 plans ``HOPPER_S5_PLANS``; every plan, session-5 ones included, for small
    groups) or ``all`` (every plan of the mode, session-5 ones included; no large-expert wgrad
    rule). (``s8``, the opt-in session-8 wgrad plans, was removed after call 8.2: the two
    winners are default candidates, the losers are gone.)"""
    return _env_choice(
        "PRIMUS_TURBO_GROUPED_GEMM_CANDIDATES", "winners", ("winners", "s4", "s5", "all")
    )


# The winners were measured with 512-2048 rows per group; below this average (host-known
# ``M // G``) the small tiles they leave out may win, so every plan is timed.
WINNERS_MIN_AVG_ROWS = 256


def _winners(plans: list, family: ArchFamily, gemm: str, avg_rows: int) -> list:
    """``plans`` restricted to the measured winners (Hopper, ``candidate_set()`` not ``all``,
    ``avg_rows >= WINNERS_MIN_AVG_ROWS``; ``s5`` adds ``HOPPER_S5_PLANS``); unchanged where
    none of them is among the plans (e.g. NN with K not a multiple of 64). Session-5 plan
    kinds are dropped everywhere unless ``s5`` / ``all``."""
    cands = candidate_set()
    if cands not in ("s5", "all"):  # unverified on the GPU: opt-in only
        plans = [p for p in plans if p[0] not in S5_VARIANTS]
    if family != ArchFamily.HOPPER or cands == "all":
        return plans
    if avg_rows < WINNERS_MIN_AVG_ROWS:
        return plans
    allowed = HOPPER_WINNERS[gemm] + (HOPPER_S5_PLANS[gemm] if cands == "s5" else ())
    kept = [p for p in plans if (p[0], p[1].name) in allowed]
    return kept or plans


def _env_state() -> tuple:
    """The environment choices (each read once and cached) that the plan lists depend on: part
    of their memo key, so clearing one of those caches after changing the environment (as the
    tests do) yields fresh lists."""
    return (
        config_filter("PRIMUS_TURBO_GROUPED_GEMM_CONFIG"),
        config_filter(DGRAD_CONFIG_VAR),
        config_filter("PRIMUS_TURBO_GROUPED_GEMM_VK_CONFIG"),
        candidate_set(),
        mid_expert_forward(),
        vk_device_descriptors(),
    )


# Plan lists are memoised per (arguments, environment): building one took 23-33 us of host
# time per GEMM call on the dev CPU (six per MoE layer step), a lookup 1.6 us.
_PLAN_MEMO = 4096


def _memoised(build):
    """``build`` (a plan-list builder) memoised per arguments and ``_env_state()``; every call
    gets a fresh list."""
    memo = functools.lru_cache(maxsize=_PLAN_MEMO)(
        lambda env, *args, **kwargs: tuple(build(*args, **kwargs))
    )

    @functools.wraps(build)
    def call(*args, **kwargs):
        return list(memo(_env_state(), *args, **kwargs))

    return call


def _forward_plans(
    family: ArchFamily,
    mode: str,
    tma_ok: bool,
    k: int,
    trans_b: bool,
    avg_rows: int | None = None,
    n: int | None = None,
) -> list[tuple[str, GemmConfig]]:
    """The (kernel, config) candidates the tuner times for the forward/dgrad (``avg_rows``:
    ``M // G``, see ``WINNERS_MIN_AVG_ROWS``, ``None``: unknown; ``n``: output columns, the
    TMA-store variants need ``n % 8 == 0``, ``None``: not checked). ``trans_b`` False (NN:
    ``b`` read as ``[G, K, N]``, the GroupedLinear dgrad) takes ``DGRAD_CONFIG_VAR``'s filter
    where set.
    Large experts (``VK_STORE_MIN_AVG_ROWS``; Hopper, ``tune``, no filter, candidates not
    ``all``): the one plan ``LARGE_EXPERT_FWD_PLAN`` where it is among them."""
    configs = grouped_gemm_configs(family)
    var = "PRIMUS_TURBO_GROUPED_GEMM_CONFIG"
    if not trans_b and config_filter(DGRAD_CONFIG_VAR):
        var = DGRAD_CONFIG_VAR
    # tune: the table kernel lost every forward/dgrad key to flat on the H200 (session 3), so
    # with TMA candidates present it is left out (fewer compiles on the first call) unless the
    # filter names a table plan
    named_table = any(x.startswith("table:") for x in config_filter(var))
    table = mode == "table" or (mode == "tune" and (not tma_ok or named_table))
    plans = [("table", cfg) for cfg in configs] if table else []
    if mode in ("flat", "tune") or (mode == "tma" and not tma_ok):
        plans += [("flat", cfg) for cfg in configs if flat_config_ok(cfg)]
    if mode in ("tma", "tune") and tma_ok:
        tma = [("tma", cfg) for cfg in tma_configs(family) if trans_b or k % cfg.block_k == 0]
        if tma and mode == "tune":
            store_ok = n is None or n % 8 == 0
            tma += [(v, cfg) for v in TMA_EXTRA_VARIANTS for _, cfg in list(tma)
                    if _tma_extra_ok(cfg) and (store_ok or v == "tman")]  # fmt: skip
        if tma:
            plans += tma
        elif mode == "tma":  # NN with K not a multiple of any tile's BLOCK_K
            plans += [("flat", cfg) for cfg in configs if flat_config_ok(cfg)]
    rule = family == ArchFamily.HOPPER and mode == "tune" and not config_filter(var)
    rule = rule and avg_rows is not None and candidate_set() != "all"
    if rule and avg_rows >= VK_STORE_MIN_AVG_ROWS and LARGE_EXPERT_FWD_PLAN in plans:
        return [LARGE_EXPERT_FWD_PLAN]
    mid = rule and trans_b and avg_rows >= MID_EXPERT_MIN_AVG_ROWS and mid_expert_forward()
    if mid and avg_rows < VK_STORE_MIN_AVG_ROWS and MID_EXPERT_FWD_PLAN in plans:
        return [MID_EXPERT_FWD_PLAN]
    return _filtered(plans, var, family, "fwd", 1 << 30 if avg_rows is None else avg_rows)


forward_plans = _memoised(_forward_plans)


# Large experts (``VK_STORE_MIN_AVG_ROWS``, as for the wgrad): the forward and the dgrad take
# the GROUP_M 16 TMA tile without timing. Graph timing with L2 flushed ranks it first where
# the tuner's back-to-back launches (warm L2) rank it last: forward, call 8.1, vs the tuner's
# pick, DeepSeek-V3 gate_up / down 1.063 / 1.040, Mixtral-8x7B 1.026 / 1.035; dgrad, call
# 11.4, vs the tuner's pick (flat or tma GROUP_M 8), DeepSeek-V3 gate_up 1.067, Mixtral
# gate_up / down 1.132 / 1.016 (DeepSeek-V3 down: the tuner had picked this plan; its two
# timings read 0.96 apart, the noise of that call; call 8.1 had it at 1.060 there). The
# tuner's timing of the same plans for DeepSeek-V3 gate_up forward (call 10.6): flat 5.19 ms,
# this one 5.79 ms.
LARGE_EXPERT_FWD_PLAN = ("tma", S8_G16)

# Mid-size experts (session 13; ``MID_EXPERT_MIN_AVG_ROWS`` up to ``VK_STORE_MIN_AVG_ROWS`` rows
# per group, gpt-oss-20b's 1024): the NT forward takes the GROUP_M 8 TMA 128x256 tile with 4
# stages untimed. In H200 call 13.2 the config tuner's warm back-to-back timing picked it in 2
# of 7 processes per shape and the flat 3-stage tile otherwise, and the op's forward vs
# torch._grouped_mm read 1.057 / 1.058 (gate_up) and 1.059 / 1.060 (down) with it against
# 1.034-1.042 and 1.015-1.019 with the flat tile. The dgrad (NN) stays tuned.
MID_EXPERT_MIN_AVG_ROWS = 1024
MID_EXPERT_FWD_PLAN = ("tma", GemmConfig(128, 256, 64, 8, 8, 4))


@functools.cache
def mid_expert_forward() -> bool:
    """``PRIMUS_TURBO_GROUPED_GEMM_MID_FWD`` (default 1): the ``MID_EXPERT_FWD_PLAN`` rule;
    ``0`` lets the tuner pick (A/B)."""
    from primus_turbo.pytorch.core.checks import env_flag

    return env_flag("PRIMUS_TURBO_GROUPED_GEMM_MID_FWD", True)


# ``PRIMUS_TURBO_GROUPED_GEMM_DGRAD_CONFIG``: as ``..._CONFIG`` but for the NN calls only
# (``trans_b`` False: the dgrad ``grad @ b[g]`` of a ``[G, N, K]`` weight), where set it
# replaces ``..._CONFIG`` there. For A/B runs of the dgrad plan alone (session 6: the
# DeepSeek-V3 gate_up dgrad ran 6.77 ms in the benchmark while the tuner timed its plan at
# 5.26 ms); ``table:`` plans are candidates when named.
DGRAD_CONFIG_VAR = "PRIMUS_TURBO_GROUPED_GEMM_DGRAD_CONFIG"


def _variable_k_plans(
    family: ArchFamily,
    mode: str,
    tma_ok: bool,
    avg_rows: int = 1 << 30,
    p: int | None = None,
    q: int | None = None,
) -> list[tuple[str, GemmConfig]]:
    """The (kernel, config) candidates the tuner times for the wgrad of output ``[P, Q]``
    (``p`` / ``q`` given, Hopper, ``tune``, no config filter, candidates not ``all``, groups of
    ``VK_STORE_MIN_AVG_ROWS`` rows or more: the one plan ``vk_large_expert_plan``)."""
    configs = grouped_gemm_configs(family)
    plans = [("table", cfg) for cfg in configs] if mode in ("table", "tune") or not tma_ok else []
    if mode in ("tma", "tune") and tma_ok:
        plans += [("tma", cfg) for cfg in tma_configs(family, wgrad=True)]
        if mode == "tune":  # session 8 plan tmavs (TMA-store epilogue)
            plans += [("tmavs", cfg) for cfg in tma_configs(family, wgrad=True)
                      if vk_tma_store_cfg_ok(cfg)]  # fmt: skip
    var = "PRIMUS_TURBO_GROUPED_GEMM_VK_CONFIG"
    large = p is not None and q is not None and avg_rows >= vk_large_expert_rows()
    if large and family == ArchFamily.HOPPER and mode == "tune" and not config_filter(var):
        pick = vk_large_expert_plan(p, q)
        if candidate_set() != "all" and ("tmavs", pick[1]) in plans:  # tmavd: same tiles
            return [pick]
    return _filtered(plans, var, family, "vk", avg_rows)


variable_k_plans = _memoised(_variable_k_plans)


def _filtered(plans: list, var: str, family: ArchFamily, gemm: str, avg_rows: int) -> list:
    """The config-name filter ``var`` over every plan of the mode where it is set, else (in
    ``tune`` mode only: a fixed kernel keeps all its tiles) the measured winners."""
    names = config_filter(var)
    if not names:
        tuning = len({v for v, _ in plans}) > 1
        return _winners(plans, family, gemm, avg_rows) if tuning else plans
    # a bare tile name matches every variant but the wgrad's ``tmavs`` (named ``tmavs:<tile>``)
    kept = [p for p in plans if f"{p[0]}:{p[1].name}" in names
            or (p[1].name in names and not (gemm == "vk" and p[0] in S8_VK_VARIANTS))]  # fmt: skip
    if not kept:
        have = sorted({p[1].name for p in plans} | {f"{p[0]}:{p[1].name}" for p in plans})
        raise ValueError(f"primus_turbo: {var} expected config names in {have}, got {names}")
    return kept
