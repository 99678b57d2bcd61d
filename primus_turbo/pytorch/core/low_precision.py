"""Low-precision configuration: formats, scaling granularities, quant configs, support probes.

Enum values follow the reference API (``enum.auto()``, starting at 1); the integer ``.value`` is
what crosses custom-op boundaries. FP8 dtypes are chosen per device: FNUZ on gfx942
(``e4m3fnuz`` max 240), OCP everywhere else (``e4m3fn`` max 448); e5m2 max is 57344 in both.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import NamedTuple

import torch

from primus_turbo.pytorch.core.checks import fail
from primus_turbo.pytorch.core.platform import (
    amd_arch,
    cuda_capability,
    fp8_dtypes,
    fp8_dtypes_for,
    gpu_available,
    triton_interpret,
)

MX_BLOCK_SIZE = 32  # MXFP8 / MXFP4 scale block along K
MX_PAD_ALIGN = 128
DEFAULT_BLOCK_SIZE = 128  # BLOCKWISE default (1x128 activations, 128x128 weights)
AMAX_EPS = 1e-12  # scale = fmax / max(amax, AMAX_EPS): all-zero input gives q = 0, finite scale

_OP = "low_precision"


class Format(enum.Enum):
    E4M3 = enum.auto()
    E5M2 = enum.auto()
    E2M1_X2 = enum.auto()
    HYBRID = enum.auto()  # E4M3 for forward operands, E5M2 for gradients


class ScaleDtype(enum.Enum):
    FP32 = enum.auto()
    E8M0 = enum.auto()


class ScalingGranularity(enum.Enum):
    TENSORWISE = enum.auto()
    ROWWISE = enum.auto()
    BLOCKWISE = enum.auto()
    MX_BLOCKWISE = enum.auto()


class ScalingStrategy(enum.Enum):
    DYNAMIC = enum.auto()  # scale from the tensor's own amax (two reads for TENSORWISE)
    DELAYED = enum.auto()  # scale from an amax history of earlier steps (TENSORWISE, one pass)


AMAX_COMPUTE_ALGOS = ("max", "most_recent")  # DELAYED: amax taken from the history


class ScalingRecipe(NamedTuple):
    use_2d_block: bool = False  # square block x block tiles (weights)
    use_sr: bool = False  # stochastic rounding (not implemented; rejected)
    use_rht: bool = False  # random Hadamard transform (not implemented; rejected)
    shuffle_scale: bool = False
    shuffle_out: bool = False


@dataclasses.dataclass(frozen=True)
class Float8QuantConfig:
    """FP8 recipe. BLOCKWISE needs ``block_size`` (GEMMs use 128); MX_BLOCKWISE needs
    ``block_size == 32`` and ``scale_dtype == E8M0``.

    ``strategy=DELAYED`` (TENSORWISE only; TransformerEngine's DelayedScaling recipe): each
    tensor is cast with a scale derived from the amax history of earlier steps,
    ``scale = fp8_max / (2**margin * amax)`` with ``amax`` the max of the last
    ``amax_history_len`` amaxes (``amax_compute_algo="max"``) or the last one
    (``"most_recent"``); the state lives in ``ops.Fp8DelayedScaler`` (``Float8Linear`` keeps
    one per operand). The ``amax_*`` / ``margin`` fields are ignored by DYNAMIC.
    ``saturation_guard`` (DELAYED only, default False = TransformerEngine's behaviour: a tensor
    whose amax outgrew the history saturates): re-cast such a tensor with its own amax's scale
    (one extra launch per cast, ~4% of a 30 us cast on the H200);
    ``PRIMUS_TURBO_QUANT_TWD_GUARD=0/1`` overrides it globally."""

    format: Format = Format.E4M3
    granularity: ScalingGranularity = ScalingGranularity.TENSORWISE
    strategy: ScalingStrategy = ScalingStrategy.DYNAMIC
    scale_dtype: ScaleDtype = ScaleDtype.FP32
    block_size: int | None = None
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    margin: int = 0
    saturation_guard: bool = False

    def __post_init__(self) -> None:
        op = "Float8QuantConfig"
        for name, enum_cls in (
            ("format", Format),
            ("granularity", ScalingGranularity),
            ("strategy", ScalingStrategy),
            ("scale_dtype", ScaleDtype),
        ):
            v = getattr(self, name)
            if not isinstance(v, enum_cls):
                fail(op, name, f"a {enum_cls.__name__}", repr(v), TypeError)
        if self.format == Format.E2M1_X2:
            fail(op, "format", "E4M3/E5M2/HYBRID (E2M1_X2 is Float4QuantConfig)", "E2M1_X2")
        g = self.granularity
        if g == ScalingGranularity.BLOCKWISE:
            if not isinstance(self.block_size, int) or self.block_size <= 0:
                fail(op, "block_size", "a positive int for BLOCKWISE", self.block_size)
        elif g == ScalingGranularity.MX_BLOCKWISE:
            if self.block_size != MX_BLOCK_SIZE:
                fail(op, "block_size", f"{MX_BLOCK_SIZE} for MX_BLOCKWISE", self.block_size)
            if self.scale_dtype != ScaleDtype.E8M0:
                fail(op, "scale_dtype", "E8M0 for MX_BLOCKWISE", self.scale_dtype.name)
        elif self.block_size is not None:
            fail(op, "block_size", f"None for {g.name}", self.block_size)
        if g != ScalingGranularity.MX_BLOCKWISE and self.scale_dtype != ScaleDtype.FP32:
            fail(op, "scale_dtype", f"FP32 for {g.name}", self.scale_dtype.name)
        if self.strategy == ScalingStrategy.DELAYED and g != ScalingGranularity.TENSORWISE:
            fail(op, "strategy", "DYNAMIC for " + g.name + " (DELAYED scaling needs granularity "
                 "TENSORWISE)", "DELAYED")  # fmt: skip
        n = self.amax_history_len
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            fail(op, "amax_history_len", "an int >= 1", repr(n))
        if self.amax_compute_algo not in AMAX_COMPUTE_ALGOS:
            fail(op, "amax_compute_algo", f"one of {AMAX_COMPUTE_ALGOS}",
                 repr(self.amax_compute_algo))  # fmt: skip
        if not isinstance(self.margin, int) or isinstance(self.margin, bool) or self.margin < 0:
            fail(op, "margin", "an int >= 0", repr(self.margin))
        if not isinstance(self.saturation_guard, bool):
            fail(op, "saturation_guard", "a bool", repr(self.saturation_guard), TypeError)
        if self.saturation_guard and self.strategy != ScalingStrategy.DELAYED:
            fail(op, "saturation_guard", "False unless strategy is DELAYED", "True")

    def forward_dtype(self, device=None) -> torch.dtype:
        e4m3, e5m2 = fp8_dtypes(device)
        return e5m2 if self.format == Format.E5M2 else e4m3

    def grad_dtype(self, device=None) -> torch.dtype:
        e4m3, e5m2 = fp8_dtypes(device)
        return e4m3 if self.format == Format.E4M3 else e5m2


@dataclasses.dataclass(frozen=True)
class Float4QuantConfig:
    """MXFP4 recipe: E2M1 packed two per byte, E8M0 scales per 32 values along K."""

    format: Format = Format.E2M1_X2
    granularity: ScalingGranularity = ScalingGranularity.MX_BLOCKWISE
    strategy: ScalingStrategy = ScalingStrategy.DYNAMIC
    scale_dtype: ScaleDtype = ScaleDtype.E8M0
    block_size: int = MX_BLOCK_SIZE
    use_gradient_sr: bool = False
    use_preshuffle: bool = False

    def __post_init__(self) -> None:
        op = "Float4QuantConfig"
        expect = (
            ("format", Format.E2M1_X2),
            ("granularity", ScalingGranularity.MX_BLOCKWISE),
            ("strategy", ScalingStrategy.DYNAMIC),
            ("scale_dtype", ScaleDtype.E8M0),
            ("block_size", MX_BLOCK_SIZE),
            ("use_gradient_sr", False),
            ("use_preshuffle", False),
        )
        for name, want in expect:
            got = getattr(self, name)
            if got != want:
                note = " (not implemented)" if isinstance(want, bool) else ""
                fail(op, name, f"{getattr(want, 'name', want)}{note}", got)


# ---- dtypes ------------------------------------------------------------------------------

FP8_DTYPES = (
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2fnuz,
)
FP4_DTYPE = getattr(torch, "float4_e2m1fn_x2", None)
E2M1_MAX = 6.0


def is_fp8_dtype(dtype: torch.dtype) -> bool:
    return dtype in FP8_DTYPES


def is_fp4_dtype(dtype: torch.dtype) -> bool:
    return FP4_DTYPE is not None and dtype == FP4_DTYPE


def fp8_max(dtype: torch.dtype) -> float:
    """Largest finite value: 448 (e4m3fn), 240 (e4m3fnuz), 57344 (e5m2, e5m2fnuz)."""
    if not is_fp8_dtype(dtype):
        fail(_OP, "dtype", "an fp8 dtype", dtype, TypeError)
    return float(torch.finfo(dtype).max)


def fp8_dtype_for_format(fmt: Format, device=None, *, grad: bool = False) -> torch.dtype:
    e4m3, e5m2 = fp8_dtypes(device)
    if fmt == Format.E5M2 or (fmt == Format.HYBRID and grad):
        return e5m2
    return e4m3


# ---- support probes: (ok, reason) ---------------------------------------------------------


def _where() -> tuple[str | None, tuple[int, int] | None]:
    if not gpu_available():
        return None, None
    return amd_arch(), cuda_capability()


def check_fp8_support() -> tuple[bool, str]:
    arch, cap = _where()
    if arch is None and cap is None:
        return False, "no GPU visible (CPU runs the TORCH reference and the Triton interpreter)"
    if arch is not None:
        ok = arch in ("gfx942", "gfx950")
        return ok, "" if ok else f"FP8 needs gfx942/gfx950, got {arch}"
    ok = cap >= (8, 9)
    return ok, "" if ok else f"FP8 needs sm_89+, got sm_{cap[0]}{cap[1]}"


def check_fp8_ocp_support() -> tuple[bool, str]:
    arch, cap = _where()
    if arch is None and cap is None:
        return False, "no GPU visible"
    if arch is not None:
        ok = fp8_dtypes_for(arch)[0] == torch.float8_e4m3fn and arch == "gfx950"
        return ok, "" if ok else f"OCP fp8 needs gfx950, got {arch} (FNUZ)"
    return check_fp8_support()


def check_mxfp8_support() -> tuple[bool, str]:
    """MX through ``tl.dot_scaled``: native on gfx950, emulated on sm_90+."""
    arch, cap = _where()
    if arch is None and cap is None:
        return False, "no GPU visible"
    if arch is not None:
        ok = arch == "gfx950"
        return ok, "" if ok else f"MX formats need gfx950, got {arch}"
    ok = cap >= (9, 0)
    return ok, "" if ok else f"MX formats need sm_90+ (emulated dot_scaled), got {cap}"


def check_mxfp4_support() -> tuple[bool, str]:
    ok, reason = check_mxfp8_support()
    if ok and FP4_DTYPE is None:
        return False, "this torch has no float4_e2m1fn_x2"
    return ok, reason


def check_scaled_mm_blockwise_support() -> tuple[bool, str]:
    """torch._scaled_mm with 1x128 / 128x128 block scales (CUDA sm_90, recent torch)."""
    arch, cap = _where()
    if arch is not None or cap is None:
        return False, "blockwise torch._scaled_mm needs an NVIDIA sm_90 GPU"
    if cap[0] != 9:
        return False, f"blockwise torch._scaled_mm needs sm_90, got sm_{cap[0]}{cap[1]}"
    cuda = tuple(int(v) for v in (torch.version.cuda or "0.0").split(".")[:2])
    if cuda < (12, 9):  # Blas.cpp: VEC128_32F / BLK128x128_32F only `#if CUDA_VERSION >= 12090`
        return False, f"blockwise torch._scaled_mm needs torch built with CUDA >= 12.9, got {cuda}"
    return True, ""


_FNUZ = (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)


def triton_fp8_support_for(
    dtype: torch.dtype, arch: str | None, capability: tuple[int, int] | None, interpret: bool
) -> tuple[bool, str]:
    """Whether Triton can compile ``dtype`` for a device (pure; see :func:`triton_fp8_support`).

    Triton 3.6: the interpreter handles all four fp8 dtypes; the AMD backend compiles all four
    (FNUZ ``fp8e4b8``/``fp8e5b16`` native on gfx942, OCP native on gfx950, emulated otherwise);
    the NVIDIA backend has only ``fp8e5`` and, on sm_89+, ``fp8e4nv`` -- no FNUZ."""
    if interpret or arch is not None:
        return True, ""
    if capability is None:
        return False, "no GPU visible and TRITON_INTERPRET is not set"
    sm = f"sm_{capability[0]}{capability[1]}"
    if dtype in _FNUZ:
        return False, f"Triton on NVIDIA ({sm}) has no {dtype} (FNUZ fp8 exists only on AMD)"
    if dtype == torch.float8_e4m3fn and capability < (8, 9):
        return False, f"Triton fp8e4nv needs sm_89+, got {sm}"
    return True, ""


def triton_fp8_support(dtype: torch.dtype, device=None) -> tuple[bool, str]:
    """``(ok, reason)``: can a Triton kernel read/write ``dtype`` on ``device`` (or in the
    interpreter)? Backends use it in ``can_handle`` so an unsupported dtype routes to TORCH
    instead of failing inside the Triton compiler."""
    dev = torch.device(device) if device is not None else None
    if (dev is not None and dev.type != "cuda") or not gpu_available():
        return triton_fp8_support_for(dtype, None, None, triton_interpret())
    return triton_fp8_support_for(dtype, amd_arch(dev), cuda_capability(dev), triton_interpret())
