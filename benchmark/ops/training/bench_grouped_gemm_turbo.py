"""Grouped GEMM benchmark: ``turbo.ops.grouped_gemm`` vs ``torch._grouped_mm`` and a loop of
``torch.matmul`` on MoE expert shapes with non-uniform group sizes.

For every case (``config.ragged_grouped_gemm_cases``: DeepSeek-V3, Qwen3-30B-A3B, gpt-oss-20b,
Mixtral-8x7B; gate_up and down; seeded Gamma-distributed expert loads with some empty experts):
correctness first (out, da, db against ``grouped_gemm_ref`` in fp32: normalised allclose and SNR
-> Check PASS/FAIL/ERROR), then forward and backward timings of the turbo op and of both peers
in alternating rounds. Layout: ``a [M, K]``, weights ``b [G, N, K]``, ``trans_b=True`` (the
``GroupedLinear`` layout). FLOPs: forward ``2MNK``, backward ``4MNK`` (``M`` = all rows).

Peers: ``torch._grouped_mm`` (CUTLASS, CUDA sm_90+, bf16; its own autograd) with int32 group
ends; the loop peer gets the group sizes on the host for free (no sync counted) and runs one
``torch.matmul`` per expert plus ``torch.cat`` (what a plain PyTorch MoE layer does).

    python benchmark/ops/training/bench_grouped_gemm_turbo.py --backend TRITON
    python benchmark/ops/training/bench_grouped_gemm_turbo.py --fp8            # = --fp8 rowwise
    python benchmark/ops/training/bench_grouped_gemm_turbo.py --fp8 tensorwise --max-cases 4

With ``--fp8 [rowwise|tensorwise]`` (bare ``--fp8`` means rowwise), "ours" is
``turbo.ops.grouped_gemm_fp8`` (bf16 in and out, quantization timed) and the peers are our bf16
grouped GEMM (``turbo_bf16``: the target is a forward ratio >= 1.5), ``torch._grouped_mm`` and,
where torch has it and the GPU runs it, ``torch._scaled_grouped_mm`` (``scaled_grouped_mm``:
rowwise E4M3 GEMM alone on operands quantized beforehand, forward only, so a strict bound); the
gate is SNR only (25 dB, E4M3).

``--fp8-weights prequant``: the weights are quantized once outside the timing
(``quantize_grouped_weight``, as a training step reuses them across micro-batches until the
optimizer step; ``GroupedLinear(fp8_weight_cache=True)``), so ``--timing graph`` times the
activation quantization and the fp8 GEMM; peer ``turbo_fp8`` (forward only) is the same op
quantizing the weights in every call (the A/B in one process). ``--fp8-act prequant``: the
activations pre-quantized as well (``QuantizedTensor``), i.e. the forward once their quantization
is fused upstream; ``turbo_fp8`` then quantizes both in the op. Every fp8 case also prints the
bounds of the forward ratio to our bf16 forward from bytes and FLOPs alone (``fp8_bounds``:
quantization at ``--hbm-tbps``, the GEMM at ``--fp8-peak-tflops`` or, with ``--fp8-kernels``, its
measured time). At 4 TB/s and 1979 TFLOPS (the H200's HBM copy speed and fp8 peak) and the bf16
times of run 7.1 (pieces), quantizing b in every call caps the ratio at 1.15 / 1.18 (Qwen3-30B-A3B
gate_up / down: quant b alone is >= 0.302 / 0.151 ms against bf16 0.700 / 0.378 ms), 1.78 / 1.66 on
gpt-oss-20b and 1.95 / 2.23 on DeepSeek-V3; with the measured fp8 GEMM (0.365 / 0.235, 0.957 /
0.474, 2.627 / 1.539 ms) 0.91 / 0.89, 1.27 / 1.21, 1.59 / 1.59.
Pre-quantized weights: roofline caps 2.25-2.96; with the measured GEMM and activation quantization
1.49 / 1.35 (Qwen3), 1.75 / 1.65 (gpt-oss), 1.96 / 1.93 (DeepSeek-V3); a and b both pre-quantized
(the fp8 GEMM alone): 1.92 / 1.61, 1.89 / 1.90, 2.22 / 2.06.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import traceback
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parents[1])]  # config.py, harness.py
if str(_HERE.parents[2]) not in sys.path:
    sys.path.append(str(_HERE.parents[2]))  # the repo root, for an uninstalled checkout

import torch  # noqa: E402
from config import RaggedGroupedGemmCase, ragged_grouped_gemm_cases  # noqa: E402
from grouped_gemm_fp8_parts import (  # noqa: E402
    FP8_KERNELS,
    fp8_bounds,
    fp8_kernel_times,
    scaled_grouped_mm_peer,
)
from harness import (  # noqa: E402
    SNR_THRESHOLD_DB,
    DeviceInfo,
    Mode,
    Results,
    add_common_args,
    bench_pair,
    check_allclose,
    compute_snr,
    cpu_notice,
    geomean,
    output_path,
    ratio,
    resolve_profile,
    shard,
    tflops,
)

import primus_turbo.pytorch as turbo  # noqa: E402
from primus_turbo.pytorch.core import BackendType, GlobalBackendManager  # noqa: E402
from primus_turbo.pytorch.reference import grouped_gemm_ref  # noqa: E402

BACKENDS = ("auto", "TRITON", "HIPBLASLT", "TORCH")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
PEERS = ("grouped_mm", "loop", "turbo_bf16", "scaled_grouped_mm", "turbo_fp8")
FP8 = ("none", "tensorwise", "rowwise")

TABLE_COLUMNS = [
    "Case",
    "G",
    "M",
    "N",
    "K",
    "Resolved Backend",
    "Check",
    "Forward TFLOPS",
    "Step TFLOPS",
    "grouped_mm Forward TFLOPS",
    "grouped_mm Step TFLOPS",
    "loop Forward TFLOPS",
    "turbo_bf16 Forward TFLOPS",
    "scaled_grouped_mm Forward TFLOPS",
    "turbo_fp8 Forward TFLOPS",
    "Forward Ratio grouped_mm",
    "Step Ratio grouped_mm",
    "Forward Ratio loop",
    "Step Ratio loop",
    "Forward Ratio turbo_bf16",
    "Forward Ratio scaled_grouped_mm",
    "Forward Ratio turbo_fp8",
    "out_snr",
    "da_snr",
    "db_snr",
]
METRIC_COLUMNS = [
    "Forward Time (ms)",
    "Forward TFLOPS",
    "Backward Time (ms)",
    "Backward TFLOPS",
    "Step TFLOPS",
    *(f"{p} {x}" for p in PEERS for x in ("Forward TFLOPS", "Backward TFLOPS", "Step TFLOPS")),
    *(f"{x} Ratio {p}" for p in PEERS for x in ("Forward", "Backward", "Step")),
    "out_snr",
    "da_snr",
    "db_snr",
]


def _grouped_mm_peer(a, b, ends):
    return torch._grouped_mm(a, b.transpose(-2, -1), offs=ends)


def _loop_peer(a, b, lens):
    outs, start = [], 0
    for g, n in enumerate(lens):
        outs.append(torch.matmul(a[start : start + n], b[g].t()))
        start += n
    return torch.cat(outs)


def _fp8_config(kind: str):
    from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, ScalingGranularity

    gran = ScalingGranularity.ROWWISE if kind == "rowwise" else ScalingGranularity.TENSORWISE
    return Float8QuantConfig(granularity=gran)


def _ours(args: argparse.Namespace, a: torch.Tensor | None = None, b: torch.Tensor | None = None):
    """The timed op. ``--fp8-weights prequant``: ``b`` quantized once here
    (``quantize_grouped_weight``: forward and dgrad copies, gradients to ``b``), outside the
    timing, as a training step reuses them across micro-batches; the op then quantizes only
    the activations. ``--fp8-act prequant``: ``a`` too (rowwise along K, gradients to ``a``):
    what the forward costs once the activation quantization is fused upstream (before an fp8
    permute, into SwiGLU)."""
    if args.fp8 == "none":
        return lambda a, b, gl: turbo.ops.grouped_gemm(a, b, gl, trans_b=True)
    config = _fp8_config(args.fp8)
    qa = qb = None
    if args.fp8_weights == "prequant" and b is not None:
        from primus_turbo.pytorch.ops.grouped_gemm_fp8 import quantize_grouped_weight

        qb = quantize_grouped_weight(b, config, trans_b=True, with_dgrad=True)
    if args.fp8_act == "prequant" and a is not None:
        from primus_turbo.pytorch.core.low_precision import fp8_dtype_for_format
        from primus_turbo.pytorch.core.quantized_tensor import QuantizedTensor

        f8 = fp8_dtype_for_format(config.format, a.device)
        qa = QuantizedTensor.quantize(a, f8, config.granularity, axis=1)

    def op(a_, b_, gl):
        a_ = a_ if qa is None else qa
        b_ = b_ if qb is None else qb
        return turbo.ops.grouped_gemm_fp8(a_, b_, gl, trans_b=True, config=config)

    return op


def check_case(op, a, b, gl, lens, grad, dtype, fp8: bool) -> tuple[bool, dict[str, float]]:
    out = op(a, b, gl)
    out.backward(grad)
    a32 = a.detach().float().requires_grad_()
    b32 = b.detach().float().requires_grad_()
    # TF32 for the fp32 reference: plain fp32 would take ~13 minutes for the gpu case list on
    # an H200; TF32's ~5e-4 relative error is far below bf16 rounding (SNR stays > 60 dB).
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        ref = grouped_gemm_ref(a32, b32, torch.tensor(lens), True, torch.float32)
        ref.backward(grad.float())
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    pairs = {"out": (out, ref), "da": (a.grad, a32.grad), "db": (b.grad, b32.grad)}
    snrs = {f"{k}_snr": compute_snr(r, o) for k, (o, r) in pairs.items()}
    gate = SNR_THRESHOLD_DB["fp8_e4m3" if fp8 else "bf16"]
    ok = all(s > gate for s in snrs.values())
    if not fp8:
        ok = ok and all(check_allclose(o, r, dtype) for o, r in pairs.values())
    a.grad = b.grad = None
    return ok, snrs


def resolved_backend(a, b, gl) -> str:
    from primus_turbo.pytorch.kernels.grouped_gemm.grouped_gemm_impl import GroupedGemmDispatcher
    from primus_turbo.pytorch.reference import group_offsets

    try:
        kw = dict(a=a, b=b, group_lens=gl, group_offs=group_offsets(gl), trans_b=True)
        return GroupedGemmDispatcher.resolve(**kw, out_dtype=a.dtype).name
    except Exception as e:
        return f"none ({type(e).__name__})"


def run_case(
    test_id: int,
    case: RaggedGroupedGemmCase,
    dtype: torch.dtype,
    args: argparse.Namespace,
    info: DeviceInfo,
) -> dict:
    g, m, n, k = case.g, case.m, case.n, case.k
    lens = case.group_lens()
    row: dict = {
        "TestID": test_id,
        "Case": case.label,
        "G": g,
        "M": m,
        "N": n,
        "K": k,
        "Min Group": min(lens),
        "Max Group": max(lens),
        "Empty Groups": sum(1 for x in lens if x == 0),
        "Dtype": str(dtype).replace("torch.", ""),
        "Backend": args.backend,
        "Resolved Backend": "",
        "Check": "ERROR",
    }
    row.update(dict.fromkeys(METRIC_COLUMNS, math.nan))
    device = info.device
    torch.manual_seed(test_id)
    try:
        a = torch.randn((m, k), dtype=dtype, device=device, requires_grad=True)
        b = (torch.randn((g, n, k), device=device) / math.sqrt(k)).to(dtype).requires_grad_()
        gl = torch.tensor(lens, dtype=torch.int64, device=device)
        grad = torch.randn((m, n), dtype=dtype, device=device)
        row["Resolved Backend"] = resolved_backend(a, b, gl)
        op = _ours(args, a, b)
        if not args.skip_check:
            ok, snrs = check_case(op, a, b, gl, lens, grad, dtype, args.fp8 != "none")
            row.update(snrs)
            row["Check"] = "PASS" if ok else "FAIL"
        else:
            row["Check"] = "SKIPPED"
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if args.kernels:
            ends = torch.cumsum(gl, 0).to(torch.int32)
            row.update(kernel_times(a, b, gl, grad, ends, args))
            print(
                "  kernels alone (ms, TRITON vs grouped_mm, ratio = peer/ours): "
                + " | ".join(
                    f"{x} {row[f'{x} ms']:.3f} vs {row[f'{x} grouped_mm ms']:.3f}"
                    f" x{row[f'{x} kernel ratio']:.3f}"
                    for x in ("fwd", "dgrad", "wgrad")
                )
            )
            if args.kernels_only:
                return row
        if args.fp8_kernels:
            row.update(fp8_kernel_times(a, b, gl, args))
            if args.kernels_only:
                return row
        ours = (lambda: op(a, b, gl), (a, b))
        ends = torch.cumsum(gl, 0).to(torch.int32)
        peers = {
            "grouped_mm": lambda ap, bp: _grouped_mm_peer(ap, bp, ends),
            "loop": lambda ap, bp: _loop_peer(ap, bp, lens),
        }
        if args.peers:
            peers = {k: v for k, v in peers.items() if k in args.peers}
        fwd_only = set()
        if args.fp8 != "none":
            peers.pop("loop", None)
            peers["turbo_bf16"] = lambda ap, bp: turbo.ops.grouped_gemm(ap, bp, gl, trans_b=True)
            if args.peers:
                peers = {k: v for k, v in peers.items() if k in args.peers}
            try:
                scaled = scaled_grouped_mm_peer(a, b, ends)
            except Exception as e:
                scaled = None
                print(f"  peer scaled_grouped_mm unavailable: {type(e).__name__}: {str(e)[:200]}")
            if scaled is not None and (not args.peers or "scaled_grouped_mm" in args.peers):
                peers["scaled_grouped_mm"] = scaled
                fwd_only.add("scaled_grouped_mm")
            prequant = "prequant" in (args.fp8_weights, args.fp8_act)
            if prequant and (not args.peers or "turbo_fp8" in args.peers):
                cfg8 = _fp8_config(args.fp8)  # the same op quantizing b in every call
                f8 = turbo.ops.grouped_gemm_fp8
                peers["turbo_fp8"] = lambda ap, bp: f8(ap, bp, gl, config=cfg8)
                fwd_only.add("turbo_fp8")
        timings, pair_ours = {}, {}
        for name, fn in peers.items():
            ap = a.detach().clone().requires_grad_()
            bp = b.detach().clone().requires_grad_()
            fwd = name in fwd_only or args.fwd_only
            modes = (Mode.FWD,) if fwd else (Mode.FWD, Mode.BWD)
            try:
                t, p = bench_pair(
                    ours,
                    (lambda fn=fn, ap=ap, bp=bp: fn(ap, bp), (ap, bp)),
                    grad,
                    modes=modes,
                    warmup=args.warmup_ms,
                    rep=args.rep_ms,
                    device=device,
                )
            except Exception as e:  # e.g. torch._grouped_mm absent or not for this device
                print(f"  peer {name} unavailable: {type(e).__name__}: {str(e)[:200]}")
                continue
            if Mode.BWD in t or args.fwd_only:
                timings.setdefault("ours", t)
            timings[name] = p
            pair_ours[name] = t  # the ratios vs this peer use ours from the SAME pairing
            print(f"  pairing with {name}: ours fwd {t[Mode.FWD].median_ms:.3f} ms, "
                  f"{name} fwd {p[Mode.FWD].median_ms:.3f} ms")  # fmt: skip
    except Exception as e:
        print(f"  ERROR: {type(e).__name__}: {e}")
        if os.environ.get("BENCH_TRACEBACK"):
            traceback.print_exc()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return row

    fwd_flops, bwd_flops = 2.0 * m * n * k, 4.0 * m * n * k

    def _tf(t) -> dict[str, float]:
        out = {"Forward": tflops(fwd_flops, t[Mode.FWD].median_ms)}
        if Mode.BWD in t:  # else a forward-only peer
            out["Backward"] = tflops(bwd_flops, t[Mode.BWD].median_ms)
            step_ms = t[Mode.FWD].median_ms + t[Mode.BWD].median_ms
            out["Step"] = tflops(fwd_flops + bwd_flops, step_ms)
        return out

    def _fill(prefix: str, t) -> None:
        for x, v in _tf(t).items():
            row[f"{prefix}{x} TFLOPS"] = v

    if "ours" in timings:
        t = timings["ours"]
        row["Forward Time (ms)"] = t[Mode.FWD].median_ms
        if Mode.BWD in t:
            row["Backward Time (ms)"] = t[Mode.BWD].median_ms
        _fill("", t)
    for name in PEERS:
        if name in timings:
            _fill(f"{name} ", timings[name])
            # ours from the pairing with THIS peer (session 8): each pairing runs in its own
            # clock / power regime (the loop peer's memory-bound backward, ~5x our step, most
            # likely lets the H200 clock up through the whole loop pairing: the loop forward
            # read 745 TFLOPS there vs 657 in the plans A/B of call 8.1, while ours came from
            # the grouped_mm pairing), so ours from another pairing biases the ratio
            own = _tf(pair_ours[name]) if name in pair_ours else {}
            for x in ("Forward", "Backward", "Step"):
                mine = own.get(x, row[f"{x} TFLOPS"])
                row[f"{x} Ratio {name}"] = ratio(mine, row[f"{name} {x} TFLOPS"])
    if args.fp8 != "none" and "turbo_bf16" in timings:
        bf16_ms = timings["turbo_bf16"][Mode.FWD].median_ms
        bnd = fp8_bounds(g, m, n, k, bf16_ms, args.hbm_tbps, args.fp8_peak_tflops)
        row["fp8 bound/call"], row["fp8 bound prequant"] = bnd["bound/call"], bnd["bound prequant"]
        best = min((row.get(f"{x} ms", math.nan) for x in ("ptr", "tma")), key=_nan_last)
        if best == best:  # --fp8-kernels: the measured fp8 GEMM instead of its roofline
            meas = fp8_bounds(g, m, n, k, bf16_ms, args.hbm_tbps, args.fp8_peak_tflops, best)
            row["fp8 bound/call meas gemm"] = meas["bound/call"]
            row["fp8 bound prequant meas gemm"] = meas["bound prequant"]
        print(
            f"  fp8 bounds vs our bf16 fwd {bf16_ms:.3f} ms ({args.hbm_tbps} TB/s, "
            f"{args.fp8_peak_tflops:.0f} fp8 TFLOPS): quant a >= {bnd['qa min ms']:.3f}, "
            f"quant b >= {bnd['qb min ms']:.3f}, fp8 GEMM >= {bnd['gemm min ms']:.3f} ms -> "
            f"x{bnd['bound/call']:.2f} quantizing b per call, x{bnd['bound prequant']:.2f} "
            f"b pre-quantized, x{bnd['bound prequant a+b']:.2f} a and b"
            + (
                f" | with the measured fp8 GEMM ({best:.3f} ms): "
                f"x{row['fp8 bound/call meas gemm']:.2f} / "
                f"x{row['fp8 bound prequant meas gemm']:.2f}"
                if best == best
                else ""
            )
        )
    return row


def _nan_last(x: float) -> float:
    return math.inf if x != x else x


def kernel_times(a, b, gl, grad, ends, args) -> dict[str, float]:
    """Each GEMM of one training step alone (no autograd, no dispatch): the TRITON kernels
    (forward ``a @ b[g]^T``, dgrad ``grad @ b[g]``, variable-K wgrad ``grad_g^T @ a_g``, each with
    its tuned plan) vs the same three ``torch._grouped_mm`` calls; ``{"<gemm> ms": ...,
    "<gemm> grouped_mm ms": ..., "<gemm> kernel ratio": peer / ours}``. This shows which of
    the three kernels holds the step back."""
    from harness import time_ms

    from primus_turbo.pytorch.reference import group_offsets
    from primus_turbo.triton.grouped_gemm.grouped_gemm_kernel import (
        grouped_gemm_triton,
        variable_k_triton,
    )

    a, b = a.detach(), b.detach()
    offs = group_offsets(gl)
    g = b.shape[0]
    gemms = {
        "fwd": (
            lambda: grouped_gemm_triton(a, b, offs, True),
            lambda: torch._grouped_mm(a, b.transpose(1, 2), offs=ends),
        ),
        "dgrad": (
            lambda: grouped_gemm_triton(grad, b, offs, False),
            lambda: torch._grouped_mm(grad, b, offs=ends),
        ),
        "wgrad": (
            lambda: variable_k_triton(grad, a, offs, g, a.dtype),
            lambda: torch._grouped_mm(grad.t(), a, offs=ends),
        ),
    }
    out = {}
    for name, (ours, peer) in gemms.items():
        ours()  # the config tuner's first call, outside the timing
        t_ours = time_ms(ours, args.warmup_ms, args.rep_ms).median_ms
        t_peer = time_ms(peer, args.warmup_ms, args.rep_ms).median_ms
        out[f"{name} ms"] = t_ours
        out[f"{name} grouped_mm ms"] = t_peer
        out[f"{name} kernel ratio"] = t_peer / t_ours
    return out


def _triton_plans() -> dict:
    from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel

    return dict(grouped_gemm_kernel._tuned)


def _tune_note(key) -> str:
    """`` (timed: plan ms, ...)``: the tuner's times of every candidate for ``key``."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel

    times = getattr(grouped_gemm_kernel, "_tune_times", {}).get(key)
    if not times:
        return ""
    ranked = sorted(times.items(), key=lambda kv: kv[1])
    return " (timed: " + ", ".join(f"{_plan_name(p)} {t:.3f}" for p, t in ranked) + ")"


def _plan_name(plan) -> str:
    if isinstance(plan, tuple):
        return f"{plan[0]} {plan[1].name}"
    return f"table {plan.name}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--backend", choices=BACKENDS, default="auto")
    p.add_argument(
        "--fp8",
        choices=FP8,
        nargs="?",
        const="rowwise",
        default="none",
        help="time grouped_gemm_fp8 with this scaling (bare --fp8: rowwise; default none = bf16)",
    )
    p.add_argument(
        "--fp8-weights",
        choices=("quant", "prequant"),
        default="quant",
        help="with --fp8: quant = the op quantizes the weights in every call (default); "
        "prequant = weights quantized once outside the timing (quantize_grouped_weight), as "
        "reused across micro-batches between optimizer steps; graph timing sees it",
    )
    p.add_argument(
        "--fp8-act",
        choices=("quant", "prequant"),
        default="quant",
        help="with --fp8: quant = the op quantizes the activations (default); prequant = "
        "quantized once outside the timing (the cost once fused upstream)",
    )
    p.add_argument(
        "--hbm-tbps",
        type=float,
        default=4.0,
        help="HBM bandwidth for the fp8 ratio bounds (default 4.0 TB/s: H200 copy ~3.6-4.1)",
    )
    p.add_argument(
        "--fp8-peak-tflops",
        type=float,
        default=1979.0,
        help="dense fp8 peak for the fp8 ratio bounds (default 1979: H200 spec)",
    )
    p.add_argument("--models", nargs="+", default=None, help="config.RAGGED_GROUPED_GEMM_SPECS")
    p.add_argument("--max-cases", type=int, default=None)
    p.add_argument(
        "--peers",
        nargs="+",
        choices=PEERS,
        default=None,
        help="time only these peers (default: all that apply; the loop peer is slow on G=128)",
    )
    p.add_argument("--skip-check", action="store_true", help="time only (no fp32 reference)")
    p.add_argument(
        "--fwd-only", action="store_true", help="time forwards only (ours and every peer)"
    )
    p.add_argument(
        "--kernels",
        action="store_true",
        help="also time the TRITON forward, dgrad and wgrad kernels alone vs the same three "
        "torch._grouped_mm calls (which kernel loses; bf16 only)",
    )
    p.add_argument(
        "--fp8-kernels",
        action="store_true",
        help="time the pieces of the rowwise fp8 forward alone: bf16 GEMM, both quantizations, "
        "fp8 GEMM through vendor / Triton pointer / Triton TMA (one process, any --fp8)",
    )
    p.add_argument(
        "--kernels-only",
        action="store_true",
        help="with --kernels: skip the op-level fwd/bwd timings (faster A/B of kernel variants)",
    )
    add_common_args(p)
    args = p.parse_args(argv)
    if args.models:
        args.models = [x for item in args.models for x in item.split(",") if x]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    profile, info = resolve_profile(args.profile)
    dtype = DTYPES[args.dtype]
    GlobalBackendManager.reset()
    if args.backend != "auto":
        GlobalBackendManager.set_grouped_gemm_backend(BackendType.parse(args.backend))
        # one setting for both precisions: the fp8 op shares the grouped_gemm family
    fp8_tag = "" if args.fp8 == "none" else f"_fp8{args.fp8}"
    if args.fp8 != "none" and args.fp8_weights == "prequant":
        fp8_tag += "_prequant"
    if args.fp8 != "none" and args.fp8_act == "prequant":
        fp8_tag += "_preact"
    print(info.banner())
    print(
        f"profile: {profile} | {args.dtype} fp8={args.fp8}"
        + (f" weights={args.fp8_weights} act={args.fp8_act}" if args.fp8 != "none" else "")
        + f" | backend {args.backend} | NT"
    )
    notice = cpu_notice(info)
    if notice:
        print(notice)
    results = Results(info)
    cases = ragged_grouped_gemm_cases(args.models, profile)[: args.max_cases]
    for test_id, case in shard(cases, args.num_shards, args.shard_id):
        print(f"[{test_id}/{len(cases)}] {case.label} G={case.g} M={case.m} N={case.n} K={case.k}")
        seen = set(_triton_plans())
        row = results.add(run_case(test_id, case, dtype, args, info))
        for key, plan in _triton_plans().items():  # what the Triton config tuner picked
            if key not in seen:
                what = f"{key[0]} (M~{key[1]}, {key[2]}x{key[3]})"
                print(f"  triton tuned {what}: {_plan_name(plan)}{_tune_note(key)}")
        print(
            f"  {row['Check']} ({row['Resolved Backend']}) fwd {row['Forward TFLOPS']:.1f} "
            f"step {row['Step TFLOPS']:.1f} TFLOPS | vs grouped_mm x"
            f"{row['Forward Ratio grouped_mm']:.3f} / step x{row['Step Ratio grouped_mm']:.3f}"
            f" | vs loop x{row['Forward Ratio loop']:.3f} / step x{row['Step Ratio loop']:.3f}"
            f" | vs turbo bf16 x{row['Forward Ratio turbo_bf16']:.3f}"
            + (
                f" | vs _scaled_grouped_mm (GEMM only) x"
                f"{row['Forward Ratio scaled_grouped_mm']:.3f}"
                if args.fp8 != "none"
                else ""
            )
            + (
                f" | vs fp8 quantizing in the op x{row['Forward Ratio turbo_fp8']:.3f}"
                if args.fp8 != "none" and "prequant" in (args.fp8_weights, args.fp8_act)
                else ""
            )
        )
    print()
    kcols = [f"{x} kernel ratio" for x in ("fwd", "dgrad", "wgrad")] if args.kernels else []
    if args.fp8 != "none":
        kcols += ["fp8 bound/call", "fp8 bound prequant"]
    if args.fp8_kernels:
        kcols += ["fp8 bound/call meas gemm", "fp8 bound prequant meas gemm"]
        kcols += [f"{x} ms" for x in FP8_KERNELS]
        kcols += ["fp8 fwd ratio bound", "fp8 fwd ratio bound cached w"]
        kcols += [f"fp8 {x} TFLOPS" for x in ("bf16", "vendor", "ptr", "tma")]
    print(results.markdown(TABLE_COLUMNS + kcols))
    ok = lambda r: r["Check"] in ("PASS", "SKIPPED")  # noqa: E731
    gm = {c: geomean(results.column(c, ok)) for c in METRIC_COLUMNS + kcols if "atio" in c}
    print(
        f"\nGeomean over {len(results.column('Check', ok))}/{len(results.rows)} rows: "
        f"turbo fwd {geomean(results.column('Forward TFLOPS', ok)):.4g} "
        f"step {geomean(results.column('Step TFLOPS', ok)):.4g} TFLOPS; "
        + ", ".join(f"{c} {v:.3f}" for c, v in gm.items())
    )
    if notice:
        print(notice)
    tag = f"{args.dtype}{fp8_tag}_{args.backend}"
    name = f"grouped_gemm_turbo_{tag}_{info.date_compact}_{info.gpu}.csv"
    path = results.write_csv(output_path(args.output, name, args.num_shards, args.shard_id))
    print(f"Results saved to {path}")
    return 0 if all(r["Check"] in ("PASS", "SKIPPED") for r in results.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
