"""FP8 GEMM benchmark: the scaled GEMM against ``torch._scaled_mm``, and FP8 Linear fwd+bwd.

``--suite gemm`` (shapes of ``config.dense_gemm_cases``, NT layout): both sides multiply the same
pre-quantized K-major operands (quantization is timed separately by
bench_quantization_turbo.py). For each granularity the turbo side is the library's default
dispatch (``--backend auto``) or a pinned backend; the peer is ``torch._scaled_mm`` with the
matching scales (tensorwise, rowwise, blockwise 1x128 x 128x128; blockwise needs a torch that
supports it: the row then says why it is missing). Check: SNR of the product against the fp32
product of the original bf16 inputs (> 25 dB for E4M3).

``--suite linear``: ``Float8Linear`` forward+backward including every quantization, against the
bf16 ``modules.Linear`` of the same size; combined TFLOPS = 6MNK / (fwd + bwd time).
``--granularity tensorwise_delayed`` (linear suite only): tensorwise with
``strategy=DELAYED`` (one-pass quantization from the amax history; the checked first step
initialises the scales, the timed steps run the steady state incl. the history updates).

    python benchmark/ops/training/bench_gemm_fp8_turbo.py --granularity tensorwise rowwise
    python benchmark/ops/training/bench_gemm_fp8_turbo.py --granularity blockwise --backend TRITON
    python benchmark/ops/training/bench_gemm_fp8_turbo.py --suite linear
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import traceback
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parents[1])]
if str(_HERE.parents[2]) not in sys.path:
    sys.path.append(str(_HERE.parents[2]))

import torch  # noqa: E402
from config import dense_gemm_cases  # noqa: E402
from harness import (  # noqa: E402
    Mode,
    Results,
    add_common_args,
    bench_pair,
    compute_snr,
    cpu_notice,
    geomean,
    output_path,
    ratio,
    resolve_profile,
    shard,
    tflops,
)

from primus_turbo.pytorch.core import BackendType, GlobalBackendManager  # noqa: E402
from primus_turbo.pytorch.core.backend import BackendChoice  # noqa: E402
from primus_turbo.pytorch.core.low_precision import (  # noqa: E402
    Float8QuantConfig,
    ScalingGranularity,
    ScalingStrategy,
)
from primus_turbo.pytorch.core.platform import fp8_dtypes  # noqa: E402
from primus_turbo.pytorch.kernels.gemm.gemm_fp8_impl import (  # noqa: E402
    GemmFp8Dispatcher,
    _blockwise_probe,
    _blockwise_scales_for_scaled_mm,
    gemm_fp8_impl,
)
from primus_turbo.pytorch.modules import Float8Linear, Linear  # noqa: E402
from primus_turbo.pytorch.ops.gemm_fp8 import _quant_dual  # noqa: E402

G = ScalingGranularity
GRANS = {"tensorwise": G.TENSORWISE, "rowwise": G.ROWWISE, "blockwise": G.BLOCKWISE}
LINEAR_ONLY = ("tensorwise_delayed",)  # --suite linear recipes that are no GEMM granularity
BACKENDS = ("auto", "HIPBLASLT", "TRITON", "TORCH")
GEMM_COLUMNS = ["Case", "Layer", "M", "N", "K", "Granularity", "Resolved Backend", "Config",
                "Check", "TFLOPS", "Peer TFLOPS", "Ratio", "snr", "Note"]  # fmt: skip
LINEAR_COLUMNS = ["M", "N", "K", "Recipe", "Check", "Step TFLOPS", "bf16 Step TFLOPS",
                  "Ratio", "out_snr", "dx_snr", "dw_snr", "Note"]  # fmt: skip


def _peer(qa, qb, g: ScalingGranularity):
    """``torch._scaled_mm`` on the same operands, or ``(None, reason)``."""
    (a, sa, ga), (b, sb, gb) = qa, qb
    if a.device.type != "cuda":
        return None, "torch._scaled_mm needs a GPU"
    if g == G.TENSORWISE:
        return (lambda: torch._scaled_mm(a, b.t(), sa, sb, out_dtype=torch.bfloat16)), ""
    if g == G.ROWWISE:
        sa2, sb2 = sa.reshape(-1, 1).contiguous(), sb.reshape(1, -1).contiguous()
        return (lambda: torch._scaled_mm(a, b.t(), sa2, sb2, out_dtype=torch.bfloat16)), ""
    ok, reason = _blockwise_probe(a.device.index or 0)
    if not ok:
        return None, reason
    # scale_a (M, K/128) strides (1, M); scale_b.t() (N/128, K/128) row-major: the layouts of
    # torch's is_blockwise_1x128_scaling / is_blockwise_128x128_scaling (Blas.cpp), see
    # _blockwise_scales_for_scaled_mm; the earlier (K/128, N/128) row-major scale_b was refused
    # with "Invalid scaling configuration" on the H200 (torch 2.11.0+cu130).
    s_a, s_b = _blockwise_scales_for_scaled_mm(sa, sb, ga, gb)
    return (lambda: torch._scaled_mm(a, b.t(), s_a, s_b, out_dtype=torch.bfloat16)), ""


def run_gemm_case(test_id, case, g, args, info) -> dict:
    m, n, k = case.m, case.n, case.k
    row = {"TestID": test_id, "Case": case.case, "Layer": case.layer, "M": m, "N": n, "K": k,
           "Granularity": g.name, "Backend": args.backend, "Resolved Backend": "", "Config": "",
           "Check": "ERROR", "TFLOPS": math.nan, "Peer TFLOPS": math.nan, "Ratio": math.nan,
           "snr": math.nan, "Note": ""}  # fmt: skip
    dev = info.device
    torch.manual_seed(test_id)
    try:
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        e4m3 = fp8_dtypes(dev)[0]
        qa, _ = _quant_dual(a, e4m3, g)
        qb, _ = _quant_dual(w, e4m3, g, two_d=g == G.BLOCKWISE)
        user = None if args.backend == "auto" else BackendChoice(BackendType.parse(args.backend))
        kw = dict(a=qa[0], b=qb[0], sa=qa[1], sb=qb[1], granularity=g.value, sa_group=qa[2],
                  sb_group=qb[2], out_dtype=torch.bfloat16)  # fmt: skip
        row["Resolved Backend"] = GemmFp8Dispatcher.resolve(user, **kw).name

        names = ("a", "b", "sa", "sb", "granularity", "sa_group", "sb_group", "out_dtype")
        pos = [kw[x] for x in names]

        def ours():
            return gemm_fp8_impl(*pos, user)

        out = ours()
        if row["Resolved Backend"] == "TRITON" and g != G.MX_BLOCKWISE:
            from primus_turbo.triton.gemm import gemm_fp8_kernel

            cfg = gemm_fp8_kernel.last_config  # the tuned (or heuristic) tile of this shape
            row["Config"] = "" if cfg is None else f"{cfg.name}_cu{cfg.programs_per_cu}"
        ref = a.float() @ w.float().t()
        row["snr"] = compute_snr(ref, out)
        row["Check"] = "PASS" if row["snr"] > 25 else "FAIL"
        peer, note = _peer(qa, qb, g)
        row["Note"] = note
        if peer is None:
            peer = ours  # timing the op against itself keeps the row; the ratio is blanked
        t, p = bench_pair((ours, ()), (peer, ()), None, modes=(Mode.FWD,),
                          warmup=args.warmup_ms, rep=args.rep_ms, device=dev)  # fmt: skip
        flops = 2.0 * m * n * k
        row["TFLOPS"] = tflops(flops, t[Mode.FWD].median_ms)
        if not note:
            row["Peer TFLOPS"] = tflops(flops, p[Mode.FWD].median_ms)
            row["Ratio"] = ratio(row["TFLOPS"], row["Peer TFLOPS"])
        del out, ref
    except Exception as e:
        print(f"  ERROR: {type(e).__name__}: {e}")
        row["Note"] = f"{type(e).__name__}: {str(e)[:120]}"
        if os.environ.get("BENCH_TRACEBACK"):
            traceback.print_exc()
    return row


def _linear_backends(x, w, cfg) -> str:
    """Which backend the default dispatch gives each GEMM of a Float8Linear step."""
    g = cfg.granularity
    dt = fp8_dtypes(x.device)[0]
    qx, qx_t = _quant_dual(x.detach(), dt, g)
    qw, qw_t = _quant_dual(w.detach(), dt, g, two_d=g == G.BLOCKWISE)
    qg, qg_t = _quant_dual(torch.randn(x.shape[0], w.shape[0], device=x.device), dt, g)
    pairs = {"fwd": (qx, qw), "dgrad": (qg, qw_t), "wgrad": (qg_t, qx_t)}
    out = []
    for name, (p, q) in pairs.items():
        kw = dict(a=p[0], b=q[0], sa=p[1], sb=q[1], granularity=g.value, sa_group=p[2],
                  sb_group=q[2], out_dtype=x.dtype)  # fmt: skip
        out.append(f"{name} {GemmFp8Dispatcher.resolve(None, **kw).name}")
    return ", ".join(out)


def run_linear(args, info, results: Results) -> None:
    dev = info.device
    m = n = k = args.linear_size if info.is_gpu else 256
    recipes = {
        "tensorwise": Float8QuantConfig(),
        "rowwise": Float8QuantConfig(granularity=G.ROWWISE),
        "blockwise": Float8QuantConfig(granularity=G.BLOCKWISE, block_size=128),
        "tensorwise_delayed": Float8QuantConfig(strategy=ScalingStrategy.DELAYED),
    }
    for name in args.granularity:
        cfg = recipes[name]
        row = {"M": m, "N": n, "K": k, "Recipe": name, "Check": "ERROR", "Note": ""}
        try:
            torch.manual_seed(0)
            base = Linear(k, n, bias=False, device=dev, dtype=torch.bfloat16)
            f8 = Float8Linear(k, n, bias=False, config=cfg, device=dev, dtype=torch.bfloat16)
            with torch.no_grad():
                f8.weight.copy_(base.weight)
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16, requires_grad=True)
            x2 = x.detach().clone().requires_grad_()
            grad = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
            y8, yb = f8(x), base(x2)
            y8.backward(grad)
            yb.backward(grad)
            row["out_snr"] = compute_snr(yb, y8)
            row["dx_snr"] = compute_snr(x2.grad, x.grad)
            row["dw_snr"] = compute_snr(base.weight.grad, f8.weight.grad)
            ok = min(row["out_snr"], row["dx_snr"], row["dw_snr"]) > 20
            row["Check"] = "PASS" if ok else "FAIL"
            try:
                row["Note"] = _linear_backends(x, f8.weight, cfg)
            except Exception as e:  # informational only
                row["Note"] = f"backends unknown ({type(e).__name__})"
            ours = (lambda f=f8, v=x: f(v), (x, f8.weight))
            peer = (lambda f=base, v=x2: f(v), (x2, base.weight))
            t, p = bench_pair(ours, peer, grad, warmup=args.warmup_ms, rep=args.rep_ms, device=dev)
            flops = 6.0 * m * n * k
            row["Step TFLOPS"] = tflops(flops, t[Mode.FWD].median_ms + t[Mode.BWD].median_ms)
            row["bf16 Step TFLOPS"] = tflops(flops, p[Mode.FWD].median_ms + p[Mode.BWD].median_ms)
            row["Ratio"] = ratio(row["Step TFLOPS"], row["bf16 Step TFLOPS"])
        except Exception as e:
            print(f"  ERROR: {type(e).__name__}: {e}")
            row["Note"] = f"{type(e).__name__}: {str(e)[:120]}"
        results.add(row)
        print(f"  Float8Linear {name}: {row['Check']} step {row.get('Step TFLOPS', math.nan):.1f} "
              f"TFLOPS vs bf16 {row.get('bf16 Step TFLOPS', math.nan):.1f} "
              f"-> x{row.get('Ratio', math.nan):.3f} ({row['Note']})")  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--suite", choices=("gemm", "linear"), default="gemm")
    p.add_argument("--granularity", nargs="+", choices=sorted(GRANS) + list(LINEAR_ONLY),
                   default=["tensorwise", "rowwise", "blockwise"])  # fmt: skip
    p.add_argument("--backend", choices=BACKENDS, default="auto")
    p.add_argument("--models", nargs="+", default=None)
    p.add_argument("--mbs", type=int, default=1)
    p.add_argument("--max-cases", type=int, default=None)
    p.add_argument("--linear-size", type=int, default=8192)
    add_common_args(p)
    args = p.parse_args(argv)
    profile, info = resolve_profile(args.profile)
    GlobalBackendManager.reset()
    print(info.banner())
    print(f"profile: {profile} | suite {args.suite} | {args.granularity} | backend {args.backend}")
    notice = cpu_notice(info)
    if notice:
        print(notice)
    results = Results(info)
    tag = f"{args.suite}_{'-'.join(args.granularity)}_{args.backend}"
    if args.suite == "linear":
        run_linear(args, info, results)
        print(results.markdown(LINEAR_COLUMNS))
        ok = lambda r: r["Check"] == "PASS"  # noqa: E731
        print(f"\nGeomean Float8Linear step ratio vs bf16 Linear: "
              f"{geomean(results.column('Ratio', ok)):.3f}")  # fmt: skip
    else:
        args.granularity = [g for g in args.granularity if g in GRANS]
        cases = dense_gemm_cases(args.models, args.mbs, profile)[: args.max_cases]
        for test_id, case in shard(cases, args.num_shards, args.shard_id):
            for name in args.granularity:
                g = GRANS[name]
                print(f"[{test_id}/{len(cases)}] {case.label} M={case.m} N={case.n} K={case.k} "
                      f"{name}")  # fmt: skip
                row = results.add(run_gemm_case(test_id, case, g, args, info))
                print(f"  {row['Check']} ({row['Resolved Backend']}) {row['TFLOPS']:.1f} TFLOPS "
                      f"vs torch._scaled_mm {row['Peer TFLOPS']:.1f} -> x{row['Ratio']:.3f} "
                      f"snr {row['snr']:.1f} {row['Note']}")  # fmt: skip
        print()
        print(results.markdown(GEMM_COLUMNS))
        for name in args.granularity:
            gname = GRANS[name].name
            sel = lambda r, g=gname: r["Check"] == "PASS" and r["Granularity"] == g  # noqa: E731
            tf, rt = results.column("TFLOPS", sel), results.column("Ratio", sel)
            print(f"Geomean {name}: turbo {geomean(tf):.4g} TFLOPS, "
                  f"ratio vs torch._scaled_mm {geomean(rt):.3f}")  # fmt: skip
    if notice:
        print(notice)
    name = f"gemm_fp8_turbo_{tag}_{info.date_compact}_{info.gpu}.csv"
    path = results.write_csv(output_path(args.output, name, args.num_shards, args.shard_id))
    print(f"Results saved to {path}")
    return 0 if all(r["Check"] == "PASS" for r in results.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
