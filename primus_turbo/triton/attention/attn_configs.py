"""Tile configs for the Triton flash attention, as data per arch family, and the heuristic.

Nothing here imports Triton or touches a device. Each config is (BLOCK_M, BLOCK_N, warps,
stages, extra backend options). Forward: BLOCK_M query rows per program, BLOCK_N keys per
step. Backward dK/dV: BLOCK_N keys per program, BLOCK_M queries per step; backward dQ: BLOCK_M
queries per program, BLOCK_N keys per step. The first config of a list is the heuristic pick;
the launcher's per-shape autotune (PRIMUS_TURBO_TRITON_TUNE, default on) times all of them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from primus_turbo.pytorch.core.platform import ArchFamily


@dataclasses.dataclass(frozen=True)
class AttnConfig:
    block_m: int
    block_n: int
    num_warps: int = 8
    num_stages: int = 2
    extra: tuple[tuple[str, Any], ...] = ()

    @functools.cached_property
    def options(self) -> dict[str, Any]:
        return {"num_warps": self.num_warps, "num_stages": self.num_stages, **dict(self.extra)}

    @property
    def name(self) -> str:
        extra = "".join(f"_{k}{v}" for k, v in self.extra)
        return f"m{self.block_m}n{self.block_n}w{self.num_warps}s{self.num_stages}{extra}"


def _amd(bm, bn, warps, stages=1, waves=2):
    return AttnConfig(bm, bn, warps, stages, (("waves_per_eu", waves),))


# kind -> head-dim class -> configs. Classes by the padded width the kernel works on: "small"
# (<= 128), "mid" (the backward's split qk dim, e.g. 192 = 128 + 64 chunks, see
# attn_launch._split_dim) and "large" (256: d256, the forward's padded 192, and the backward's
# 192 with PRIMUS_TURBO_ATTN_SPLIT_D=0 or =fwd).
# Register budget (AOT check, build/aot_report.md): per thread, the fp32 accumulators take
# rows * BLOCK_D / threads; 4 warps with a 128x128 fp32 accumulator spill on sm_90, so every
# d128 tile that holds two such accumulators (dK and dV) uses 8 warps.
def _cdna(kind: str, dclass: str) -> list[AttnConfig]:
    """gfx942/gfx950: 64-wide wavefronts (4 warps = 256 lanes), 64 KiB / 160 KiB LDS."""
    large = dclass != "small"  # the split 192 needs fewer registers than 256: same tiles
    if kind in ("dv", "dk"):  # the dK/dV kernel's one-accumulator launches: its tiles
        kind = "dkdv"
    if kind == "fwd":
        if dclass == "mid":  # split 192 (AOT): m64n32w4 clean on both (198 / 180 VGPRs);
            # m64n64w8 spills 28 SGPRs on gfx950 (no scratch): the timed candidate
            return [_amd(64, 32, 4), _amd(64, 64, 8)]
        if large:
            return [_amd(64, 64, 8), _amd(64, 32, 4)]
        return [_amd(128, 64, 8), _amd(128, 64, 4), _amd(128, 32, 4), _amd(64, 64, 4)]
    # dQ (AOT 2026-11-29, waves_per_eu 1): 8-warp tiles spill (gfx942 d128 m64n64w8 84 B,
    # d192 m64n32w8 208 B, d256 376 B); 4-warp m64n32w4 (d128), m32n32w4 and m16n32w4 (d192,
    # d256) are clean on gfx942 and gfx950; d128 m32n64w4 spills 28 SGPRs only (no scratch).
    # Backward: Triton keeps the accumulators in the 256 arch VGPRs (AGPR 0). AOT gfx942
    # (2026-11-29, waves_per_eu 1): dK/dV d128 m32n64w8 spills 26 VGPRs (72 B), d192/256
    # m32n32w8 141 VGPRs (488 B); 4-warp tiles are clean: d128 m16n64w4 and m32n32w4, d192/256
    # m16n32w4 and m16n16w4. The spilling 8-warp tiles stay as timed candidates only.
    if kind == "dkdv":
        if large:
            return [_amd(16, 32, 4, waves=1), _amd(16, 16, 4, waves=1), _amd(32, 32, 8, waves=1)]
        return [_amd(16, 64, 4, waves=1), _amd(32, 32, 4, waves=1), _amd(32, 64, 8, waves=1)]
    if large:  # dq
        return [_amd(32, 32, 4, waves=1), _amd(16, 32, 4, waves=1), _amd(64, 32, 8, waves=1)]
    return [_amd(64, 32, 4, waves=1), _amd(32, 64, 4, waves=1), _amd(64, 64, 8, waves=1)]


def _hopper(kind: str, dclass: str) -> list[AttnConfig]:
    """sm_90: 228 KiB shared memory, wgmma needs BLOCK_M >= 64 per 4 warps."""
    large = dclass != "small"
    # split 192 (the "mid" class): one pinned tile per kernel, the per-shape autotune's winners
    # on the H200 (DeepSeek-V3 B4 S4096 causal, 2026-11-29: fwd 430 TFLOPS, bwd 230 with the
    # dV / dK launches); a single candidate is never timed, so the class compiles 4 kernels
    if dclass == "mid" and kind == "dkdv":
        # fused dK/dV (only with PRIMUS_TURBO_ATTN_DKDV_PARTS=0/auto on sm_90; parts is the
        # default there): m16n64w8s1 (223 regs) clean wgmma tile; m16n128w8s1 spills 16 B
        # (timed candidate, the fused winner); every wider tile spills 64-1800 B
        return [AttnConfig(16, 64, 8, 1), AttnConfig(16, 128, 8, 1)]
    if dclass == "mid" and kind == "dv":
        # dV-only launch (PART 1), split 192: m64n128w8s1 254 regs, clean (m32n128w8s2 246
        # clean but slower; m64n128w8s2 spills 436 B, m64n64w4s2 976 B)
        return [AttnConfig(64, 128, 8, 1)]
    if dclass == "mid" and kind == "dk":
        # dK-only launch (PART 2), split 192: m32n128w8s1 255 regs, clean (m16n128w8s2 254
        # clean but slower; m64n128w8s1 spills 208 B, m32n128w8s2 172 B)
        return [AttnConfig(32, 128, 8, 1)]
    if kind in ("dv", "dk"):  # forced parts outside the mid class: the fused kernel's tiles
        kind = "dkdv"
    if dclass == "mid" and kind == "fwd":
        # split 192 (AOT sm_90): m128n64w8s3 232 regs, clean (m128n64w8s2 228 and m64n64w4s2
        # 255 clean but slower; m128n128w8s2 spills 8 B)
        return [AttnConfig(128, 64, 8, 3)]
    if dclass == "mid":  # dq, split 192: m128n64w8s2 255 regs, clean (m64n64w8s2 234,
        # m128n32w8s2 223 and m64n32 171 clean but slower)
        return [AttnConfig(128, 64, 8, 2)]
    if kind == "fwd":
        if large:
            # AOT sm_90 (d256 / 192-padded): 128x64 w8 s2 clean, 64x64 w8 s2 spills 20 B
            return [AttnConfig(128, 64, 8, 2), AttnConfig(64, 64, 8, 2)]
        # d128: two timed candidates (each costs a compile per causal flag; m64n64w4s3 dropped)
        return [AttnConfig(128, 64, 8, 3), AttnConfig(128, 128, 8, 2)]
    if kind == "dkdv":
        if large:
            # AOT sm_90: 16x32 w8 clean (mma.sync: N=32 too narrow for wgmma); 32x32 w8 s2
            # spills 136 B; at d192/128 the wgmma tiles spill: 16x64 w8 s1 268/280 B st/ld,
            # 32x64 388 B, 64x64 588 B (d256 more). 16x64 is a timed candidate (wgmma).
            return [AttnConfig(16, 32, 8, 1), AttnConfig(32, 32, 8, 2), AttnConfig(16, 64, 8, 1)]
        # AOT sm_90 (2026-11-29, 255-register cap): m32n128w8s1 and m16n128w8s2 clean; every
        # bigger or deeper tile spills (m32n128w8s2 144 B, m64n128w8s1 260/412 B st/ld,
        # m64n128w8s2 660 B, m32n64w4s2 476 B, m64n64w4s2 1244 B, m16n128w8s3 32 B). K and V
        # stay in shared memory (80 KiB), so with BLOCK_M 32 each step re-reads 64 KiB of smem
        # for 32 query rows: the small-spill m64n128w8s1 (twice the rows per K/V read) is timed
        # by the per-shape autotune, never the untuned default. Two candidates only (compile
        # time: m16n128w8s2 and m32n128w8s2 dropped).
        return [AttnConfig(32, 128, 8, 1), AttnConfig(64, 128, 8, 1)]
    if large:  # dq
        return [AttnConfig(64, 32, 8, 2), AttnConfig(32, 32, 4, 2)]  # both clean on sm_90
    # d128 dq: two timed candidates (m128n32w8s3 and m64n32w4s3 dropped: compile time)
    return [AttnConfig(64, 64, 8, 3), AttnConfig(128, 64, 8, 2)]


def _interpreter(kind: str, dclass: str) -> list[AttnConfig]:
    """CPU interpreter: tiny tiles (masks and edge blocks matter, speed does not)."""
    return [AttnConfig(16, 16, 1, 1)]


CONFIGS_BY_FAMILY = {
    ArchFamily.CDNA3: _cdna,
    ArchFamily.CDNA4: _cdna,
    ArchFamily.HOPPER: _hopper,
    ArchFamily.OTHER_GPU: _hopper,
    ArchFamily.CPU: _interpreter,
}


def dim_class(block_d: int) -> str:
    """``small`` (<= 128), ``mid`` (a split width such as 192 = 128 + 64) or ``large`` (256)."""
    if block_d <= 128:
        return "small"
    return "mid" if block_d & (block_d - 1) else "large"


@functools.cache
def attn_configs(family: ArchFamily, kind: str, block_d: int) -> tuple[AttnConfig, ...]:
    """Configs of one kernel kind (``fwd``, ``dkdv``, ``dq``; ``dv``/``dk``: the dK/dV kernel
    launched for one accumulator set) for a padded head dim (the sum of the chunk widths when
    the qk dim is split)."""
    assert kind in ("fwd", "dkdv", "dq", "dv", "dk"), kind
    return tuple(CONFIGS_BY_FAMILY[family](kind, dim_class(block_d)))


def parse_config(name: str, like: AttnConfig) -> AttnConfig:
    """``m32n64w8s1`` -> that tile (extra backend options taken from ``like``), for pinning a
    config by env var (``PRIMUS_TURBO_ATTN_DKDV_CONFIG`` etc., see attn_launch)."""
    import re

    hit = re.fullmatch(r"m(\d+)n(\d+)w(\d+)s(\d+)", name.strip())
    if hit is None:
        want = "m<BLOCK_M>n<BLOCK_N>w<warps>s<stages>"
        raise ValueError(f"attention config {name!r}: expected {want}")
    bm, bn, warps, stages = (int(x) for x in hit.groups())
    return AttnConfig(bm, bn, warps, stages, like.extra)


def select_config(family: ArchFamily, kind: str, block_d: int) -> AttnConfig:
    return attn_configs(family, kind, block_d)[0]
