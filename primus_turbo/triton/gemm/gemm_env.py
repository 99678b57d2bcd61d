"""Environment switches of the dense Triton GEMM (``gemm_kernel``): composite tiles, loop
flattening, TMA. Each is read once per process (``functools.cache``); tests clear the caches."""

from __future__ import annotations

import functools

from primus_turbo.pytorch.core.platform import ArchFamily, triton_interpret
from primus_turbo.triton.gemm.gemm_configs import (
    GemmConfig,
    narrow_candidates,
    parse_config_names,
)


@functools.cache
def _narrow_enabled(family: ArchFamily) -> bool:
    """``PRIMUS_TURBO_GEMM_NARROW``: composite N tiles (``select_narrow``) where the model
    predicts a clear gain; with tuning on they are timed next to the plain plans, without tuning
    they are used directly. Default on for NVIDIA (target: kv_a on the H200), off on AMD
    (compiled by the AOT check, not yet measured there). Read once per process."""
    from primus_turbo.pytorch.core.checks import env_flag

    default = family not in (ArchFamily.CDNA3, ArchFamily.CDNA4)
    return env_flag("PRIMUS_TURBO_GEMM_NARROW", default)


def _narrow_plans(m: int, n: int, k: int, family: ArchFamily, cus: int) -> tuple:
    """The composite configs for this shape: ``narrow_candidates`` (tuned side by side; the
    first is the untuned choice), or the configs named in ``PRIMUS_TURBO_GEMM_NARROW_CONFIGS``
    (comma-separated ``GemmConfig.name``s, e.g. ``m128n128p16k128g8w8s3``) on the shapes where
    ``select_narrow`` fires; () with ``PRIMUS_TURBO_GEMM_NARROW=0``."""
    if not _narrow_enabled(family):
        return ()
    plans = narrow_candidates(m, n, k, family, cus)
    forced = _narrow_forced()
    if plans and forced:
        return forced
    if _tma_mode(family) == "0":
        plans = tuple(p for p in plans if not p.tma)
    return plans


TMA_MODES = ("0", "narrow", "1")


@functools.cache
def _tma_mode(family: ArchFamily) -> str:
    """``PRIMUS_TURBO_GEMM_TMA`` (sm_90 only, else ``0``): ``narrow`` (default) adds a TMA
    version of the composite tile to the tuner's composite candidates, ``1`` also a TMA version
    of every plain config, ``0`` never launches the TMA kernel. Read once per process."""
    import os

    if family != ArchFamily.HOPPER and not (family == ArchFamily.CPU and triton_interpret()):
        return "0"
    value = os.environ.get("PRIMUS_TURBO_GEMM_TMA", "narrow").strip().lower() or "narrow"
    if value not in TMA_MODES:
        raise ValueError(f"PRIMUS_TURBO_GEMM_TMA must be one of {TMA_MODES}, got {value!r}")
    return value


@functools.cache
def _narrow_forced() -> tuple:
    import os

    return parse_config_names(os.environ.get("PRIMUS_TURBO_GEMM_NARROW_CONFIGS", ""))


FLATTEN_MODES = ("0", "1", "auto")


@functools.cache
def _flatten_mode(family: ArchFamily) -> str:
    """``PRIMUS_TURBO_GEMM_FLATTEN``: ``auto`` (default) flattens plain tiles only, ``1`` every
    tile, ``0`` none. Flattening fuses the persistent tile loop with the K loop
    (``tl.range(..., flatten=True)``) so the next tile's loads overlap this tile's epilogue.
    H200 run 4.2 (kernel-only, L2 flushed): every plain plan timed got faster (kv_b m128n256
    294 -> 263 us, 128x128 w4 s3 2/SM 331 -> 279; kv_a m128n256 86 -> 80, 128x128 w4 s3
    99 -> 79), every composite one slower (kv_a 128x(128+16) 66 -> 88 us). NVIDIA only:
    ``0`` on AMD and the CPU. Read once per process."""
    import os

    if family in (ArchFamily.CDNA3, ArchFamily.CDNA4, ArchFamily.CPU):
        return "0"
    value = os.environ.get("PRIMUS_TURBO_GEMM_FLATTEN", "auto").strip().lower() or "auto"
    value = {"on": "1", "true": "1", "yes": "1", "off": "0", "false": "0", "no": "0"}.get(
        value, value
    )
    if value not in FLATTEN_MODES:
        raise ValueError(f"PRIMUS_TURBO_GEMM_FLATTEN must be one of {FLATTEN_MODES}, got {value!r}")
    return value


def _flatten_for(cfg: GemmConfig, family: ArchFamily) -> bool:
    """Whether ``cfg`` (a data-parallel plan) runs flattened (see ``_flatten_mode``)."""
    mode = _flatten_mode(family)
    return mode == "1" or (mode == "auto" and not cfg.block_n2)
