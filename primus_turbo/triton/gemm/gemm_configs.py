"""Tile configs for the dense Triton GEMM, as data per arch family, and the pure heuristic.

Nothing here imports Triton or touches a device, so the choice is unit-tested on the CPU.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from primus_turbo.pytorch.core.platform import ArchFamily


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3
    programs_per_cu: int = 1  # persistent grid = min(tiles, CUs * this): resident CTAs per CU
    extra: tuple[tuple[str, Any], ...] = ()  # backend compile options, e.g. waves_per_eu
    # composite N tile: a second, narrower column block of ``block_n2`` (a power of two, 0 = none)
    # next to the first, sharing its A tile; the tile is ``block_n + block_n2`` wide (e.g. 144)
    block_n2: int = 0
    # operands through TMA descriptors (``gemm_tma_kernel``, sm_90), else cp.async pointers
    tma: bool = False
    # with ``tma``: Triton's automatic warp specialization of the K loop (sm_90: a producer warp
    # group issues the TMA copies, ``num_warps`` consumers; only with 4 warps on Triton 3.6)
    ws: bool = False

    @property
    def tile_constexprs(self) -> dict[str, int]:
        """The tile's kernel constexprs ``BLOCK_M``/``BLOCK_N``/``BLOCK_K``/``GROUP_M``."""
        return {
            "BLOCK_M": self.block_m,
            "BLOCK_N": self.block_n,
            "BLOCK_K": self.block_k,
            "GROUP_M": self.group_m,
        }

    @property
    def tile_n(self) -> int:
        """Output columns per tile (``block_n`` plus the composite part, if any)."""
        return self.block_n + self.block_n2

    @functools.cached_property
    def options(self) -> dict[str, Any]:
        """Launch/compile options (cached: this is read on every launch; do not mutate)."""
        return {"num_warps": self.num_warps, "num_stages": self.num_stages, **dict(self.extra)}

    @property
    def name(self) -> str:
        extra = "".join(f"_{k}{v}" for k, v in self.extra)
        n2 = f"p{self.block_n2}" if self.block_n2 else ""
        return (
            f"m{self.block_m}n{self.block_n}{n2}k{self.block_k}g{self.group_m}"
            f"w{self.num_warps}s{self.num_stages}{extra}"
            f"{'_tma' if self.tma else ''}{'_ws' if self.ws else ''}"
        )


def _amd(bm, bn, bk, warps, stages, waves=0, per_cu=1):
    opts = (("matrix_instr_nonkdim", 16), ("waves_per_eu", waves))
    return GemmConfig(bm, bn, bk, 8, warps, stages, per_cu, opts)


def configs_cdna3() -> list[GemmConfig]:
    """gfx942 (MI300X/MI325X): 64 KiB LDS; 2-stage LDS pipeline.

    No 256x256 tile: with 8 warps it spills VGPRs on gfx942 (see build/aot_report.md).
    """
    return [
        _amd(256, 128, 64, 8, 2, waves=2),
        _amd(128, 256, 64, 8, 2, waves=2),
        _amd(128, 128, 64, 4, 2, waves=2, per_cu=2),
        _amd(64, 64, 64, 4, 2, per_cu=2),
    ]


def configs_cdna4() -> list[GemmConfig]:
    """gfx950 (MI350X/MI355X): 160 KiB LDS allows deeper K tiles."""
    return [
        _amd(256, 256, 64, 8, 2),
        _amd(256, 256, 32, 8, 2),
        _amd(256, 128, 64, 8, 2, waves=2),
        _amd(128, 256, 64, 8, 2, waves=2),
        _amd(128, 128, 64, 4, 2, waves=2, per_cu=2),
        _amd(64, 64, 64, 4, 2, per_cu=2),
    ]


def configs_hopper() -> list[GemmConfig]:
    """sm_90: wgmma tiles with 3-4 cp.async stages in 228 KiB of shared memory.

    Measured on an H200 (scripts/gemm_explore.py): 128x256x64 with 8 warps and one persistent
    program per SM is the best tile on every large model shape (0.81-0.98x cuBLAS).
    """
    return [
        GemmConfig(128, 256, 64, 8, 8, 3),
        GemmConfig(256, 128, 64, 8, 8, 3),
        GemmConfig(128, 128, 64, 8, 4, 4),
        GemmConfig(128, 128, 128, 8, 8, 3),
        GemmConfig(128, 64, 64, 8, 4, 4, programs_per_cu=2),
        GemmConfig(64, 128, 64, 8, 4, 4, programs_per_cu=2),
        GemmConfig(64, 64, 64, 8, 4, 4, programs_per_cu=3),
    ]


def configs_interpreter() -> list[GemmConfig]:
    """Small tiles for the CPU interpreter (speed there is irrelevant; masks matter)."""
    return [GemmConfig(16, 16, 16, 2, 1, 1), GemmConfig(32, 32, 32, 4, 4, 1)]


CONFIGS_BY_FAMILY = {
    ArchFamily.CDNA3: configs_cdna3,
    ArchFamily.CDNA4: configs_cdna4,
    ArchFamily.HOPPER: configs_hopper,
    ArchFamily.OTHER_GPU: configs_hopper,
    ArchFamily.CPU: configs_interpreter,
}


@functools.cache
def gemm_configs(family: ArchFamily) -> tuple[GemmConfig, ...]:
    """The family's configs (built once per process)."""
    return tuple(CONFIGS_BY_FAMILY[family]())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@functools.lru_cache(maxsize=4096)
def select_config(m: int, n: int, k: int, family: ArchFamily, num_cus: int) -> GemmConfig:
    """Heuristic choice: the largest tile that still gives every CU at least one tile.

    Large tiles maximise arithmetic intensity; when the output has too few tiles to fill the
    machine (small M or N), smaller tiles win because idle CUs cost more than re-reads.
    """
    configs = gemm_configs(family)
    if family == ArchFamily.CPU:
        return configs[0]
    best = configs[-1]
    best_area = 0
    for cfg in configs:
        tiles = _cdiv(m, cfg.block_m) * _cdiv(n, cfg.tile_n)
        area = cfg.block_m * cfg.tile_n
        waste = (cfg.block_m - m % cfg.block_m) % cfg.block_m
        fits = tiles >= num_cus and waste * 4 <= cfg.block_m
        if fits and area > best_area:
            best, best_area = cfg, area
    return best


# Split-K rule (pure; the tuner times the plan it gives next to the plain one).
SPLIT_K_MIN_K = 2048  # shorter K: the per-slice epilogue outweighs the better CU fill
SPLIT_K_MAX = 8
SPLIT_K_MIN_SLICE = 8  # K tiles per slice at least (shorter slices are epilogue-bound)
SPLIT_K_ITEM_COST = 2  # modelled cost of one slice's partial write + reduction, in K tiles
SPLIT_K_MIN_GAIN = 0.9  # split only if the model predicts at least a 10% shorter kernel


def split_k_eligible(m: int, n: int, k: int, cfg: GemmConfig, num_cus: int) -> bool:
    """Few output tiles (under two waves of the persistent grid) and a long K."""
    if cfg.block_n2:
        return False  # the split-K workspace layout assumes a plain tile
    tiles = _cdiv(m, cfg.block_m) * _cdiv(n, cfg.block_n)
    return k >= SPLIT_K_MIN_K and tiles < 2 * num_cus * cfg.programs_per_cu


def split_k_cost(m: int, n: int, k: int, cfg: GemmConfig, num_cus: int, split: int) -> int:
    """Modelled kernel time in K-tile iterations of one program: the number of waves of
    ``tiles * split`` work items over ``num_cus * programs_per_cu`` slots, times the longest
    slice plus the fixed cost of a partial (workspace store, counter, reduction)."""
    tiles = _cdiv(m, cfg.block_m) * _cdiv(n, cfg.block_n)
    slots = num_cus * cfg.programs_per_cu
    per_slice = _cdiv(_cdiv(k, cfg.block_k), split)
    extra = SPLIT_K_ITEM_COST if split > 1 else 0
    return _cdiv(tiles * split, slots) * (per_slice + extra)


def select_split_k(m: int, n: int, k: int, cfg: GemmConfig, num_cus: int) -> int:
    """Number of K slices for ``cfg`` (1 = no split).

    Only for eligible shapes (``split_k_eligible``); the split in ``2..SPLIT_K_MAX`` with the
    lowest modelled time (``split_k_cost``), smallest on ties, every slice keeping at least
    ``SPLIT_K_MIN_SLICE`` K tiles, and only if it beats the plain kernel by 10% in the model.
    E.g. DeepSeek-V3 kv_a 4096x576x7168 with 128x64 tiles and 2 programs per SM on 132 SMs:
    288 tiles (1.09 waves) -> split 4 gives 1152 items (4.4 waves) of 28 K tiles each.
    """
    if not split_k_eligible(m, n, k, cfg, num_cus):
        return 1
    k_tiles = _cdiv(k, cfg.block_k)
    best, best_cost = 1, split_k_cost(m, n, k, cfg, num_cus, 1)
    plain = best_cost
    for split in range(2, SPLIT_K_MAX + 1):
        if _cdiv(k_tiles, split) < SPLIT_K_MIN_SLICE:
            break
        cost = split_k_cost(m, n, k, cfg, num_cus, split)
        if cost < best_cost:
            best, best_cost = split, cost
    return best if best_cost <= SPLIT_K_MIN_GAIN * plain else 1


STREAM_K_MAX_TILE = 128 * 128


def use_stream_k(m: int, n: int, k: int, cfg: GemmConfig, num_cus: int) -> bool:
    """Whether stream-K is worth trying: the data-parallel grid's last wave leaves more than 15%
    of the CU-slots idle, there are at most a few waves (beyond that the tail is amortised) and
    every program still gets at least two K tiles of work. Tiles above 128x128 are left out:
    the finishing program holds a loaded partial next to its accumulator, and 128x256 spills
    on sm_90 (build/aot_report.md)."""
    if cfg.block_m * cfg.block_n > STREAM_K_MAX_TILE or cfg.block_n2:
        return False
    tiles = _cdiv(m, cfg.block_m) * _cdiv(n, cfg.block_n)
    slots = num_cus * cfg.programs_per_cu
    waves = _cdiv(tiles, slots)
    efficiency = tiles / (waves * slots)
    k_tiles = _cdiv(k, cfg.block_k)
    return efficiency < 0.85 and waves <= 4 and tiles * k_tiles >= 2 * num_cus


# Composite ("narrow") N tiles: a tile ``block_m x (block_n + block_n2)`` whose width is a sum of
# two powers of two, computed as two dots per K step sharing the A tile. It lets the tile count
# match the CU count where every power-of-two tiling wastes most of a last round, e.g.
# DeepSeek-V3 kv_a 4096x576 on 132 SMs: 128x128 gives 160 tiles (2 rounds, the second 21%
# full), 128x256 gives 96 tiles at 75% column use; 128x(128+16) gives 128 tiles in one round
# with no padding. The model below (pure, unit-tested) picks one only where it predicts a clear
# gain over every plain config; the tuner then times it next to them.
TILE_EDGE_COST = 64  # per-tile cost per row/column of the tile (operand loads, issue, epilogue)
NARROW_MIN_N = 32  # the narrow dot costs at least as much as one this wide (small-N MMA rate)
NARROW_MIN_GAIN = 0.85  # use a composite tile only if its modelled time is <= 85% of the best
NARROW_MAX_ACC = 128 * 256  # fp32 accumulator elements per tile (the largest plain tile's)


def tile_cost(block_m: int, block_n: int, block_n2: int = 0) -> int:
    """Modelled time of one tile per K step: MMA area (the narrow dot counted at least
    ``NARROW_MIN_N`` wide) plus ``TILE_EDGE_COST`` per row and column (what small tiles lose to
    operand traffic and fixed costs; 128x128 is then 0.875x as efficient as 128x256)."""
    mma_n = block_n + (max(block_n2, NARROW_MIN_N) if block_n2 else 0)
    return block_m * mma_n + TILE_EDGE_COST * (block_m + block_n + block_n2)


def plan_cost(m: int, n: int, cfg: GemmConfig, num_cus: int) -> int:
    """Modelled kernel time: rounds of the persistent grid times the tile cost (programs
    sharing a CU each take ``programs_per_cu`` times as long per round)."""
    tiles = _cdiv(m, cfg.block_m) * _cdiv(n, cfg.tile_n)
    rounds = _cdiv(tiles, num_cus * cfg.programs_per_cu)
    return rounds * cfg.programs_per_cu * tile_cost(cfg.block_m, cfg.block_n, cfg.block_n2)


def narrow_config(
    family: ArchFamily,
    bm: int,
    bn: int,
    bn2: int,
    bk: int,
    warps: int = 0,
    stages: int = 0,
    group_m: int = 8,
    tma: bool = False,
    ws: bool = False,
) -> GemmConfig:
    """A composite config; ``warps``/``stages`` 0 = the default rule (8 warps above 128x128,
    as many bf16 stages as fit in 200 KiB, at most 4; 2 on AMD)."""
    warps = warps or (8 if bm * (bn + bn2) > 128 * 128 else 4)
    stage_bytes = (bm + bn + bn2) * bk * 2
    if family in (ArchFamily.CDNA3, ArchFamily.CDNA4):
        opts = (("matrix_instr_nonkdim", 16), ("waves_per_eu", 0))
        return GemmConfig(bm, bn, bk, group_m, warps, stages or 2, 1, opts, block_n2=bn2)
    stages = stages or max(2, min(4, (200 << 10) // stage_bytes))
    return GemmConfig(bm, bn, bk, group_m, warps, stages, 1, block_n2=bn2, tma=tma or ws, ws=ws)


# Hopper variants of the chosen composite tile that the tuner times (bk, warps, stages, tma); the
# first is the one used without tuning. Measured (H200, run 4.2, kv_a kernel-only, L2 flushed):
# 128x(128+16) k64 w8 s4 66.4 us. k128 s3: half the K steps (56 for K=7168), 16-byte cp.async for
# the 16-column block (8-byte at k64); 3 x (128+144) x 128 x 2 B = 204 KiB of the 227 KiB. TMA:
# the same tile with descriptor loads (gemm_tma_kernel; not yet measured).
# (BLOCK_K, warps, stages, TMA) of the composite tile the tuner times; the first is the untuned
# choice. H200 run 4.3, kv_a kernel-only: pointer k64 w8 s4 66.0 us; TMA k128 w4 s3 57.9 us,
# TMA k64 w4 s4 57.9 us, TMA k64 w8 s4 61.2 us (cuBLAS 43.6 us).
NARROW_VARIANTS_HOPPER = ((64, 8, 4, False), (128, 4, 3, True), (64, 4, 4, True), (64, 8, 4, True))
HOPPER_SMEM_BYTES = 227 << 10


def _parse_config_name(name: str) -> GemmConfig:
    """``m128n128p16k64g8w8s4`` (the ``GemmConfig.name`` format, Hopper/no extra options;
    an optional ``c2`` suffix = programs per CU, then ``_tma``) back to a config."""
    import re

    pattern = r"m(\d+)n(\d+)(?:p(\d+))?k(\d+)g(\d+)w(\d+)s(\d+)(?:c(\d+))?(_tma)?(_ws)?"
    match = re.fullmatch(pattern, name)
    if not match:
        raise ValueError(
            "primus_turbo: PRIMUS_TURBO_GEMM_NARROW_CONFIGS expected comma-separated config "
            f"names such as m128n128p16k128g8w8s3, got {name!r}"
        )
    bm, bn, bn2, bk, g, w, s, c, tma, ws = match.groups()
    return GemmConfig(
        int(bm), int(bn), int(bk), int(g), int(w), int(s), int(c or 1), block_n2=int(bn2 or 0),
        tma=bool(tma or ws), ws=bool(ws),
    )  # fmt: skip


def parse_config_names(value: str) -> tuple[GemmConfig, ...]:
    """Comma-separated config names (see ``_parse_config_name``); empty -> ()."""
    return tuple(_parse_config_name(x.strip()) for x in value.split(",") if x.strip())


@functools.lru_cache(maxsize=4096)
def narrow_candidates(
    m: int, n: int, k: int, family: ArchFamily, num_cus: int
) -> tuple[GemmConfig, ...]:
    """The composite plans the tuner times for this shape (``select_narrow``'s tile in the
    ``NARROW_VARIANTS_HOPPER`` pipelines on NVIDIA; the one config elsewhere); () where
    ``select_narrow`` keeps the plain configs. The first is the untuned choice."""
    picked = select_narrow(m, n, k, family, num_cus)
    if picked is None:
        return ()
    if family in (ArchFamily.CDNA3, ArchFamily.CDNA4, ArchFamily.CPU):
        return (picked,)
    out = []
    bm, bn, bn2 = picked.block_m, picked.block_n, picked.block_n2
    for bk, warps, stages, tma in NARROW_VARIANTS_HOPPER:
        if (bm + bn + bn2) * bk * 2 * stages > HOPPER_SMEM_BYTES - (8 << 10):
            continue  # keep a little room for barriers and the epilogue's layout conversion
        if tma and family != ArchFamily.HOPPER:
            continue
        cfg = narrow_config(family, bm, bn, bn2, bk, warps, stages, tma=tma)
        if cfg not in out:
            out.append(cfg)
    return tuple(out) or (picked,)


@functools.lru_cache(maxsize=4096)
def select_narrow(m: int, n: int, k: int, family: ArchFamily, num_cus: int) -> GemmConfig | None:
    """The composite-tile config with the lowest ``plan_cost``, or None where it is not at least
    ``1 - NARROW_MIN_GAIN`` better than every plain config of the family (most shapes: many
    rounds amortise the last one). None on the CPU (tests build composite configs directly)."""
    if family == ArchFamily.CPU or m <= 0 or n <= 0:
        return None
    plain = min(plan_cost(m, n, cfg, num_cus) for cfg in gemm_configs(family))
    best, best_key = None, None
    for bm in (64, 128, 256):
        for bn in (64, 128, 256):
            for bn2 in (16, 32, 64, 128):
                if bn2 >= bn or bm * (bn + bn2) > NARROW_MAX_ACC:
                    continue
                cfg = narrow_config(family, bm, bn, bn2, 64)
                cost = plan_cost(m, n, cfg, num_cus)
                key = (cost, -bm * cfg.tile_n)  # cheaper first, then the larger tile
                if best_key is None or key < best_key:
                    best, best_key = cfg, key
    if best is None or best_key[0] > NARROW_MIN_GAIN * plain:
        return None
    return best
