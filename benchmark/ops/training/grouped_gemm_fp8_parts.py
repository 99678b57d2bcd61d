"""FP8 parts of the grouped GEMM benchmark (``bench_grouped_gemm_turbo.py --fp8``): the
``torch._scaled_grouped_mm`` peer, the per-case bounds of the fp8 / bf16 forward ratio, and the
pieces of one rowwise fp8 forward timed alone (``--fp8-kernels``)."""

from __future__ import annotations

import math

import torch
from harness import tflops


def scaled_grouped_mm_peer(a, b, ends):
    """``torch._scaled_grouped_mm`` on rowwise E4M3 operands quantized once, outside the timing
    (``a`` per row, each expert's ``[N, K]`` weight per output column), bf16 out; or ``None``
    where this torch has no such op."""
    fn = getattr(torch, "_scaled_grouped_mm", None)
    if fn is None:
        return None
    f8 = torch.float8_e4m3fn
    fmax = torch.finfo(f8).max

    def quant(x):
        scale = x.detach().float().abs().amax(-1, keepdim=True).clamp_min(1e-12) / fmax
        return (x.detach().float() / scale).to(f8), scale.squeeze(-1).contiguous()

    qa, sa = quant(a)
    qb, sb = quant(b)  # [G, N, K] rows along K; scales [G, N]
    mat_b = qb.transpose(-2, -1)  # [G, K, N] column-major, as the op wants

    def run(ap, bp):
        return fn(qa, mat_b, sa, sb, offs=ends, out_dtype=torch.bfloat16)

    run(a, b)  # raises here (not mid-timing) where the GPU or layout is not supported
    return run


def fp8_bounds(g, m, n, k, bf16_ms, hbm_tbps, fp8_tflops, gemm_ms=None) -> dict[str, float]:
    """Upper bounds of the rowwise fp8 forward's ratio to our bf16 forward (``bf16_ms``),
    from the bytes and FLOPs alone: activation quantization ``M*K*(2+1) + 4M`` bytes, weight
    quantization ``G*N*K*(2+1) + 4GN`` bytes (bf16 read, fp8 + fp32 scales written), both at
    ``hbm_tbps``; the fp8 GEMM at ``max(2MNK / fp8_tflops, its bytes / hbm_tbps)`` or, given,
    the measured ``gemm_ms``. ``bound/call``: weights quantized in every call; ``bound
    prequant``: weights quantized beforehand (once per optimizer step)."""
    bw = hbm_tbps * 1e9  # bytes per ms
    qa = (3.0 * m * k + 4.0 * m) / bw
    qb = (3.0 * g * n * k + 4.0 * g * n) / bw
    if gemm_ms is None:
        gemm_ms = max(2.0 * m * n * k / (fp8_tflops * 1e9), (m * k + g * n * k + 2.0 * m * n) / bw)
    return {
        "qa min ms": qa,
        "qb min ms": qb,
        "gemm min ms": gemm_ms,
        "bound/call": bf16_ms / (qa + qb + gemm_ms),
        "bound prequant": bf16_ms / (qa + gemm_ms),
        "bound prequant a+b": bf16_ms / gemm_ms,
    }


FP8_KERNELS = ("bf16", "quant_a", "quant_b", "vendor", "ptr", "tma")


def fp8_kernel_times(a, b, gl, args) -> dict[str, float]:
    """The pieces of one rowwise fp8 forward alone (``--fp8-kernels``): the bf16 grouped GEMM
    (``grouped_gemm_triton``, tuned plan), the two quantizations of ``grouped_gemm_fp8``
    (activation per row, weights per (expert, column)), and the fp8 GEMM alone on those
    operands through the vendor backend (``torch._scaled_grouped_mm`` + tail fix-up), the
    Triton pointer kernels (``grouped_gemm_triton(scales=...)``) and the Triton TMA kernel
    (``grouped_gemm_fp8_tma``, whatever ``PRIMUS_TURBO_GROUPED_GEMM_FP8_TMA`` says). Returns
    ``{"<piece> ms": ...}`` and ``{"fp8 <gemm> TFLOPS": ...}``; a piece that cannot run here
    is NaN."""
    from harness import time_ms

    from primus_turbo.pytorch.core.low_precision import ScalingGranularity
    from primus_turbo.pytorch.kernels.grouped_gemm.grouped_gemm_fp8_impl import (
        GroupedGemmFp8HipblasltBackend as Vendor,
    )
    from primus_turbo.pytorch.ops.grouped_gemm_fp8 import _quant_experts, _quant_rows
    from primus_turbo.pytorch.reference import group_offsets
    from primus_turbo.triton.grouped_gemm.grouped_gemm_fp8_tma import grouped_gemm_fp8_tma
    from primus_turbo.triton.grouped_gemm.grouped_gemm_kernel import grouped_gemm_triton

    a, b = a.detach(), b.detach()
    f8, row = torch.float8_e4m3fn, ScalingGranularity.ROWWISE
    offs = group_offsets(gl)
    qa, sa = _quant_rows(a, f8, row)
    qb, sb = _quant_experts(b, f8, row)
    bf = torch.bfloat16
    fns = {
        "bf16": lambda: grouped_gemm_triton(a, b, offs, True),
        "quant_a": lambda: _quant_rows(a, f8, row),
        "quant_b": lambda: _quant_experts(b, f8, row),
        "vendor": lambda: Vendor.execute(qa, sa, qb, sb, offs, gl, bf),
        "ptr": lambda: grouped_gemm_triton(qa, qb, offs, True, bf, scales=(sa, sb)),
        "tma": lambda: grouped_gemm_fp8_tma(qa, qb, offs, sa, sb, bf),
    }
    out = {}
    for name, fn in fns.items():
        try:
            fn()  # the config tuner's first call, outside the timing
            out[f"{name} ms"] = time_ms(fn, args.warmup_ms, args.rep_ms).median_ms
        except Exception as e:
            print(f"  fp8 piece {name} unavailable: {type(e).__name__}: {str(e)[:160]}")
            out[f"{name} ms"] = math.nan
    flops = 2.0 * a.shape[0] * b.shape[1] * a.shape[1]
    for name in ("bf16", "vendor", "ptr", "tma"):
        out[f"fp8 {name} TFLOPS"] = tflops(flops, out[f"{name} ms"])
    quant = out["quant_a ms"] + out["quant_b ms"]
    best = min((out[f"{x} ms"] for x in ("ptr", "tma") if out[f"{x} ms"] == out[f"{x} ms"]),
               default=math.nan)  # fmt: skip
    out["fp8 fwd ratio bound"] = out["bf16 ms"] / (quant + best)
    out["fp8 fwd ratio bound cached w"] = out["bf16 ms"] / (out["quant_a ms"] + best)
    print(
        "  fp8 pieces (ms): "
        + " | ".join(f"{x} {out[f'{x} ms']:.3f}" for x in FP8_KERNELS)
        + " || GEMM TFLOPS: "
        + " ".join(f"{x} {out[f'fp8 {x} TFLOPS']:.1f}" for x in ("bf16", "vendor", "ptr", "tma"))
        + f" || bf16 / (quant + best triton fp8) = x{out['fp8 fwd ratio bound']:.3f}"
        + f" (weights cached: x{out['fp8 fwd ratio bound cached w']:.3f})"
    )
    return out
