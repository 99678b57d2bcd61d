"""Pieces shared by the quantization kernel modules: the AOT signature of the
``(x, q, s, qt, st)`` tile kernels (v2/v3, sliced and words), the warps and the AOT constexprs
of the 8-slice MX kernels."""

from __future__ import annotations


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


def slice_warps(bm: int, bn: int, lanes: int) -> int:
    """Warps of a ``bm x bn`` tile of the 8-slice MX kernels (sliced and words): one 16-byte
    vector of bf16 per thread and slice, i.e. ``bm * bn / 64`` threads of ``lanes`` each."""
    return max(1, bm * bn // (64 * lanes))


def mx_slice_constexprs(bm: int, bn: int, dual: bool, fmax: float, target: str,
                        even: bool) -> dict:  # fmt: skip
    """AOT constexprs of a ``bm x bn`` tile of the 8-slice MX kernels (sliced and words): the
    target's e4m3 (``fmax``), E8M0 scales, NVIDIA satfinite conversion on sm_90."""
    return {"BM": bm, "BN": bn, "DUAL": dual, "FMAX": fmax, "EMAX": 8, "FMT": (0, 0, 0, 0),
            "SAT": target == "sm_90", "EVEN": even}  # fmt: skip
