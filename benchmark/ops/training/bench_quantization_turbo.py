"""FP8 quantization benchmark: fused kernels vs copy bandwidth and torch.compile of the reference.

Per shape (activations ``[M, K]`` and weights ``[N, K]`` of ``config.dense_gemm_cases``, deduped)
and recipe, the effective bandwidth ("GB/s") counts the bytes a perfect kernel must move: read
the bf16 input once, write every fp8 output (the scales are negligible). Peers: ``x.clone()`` of
the bf16 input (copy bandwidth: 2 bytes read + 2 written per element; the ratio compares GB/s)
and the torch reference of the same recipe compiled with ``torch.compile`` (ratio = its time /
ours; one dynamic-shape compile per recipe keeps the GPU task short).

Honest accounting: dynamic TENSORWISE scaling needs the whole tensor's amax before the first
cast, so it reads the input twice (the second read partly from L2): 2+2+1 = 5 bytes moved per
element for 3 counted (6 for 4 with the dual copy). "Moved GB/s" counts what the algorithm moves
and "Bound" is the best "vs Copy" it can reach at copy's DRAM rate: 0.6 (0.67 dual) for
tensorwise, 1.0 for the single-pass recipes. ``tensorwise_delayed`` (``_dual``) is the one-pass
DELAYED recipe (``ops.Fp8DelayedScaler.quantize``: the cast with the scaler's current scale and
the amax recorded in the same pass; its first call, outside the timing, sets the scale), checked
and compared against the torch reference with that scale (``quantize_tensorwise_given_ref``).

    python benchmark/ops/training/bench_quantization_turbo.py
    PRIMUS_TURBO_QUANT_IMPL=v1 python ... --no-compile --max-shapes 3   # A/B of the kernels
    python ... --no-compile --variants "IMPL=v2" "IMPL=v3" "IMPL=v3 WARPS=16 MAXNREG=64"

``--variants``: each argument is a space-separated list of ``KEY=VALUE`` set as
``PRIMUS_TURBO_QUANT_<KEY>`` (the launchers read them per call) before that variant's rows;
one process, one copy timing per shape, a "Variant" column and one geomean line per variant.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parents[1])]
if str(_HERE.parents[2]) not in sys.path:
    sys.path.append(str(_HERE.parents[2]))

import torch  # noqa: E402
from config import dense_gemm_cases  # noqa: E402
from harness import (  # noqa: E402
    Results,
    add_common_args,
    cpu_notice,
    gbps,
    geomean,
    output_path,
    ratio,
    resolve_profile,
    time_ms,
)

from primus_turbo.pytorch.core.low_precision import ScalingGranularity, ScalingRecipe  # noqa: E402
from primus_turbo.pytorch.core.platform import fp8_dtypes  # noqa: E402
from primus_turbo.pytorch.ops.fp8_delayed import Fp8DelayedScaler  # noqa: E402
from primus_turbo.pytorch.ops.quantization import quantize_fp8, quantize_fp8_with_trans  # noqa: E402
from primus_turbo.pytorch.reference import fp8_delayed as dref  # noqa: E402
from primus_turbo.pytorch.reference import quantization as ref  # noqa: E402
from primus_turbo.triton.quantization.quant_launch import quant_impl_version  # noqa: E402

G = ScalingGranularity
COLUMNS = ["M", "K", "Variant", "Recipe", "Check", "Time (us)", "GB/s", "Moved GB/s", "Copy GB/s",
           "vs Copy", "Bound", "Compiled ref (us)", "vs Compiled"]  # fmt: skip
READS = {"tensorwise": 2, "tensorwise_dual": 2}  # input reads per element (others: 1)


def recipes(dtype):
    """name -> (ours, reference, fp8 bytes written per input element)."""
    blk2d = ScalingRecipe(use_2d_block=True)
    dual = quantize_fp8_with_trans
    sc, scd = Fp8DelayedScaler(), Fp8DelayedScaler()  # state of the delayed recipes
    return {
        "tensorwise": (lambda x: quantize_fp8(x, dtype, G.TENSORWISE),
                       lambda x: ref.quantize_tensorwise_ref(x, dtype), 1),
        "tensorwise_dual": (lambda x: quantize_fp8_with_trans(x, dtype, G.TENSORWISE),
                            lambda x: (ref.quantize_tensorwise_ref(x, dtype),
                                       ref.quantize_tensorwise_ref(x.t(), dtype)), 2),
        "tensorwise_delayed": (lambda x: sc.quantize(x, dtype),
                               lambda x: dref.quantize_tensorwise_given_ref(x, dtype, sc.scale),
                               1),
        "tensorwise_delayed_dual": (lambda x: scd.quantize(x, dtype, dual=True),
                                    lambda x: (dref.quantize_tensorwise_given_ref(x, dtype,
                                                                                  scd.scale),
                                               dref.quantize_tensorwise_given_ref(x.t(), dtype,
                                                                                  scd.scale)),
                                    2),
        "rowwise": (lambda x: quantize_fp8(x, dtype, G.ROWWISE, axis=-1),
                    lambda x: ref.quantize_rowwise_ref(x, dtype, -1), 1),
        "block1x128_dual": (lambda x: dual(x, dtype, G.BLOCKWISE, block_size=128),
                            lambda x: (ref.quantize_blockwise_ref(x, dtype, 128, -1),
                                       ref.quantize_blockwise_ref(x, dtype, 128, 0)), 2),
        "block128x128": (lambda x: quantize_fp8(x, dtype, G.BLOCKWISE, block_size=128,
                                                scaling_recipe=blk2d),
                         lambda x: ref.quantize_blockwise_ref(x, dtype, 128, None), 1),
        "mx": (lambda x: quantize_fp8(x, dtype, G.MX_BLOCKWISE, block_size=32),
               lambda x: ref.quantize_mx_ref(x, dtype), 1),
        "mx_dual": (lambda x: quantize_fp8_with_trans(x, dtype, G.MX_BLOCKWISE, block_size=32),
                    lambda x: (ref.quantize_mx_ref(x, dtype),
                               ref.quantize_mx_ref(x.t(), dtype)), 2),
    }  # fmt: skip


def _first(out):
    while isinstance(out, tuple):
        out = out[0]
    return out


def _parse_variant(text: str):
    """'IMPL=v3 WARPS=16' -> ('IMPL=v3 WARPS=16', {'PRIMUS_TURBO_QUANT_IMPL': 'v3', ...})."""
    env = {}
    for item in text.split():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--variants: expected KEY=VALUE items, got {item!r} in {text!r}")
        env["PRIMUS_TURBO_QUANT_" + key.upper()] = value
    return text.strip(), env


def _set_env(base: dict, extra: dict) -> None:
    """The PRIMUS_TURBO_QUANT_* variables of the process start, then ``extra`` on top."""
    for key in [k for k in os.environ if k.startswith("PRIMUS_TURBO_QUANT_")]:
        del os.environ[key]
    os.environ.update(base)
    os.environ.update(extra)


def _measure(args, dev, x, m, k, name, entry, ref_fn, copy_gbps) -> dict:
    """One row: check against the reference, time ours (and the compiled reference)."""
    ours, reference, out_bytes = entry
    row = {"M": m, "K": k, "Recipe": name, "Check": "ERROR"}
    try:
        q = _first(ours(x))
        q_ref = _first(reference(x))
        diff = (q.float() - q_ref.float()).abs() <= q_ref.float().abs() * 0.26 + 2.0**-9
        row["Check"] = "PASS" if bool(diff.all()) else "FAIL"
        t = time_ms(lambda f=ours, x=x: f(x), args.warmup_ms, args.rep_ms, device=dev)
        row["Time (us)"] = t.median_ms * 1e3
        reads = READS.get(name, 1)
        row["GB/s"] = gbps(m * k * (2.0 + out_bytes), t.median_ms)
        row["Moved GB/s"] = gbps(m * k * (2.0 * reads + out_bytes), t.median_ms)
        row["Copy GB/s"] = copy_gbps
        row["vs Copy"] = ratio(row["GB/s"], copy_gbps)
        row["Bound"] = (2.0 + out_bytes) / (2.0 * reads + out_bytes)
        row["Compiled ref (us)"] = math.nan
        if ref_fn is not None:
            tc = time_ms(lambda f=ref_fn, x=x: f(x), args.warmup_ms, args.rep_ms, device=dev)
            row["Compiled ref (us)"] = tc.median_ms * 1e3
        row["vs Compiled"] = ratio(row["Compiled ref (us)"], row["Time (us)"])
    except Exception as e:
        print(f"  ERROR {name} {m}x{k}: {type(e).__name__}: {e}")
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--recipes", nargs="+", default=None)
    p.add_argument("--max-shapes", type=int, default=8)
    p.add_argument("--shapes", nargs="+", default=None,
                   help="MxK input shapes instead of the model list, e.g. 4096x4096")  # fmt: skip
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    p.add_argument("--variants", nargs="+", default=None,
                   help="env settings to compare, e.g. 'IMPL=v2' 'IMPL=v3 WARPS=16'")  # fmt: skip
    add_common_args(p)
    args = p.parse_args(argv)
    profile, info = resolve_profile(args.profile)
    dev = info.device
    print(info.banner())
    notice = cpu_notice(info)
    shapes = []
    for c in dense_gemm_cases(None, 1, profile):
        for s in ((c.m, c.k), (c.n, c.k)):
            if s not in shapes and s[1] % 32 == 0 and s[0] % 32 == 0:
                shapes.append(s)
    shapes = shapes[: args.max_shapes]
    if args.shapes:
        shapes = [tuple(int(v) for v in t.lower().split("x")) for t in args.shapes]
    dtype = fp8_dtypes(dev)[0]
    table = recipes(dtype)
    names = args.recipes or list(table)
    results = Results(info)
    if info.is_gpu:  # clocks up before the first shape (its first rows read low otherwise)
        w = torch.empty(1 << 27, device=dev, dtype=torch.bfloat16)
        time_ms(lambda: w.clone(), 300.0, 100.0, device=dev)
        del w
    variants = [_parse_variant(v) for v in (args.variants or [""])]
    base_env = {k: v for k, v in os.environ.items() if k.startswith("PRIMUS_TURBO_QUANT_")}
    compiled = {}
    if not args.no_compile and info.is_gpu:
        compiled = {n: torch.compile(table[n][1], dynamic=True) for n in names}
    for m, k in shapes:
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        copy_t = time_ms(lambda x=x: x.clone(), args.warmup_ms, args.rep_ms, device=dev)
        copy_gbps = gbps(4.0 * m * k, copy_t.median_ms)
        for vi, (vname, venv) in enumerate(variants):
            _set_env(base_env, venv)
            if vi == 0 or len(variants) > 1:
                print(f"quantization impl: {quant_impl_version()} (PRIMUS_TURBO_QUANT_IMPL)"
                      f"{' variant ' + vname if vname else ''}")  # fmt: skip
            for name in names:
                ref_fn = compiled.get(name) if vi == 0 else None
                row = _measure(args, dev, x, m, k, name, table[name], ref_fn, copy_gbps)
                row["Variant"] = vname or quant_impl_version()
                results.add(row)
                print(f"{m}x{k} {row['Variant']} {name}: {row['Check']} "
                      f"{row.get('GB/s', math.nan):.0f} GB/s "
                      f"(copy {copy_gbps:.0f}) x{row.get('vs Copy', math.nan):.3f} of copy "
                      f"(bound {row.get('Bound', math.nan):.2f}), "
                      f"x{row.get('vs Compiled', math.nan):.3f} vs compiled ref")  # fmt: skip
    _set_env(base_env, {})
    print(results.markdown(COLUMNS))
    for vname in dict.fromkeys(r["Variant"] for r in results.rows):
        for name in names:
            sel = lambda r, n=name, v=vname: (  # noqa: E731
                r["Recipe"] == n and r["Variant"] == v and r["Check"] == "PASS"
            )
            tag = f"{vname} {name}" if len(variants) > 1 else name
            g_copy = geomean(results.column("vs Copy", sel))
            g_comp = geomean(results.column("vs Compiled", sel))
            print(f"Geomean {tag}: x{g_copy:.3f} of copy, x{g_comp:.3f} vs compiled ref")
    if notice:
        print(notice)
    path = results.write_csv(
        output_path(args.output, f"quantization_turbo_{info.date_compact}_{info.gpu}.csv")
    )
    print(f"Results saved to {path}")
    return 0 if all(r["Check"] == "PASS" for r in results.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
