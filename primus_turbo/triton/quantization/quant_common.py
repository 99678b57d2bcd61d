"""Pieces shared by the quantization kernel modules: the ``RCP`` scale helper of the sliced
kernel and the AOT signature of the ``(x, q, s, qt, st)`` tile kernels (v2/v3 and sliced)."""

from __future__ import annotations

import triton
import triton.language as tl

from primus_turbo.triton.quantization.quant_kernel import _scale_of


@triton.jit
def _rcp(x):
    """``rcp.approx.ftz.f32`` (one MUFU.RCP on sm_90)."""
    return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x],
                                     dtype=tl.float32, is_pure=True, pack=1)  # fmt: skip


@triton.jit
def _scale_rcp(amax, FMAX: tl.constexpr, RCP: tl.constexpr):
    """``_scale_of(amax, FMAX, False, 0)``; with ``RCP`` (NVIDIA compiled kernels) the two
    ``div.full.f32`` (range checks + scaling + MUFU.RCP + multiply, ~9 SASS each, evaluated
    per replicated row / column) become ``(FMAX / 4) * rcp(amax / 4)`` and ``rcp(scale)``.
    Same bits as ``div.full``: for a divisor in [2^-126, 2^126] ``div.full(x, y) =
    x * rcp(y)``; ``amax / 4`` is in that range for every amax in [1e-12, bf16/fp32 max],
    ``rcp`` scales exactly by powers of two on normal values and the product rounds the same
    real; ``scale`` is in [1e-36, 5e14]."""
    if RCP:
        scale = (FMAX * 0.25) * _rcp(tl.maximum(amax, 1e-12) * 0.25)
        return scale, _rcp(scale)
    return _scale_of(amax, FMAX, False, 0)


def aot_fp8(target: str) -> tuple[str, float]:
    """The target's e4m3 output type and its largest finite value (FNUZ on gfx942)."""
    return ("fp8e4b8", 240.0) if target == "gfx942" else ("fp8e4nv", 448.0)


def tile_signature(fp8: str, mx: bool = False) -> dict[str, str]:
    """AOT signature of ``quant_tile_v2_kernel`` / ``quant_sliced_kernel``: bf16 input, ``fp8``
    outputs, fp32 scales (E8M0 bytes with ``mx``); ``M`` carries the ``:16`` hint the JIT
    gives model shapes."""
    sc = "*u8" if mx else "*fp32"
    return {"x_ptr": "*bf16", "q_ptr": f"*{fp8}", "s_ptr": sc, "qt_ptr": f"*{fp8}", "st_ptr": sc,
            "M": "i32:16", "N": "i32:16", "stride_xm": "i32:16", "stride_qm": "i32:16",
            "stride_qtn": "i32:16", "stride_sm": "i32", "stride_sn": "i32", "stride_stm": "i32",
            "stride_stn": "i32"}  # fmt: skip
