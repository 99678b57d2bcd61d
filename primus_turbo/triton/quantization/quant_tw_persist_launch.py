"""Launcher of ``tw_persist_kernel`` (quant_tw_persist.py): ``PRIMUS_TURBO_QUANT_TW=persist``.

Co-residency. The kernel's grid barrier is fast only when all ``P`` programs run at once, so
``P`` <= (programs of the COMPILED kernel that fit on one SM/CU) x (SMs/CUs): registers per
thread (``n_regs``, allocated per warp in units of 8 per thread on NVIDIA) and shared memory
(``metadata.shared`` + 1 KB per block) of the compiled binary, the per-SM limits of the device
(65536 registers, 2048 threads, its shared memory; AMD: 512 VGPRs x 4 SIMDs, 8 waves per SIMD,
64 KB LDS (160 KB on gfx950)), and at most the requested ``_TW_P_PER_SM``. On an otherwise idle
device every program is then scheduled at once. Another kernel running concurrently (another
stream, MPS) may hold SMs: programs that do not fit wait for it, and the resident ones wait at
the barrier for at most ``spin`` polls (``PRIMUS_TURBO_QUANT_TW_SPIN``, default 2^20, about
0.5-1 s); a program whose wait runs out computes the whole tensor's amax itself. So the result
never depends on co-residency (no hang, same bits): only the speed does.

Barrier state: two int32 counters per (device, stream), zeroed once at allocation and reset
by the kernel itself (the last program past the barrier), so launches on one stream never
share them concurrently. Under CUDA graph capture the counters and the occupancy figure must
already exist for the capturing stream (warm up eagerly on it first, as torch recommends);
otherwise that call takes the two-launch ``own`` path (``None`` is returned to the caller).

Knobs: ``PRIMUS_TURBO_QUANT_TW_P_BLOCK`` (flat tile, power of two in [1024, 32768], default
8192), ``_TW_P_TILE`` (dual tile ``BMxBN``, default 64x128), ``_TW_P_HOLD`` (tiles held in
registers per program, 0-4, default 3 flat / 2 dual: the most without a spill at 128
registers on sm_90, 119 / 125), ``_TW_P_WARPS`` (default 8), ``_TW_P_PER_SM`` (programs per
SM requested, default 2 on NVIDIA, register cap 65536 / (per_sm x warps x 32); 1 on AMD),
``_TW_SPIN``, and the ``own`` path's ``_TW_CS`` / ``_TW_EVICT_CAST`` / ``_TW_EVICT``
(``none``: normal amax loads instead of ``evict_last``).
"""

from __future__ import annotations

import os

import torch

from primus_turbo.pytorch.core.platform import num_compute_units, triton_interpret
from primus_turbo.triton.quantization.quant_launch import (
    _empty_like_t,
    _env_flag,
    _env_int,
    _fmax,
    _interp_fmt,
    _nvidia_sat,
    _u8,
)
from primus_turbo.triton.quantization.quant_tw_launch import (
    _choice,
    _pow2_env,
    _programs,
)
from primus_turbo.triton.quantization.quant_tw_persist import tw_persist_kernel

INTERP_PROGRAMS = 3  # interpreter grid (programs run one by one: all but the last time out)
_BARS: dict[tuple, torch.Tensor] = {}  # (device type, index, stream) -> int32[2] counters
_RESIDENT: dict[tuple, int] = {}  # compile key -> programs per SM/CU of the compiled kernel
_INF = {torch.bfloat16: 0x7F80, torch.float16: 0x7C00}  # |x| bits of inf (NaN: above)


def _capturing(x: torch.Tensor) -> bool:
    return x.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _barrier(x: torch.Tensor) -> torch.Tensor | None:
    """The stream's counters (zeroed at allocation); ``None`` when first asked under capture."""
    if x.device.type == "cuda":
        key = ("cuda", x.device.index, torch.cuda.current_stream(x.device).cuda_stream)
    else:
        key = (x.device.type, x.device.index, 0)
    bar = _BARS.get(key)
    if bar is None:
        if _capturing(x):
            return None
        bar = _BARS[key] = torch.zeros(2, dtype=torch.int32, device=x.device)
    return bar


def _tile_env(nvidia: bool) -> tuple[int, int]:
    var = "PRIMUS_TURBO_QUANT_TW_P_TILE"
    raw = os.environ.get(var, "").strip().lower() or "64x128"
    try:
        bm, bn = (int(v) for v in raw.split("x"))
    except ValueError:
        bm = bn = 0
    for v in (bm, bn):
        if v < 16 or v > 256 or v & (v - 1):
            raise ValueError(
                f"primus_turbo: {var} expected BMxBN, powers of two in [16, 256], got {raw!r}"
            )
    return bm, bn


def _fit(regs: int, shared: int, warps: int, dev: torch.device, nvidia: bool) -> int:
    """Programs of ``warps`` warps with ``regs`` registers per thread and ``shared`` bytes of
    shared memory that fit on one SM (NVIDIA) / CU (AMD) at once."""
    if nvidia:
        props = torch.cuda.get_device_properties(dev)
        rf = int(getattr(props, "regs_per_multiprocessor", 65536) or 65536)
        threads = int(getattr(props, "max_threads_per_multi_processor", 2048) or 2048)
        smem = int(getattr(props, "shared_memory_per_multiprocessor", 0) or 100 << 10)
        by_regs = rf // (max(8, -(-regs // 8) * 8) * 32 * warps)
        by_smem = smem // (shared + 1024)
        return max(0, min(threads // (32 * warps), by_regs, by_smem, 32))
    from primus_turbo.pytorch.core.platform import is_gfx950

    waves = min(8, 512 // max(8, -(-regs // 8) * 8))  # per SIMD (wave64, 512 VGPRs a lane)
    lds = (160 if is_gfx950(dev) else 64) << 10
    by_lds = lds // shared if shared else 64
    return max(0, min(4 * waves // warps, by_lds))


def _resident(args, kw: dict, grid_key: tuple, warps: int, x: torch.Tensor, nvidia: bool) -> int:
    """Programs per SM/CU of the compiled kernel (compiled here on first use; cached). 0 when
    unknown under capture (the caller then takes the two-launch path)."""
    key = grid_key
    per = _RESIDENT.get(key)
    if per is None:
        if _capturing(x):
            return 0
        k = tw_persist_kernel.warmup(*args, grid=(1,), **kw)
        k._init_handles()
        per = _RESIDENT[key] = _fit(int(k.n_regs), int(k.metadata.shared), warps, x.device,
                                    nvidia)  # fmt: skip
    return per


def quant_tw_persist(x: torch.Tensor, dtype: torch.dtype, dual: bool):
    """``(q, s)`` / ``(q, s, qt, s)`` in one launch, or ``None`` (see the module docstring)."""
    m, n = x.shape
    xc = x if x.is_contiguous() else x.contiguous()
    if xc.dtype not in _INF or (m * n) % 2 or (dual and n % 2) or xc.data_ptr() % 4:
        return None  # the kernel reads 16-bit values in pairs (int32 words)
    interp = triton_interpret()
    nvidia = not interp and x.device.type == "cuda" and torch.version.hip is None
    bar = _barrier(xc)
    if bar is None:
        return None
    warps = _env_int("PRIMUS_TURBO_QUANT_TW_P_WARPS", 8)
    want = _env_int("PRIMUS_TURBO_QUANT_TW_P_PER_SM", 2 if nvidia else 1)
    if nvidia and want * warps > 64:
        raise ValueError(
            "primus_turbo: PRIMUS_TURBO_QUANT_TW_P_PER_SM x PRIMUS_TURBO_QUANT_TW_P_WARPS "
            f"expected <= 64, got {want} x {warps}"
        )
    raw = os.environ.get("PRIMUS_TURBO_QUANT_TW_P_HOLD", "").strip() or ("2" if dual else "3")
    if raw not in ("0", "1", "2", "3", "4"):
        raise ValueError(f"primus_turbo: PRIMUS_TURBO_QUANT_TW_P_HOLD expected 0-4, got {raw!r}")
    nh = int(raw)
    block = _pow2_env("PRIMUS_TURBO_QUANT_TW_P_BLOCK", 8192, 1024, 32768)
    bm, bn = _tile_env(nvidia)
    numel = m * n
    if dual:
        ntiles = -(-m // bm) * -(-n // bn)
        full = m % bm == 0 and n % bn == 0
    else:
        ntiles = -(-numel // block)
        full = numel % block == 0
    q = torch.empty(x.shape, dtype=dtype, device=x.device)
    s = torch.empty((), dtype=torch.float32, device=x.device)
    qt = _empty_like_t(x, dtype) if dual else None
    eva = _choice("PRIMUS_TURBO_QUANT_TW_EVICT", ("last", "none", "tail"), "last") != "none"
    evc = _choice("PRIMUS_TURBO_QUANT_TW_EVICT_CAST", ("first", "none"), "first")
    spin = _env_int("PRIMUS_TURBO_QUANT_TW_SPIN", 1 if interp else 1 << 20)
    kw = dict(
        BLOCK=block if not dual else 16, BM=bm if dual else 16, BN=bn if dual else 16, DUAL=dual,
        NH=nh, NPB=16, FMAX=_fmax(dtype), FMT=_interp_fmt(dtype), SAT=_nvidia_sat(xc),
        EVEN=False, CS=nvidia and _env_flag("PRIMUS_TURBO_QUANT_TW_CS", True), EVA=int(eva),
        EVC="evict_first" if evc == "first" else "", EVH="evict_first", INF=_INF[xc.dtype],
        FW=min(128, block // 2), num_warps=warps,
    )  # fmt: skip
    if nvidia:
        kw["maxnreg"] = min(255, 65536 // (want * warps * 32)) // 8 * 8
    cus = INTERP_PROGRAMS if interp else num_compute_units(x.device)
    per = 1 if interp else want
    for _ in range(3):  # the grid must fit at once: programs per SM of the compiled binary
        p = _programs(ntiles, per * cus)
        kw["EVEN"] = full and ntiles % p == 0 and ntiles // p >= nh
        kw["NPB"] = max(16, 1 << (p - 1).bit_length())
        parts = torch.empty(p, dtype=torch.float32, device=x.device)
        args = (xc, _u8(q), _u8(qt if dual else q), s, parts, bar, numel, m, n, xc.stride(0),
                p, spin)  # fmt: skip
        if interp:
            break
        ck = (x.device.type, x.device.index, x.dtype, dtype, tuple(sorted(kw.items())))
        fit = _resident(args, kw, ck, warps, xc, nvidia)
        if fit >= per:
            break
        per = fit
        if per < 1:
            return None
    else:
        return None
    tw_persist_kernel[(p,)](*args, **kw)
    return (q, s, qt, s) if dual else (q, s)
