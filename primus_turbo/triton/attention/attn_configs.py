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


# kind -> head-dim class ("small" <= 128, "large" = 256 padded, also 192/128) -> configs.
# Register budget (AOT check, build/aot_report.md): per thread, the fp32 accumulators take
# rows * BLOCK_D / threads; 4 warps with a 128x128 fp32 accumulator spill on sm_90, so every
# d128 tile that holds two such accumulators (dK and dV) uses 8 warps.
def _cdna(kind: str, large: bool) -> list[AttnConfig]:
    """gfx942/gfx950: 64-wide wavefronts (4 warps = 256 lanes), 64 KiB / 160 KiB LDS."""
    if kind == "fwd":
        if large:
            return [_amd(64, 64, 8), _amd(64, 32, 4)]
        return [_amd(128, 64, 8), _amd(128, 64, 4), _amd(128, 32, 4), _amd(64, 64, 4)]
    # Backward: AOT (2026-11-29) spills on gfx942/gfx950 with waves_per_eu 2 and 1 alike
    # (Triton keeps accumulators in the 256 arch VGPRs, AGPR 0): d128 dK/dV ~26 VGPRs, d192/256
    # dK/dV 58-240. Smaller tiles (BLOCK_N 32 at d128, 16 at d256) are the next thing to try.
    if kind == "dkdv":
        if large:
            return [_amd(32, 32, 8, waves=1), _amd(16, 64, 8, waves=1)]
        return [_amd(32, 64, 8, waves=1), _amd(64, 64, 8, waves=1), _amd(32, 128, 8, waves=1)]
    if large:  # dq
        return [_amd(64, 32, 8, waves=1), _amd(32, 32, 4, waves=1)]
    return [_amd(64, 64, 8, waves=1), _amd(128, 32, 8, waves=1), _amd(64, 32, 4, waves=1)]


def _hopper(kind: str, large: bool) -> list[AttnConfig]:
    """sm_90: 228 KiB shared memory, wgmma needs BLOCK_M >= 64 per 4 warps."""
    if kind == "fwd":
        if large:
            # AOT sm_90 (d256 / 192-padded): 128x64 w8 s2 clean, 64x64 w8 s2 spills 20 B
            return [AttnConfig(128, 64, 8, 2), AttnConfig(64, 64, 8, 2)]
        return [AttnConfig(128, 64, 8, 3), AttnConfig(128, 128, 8, 2), AttnConfig(64, 64, 4, 3)]
    if kind == "dkdv":
        if large:
            # AOT sm_90: 16x32 w8 clean (mma.sync: N=32 too narrow for wgmma); 32x32 w8 s2
            # spills 136 B, 32x64 / 16x64 spill 270-800 B (dK and dV at d256 are 2x 64 KiB fp32)
            return [AttnConfig(16, 32, 8, 1), AttnConfig(32, 32, 8, 2)]
        # AOT sm_90: m32n128w8 with 2 stages spills 144 B, 1 stage none; m16n128w8s2 none
        return [AttnConfig(32, 128, 8, 1), AttnConfig(16, 128, 8, 2)]
    if large:  # dq
        return [AttnConfig(64, 32, 8, 2), AttnConfig(32, 32, 4, 2)]  # both clean on sm_90
    return [
        AttnConfig(64, 64, 8, 3),
        AttnConfig(128, 32, 8, 3),
        AttnConfig(128, 64, 8, 2),
        AttnConfig(64, 32, 4, 3),
    ]


def _interpreter(kind: str, large: bool) -> list[AttnConfig]:
    """CPU interpreter: tiny tiles (masks and edge blocks matter, speed does not)."""
    return [AttnConfig(16, 16, 1, 1)]


CONFIGS_BY_FAMILY = {
    ArchFamily.CDNA3: _cdna,
    ArchFamily.CDNA4: _cdna,
    ArchFamily.HOPPER: _hopper,
    ArchFamily.OTHER_GPU: _hopper,
    ArchFamily.CPU: _interpreter,
}


@functools.cache
def attn_configs(family: ArchFamily, kind: str, block_d: int) -> tuple[AttnConfig, ...]:
    """Configs of one kernel kind (``fwd``, ``dkdv``, ``dq``) for a padded head dim."""
    assert kind in ("fwd", "dkdv", "dq"), kind
    return tuple(CONFIGS_BY_FAMILY[family](kind, block_d > 128))


def select_config(family: ArchFamily, kind: str, block_d: int) -> AttnConfig:
    return attn_configs(family, kind, block_d)[0]
