"""FP8 rowwise grouped GEMM forward plans A/B in device time, interleaved (session 8).

The fp8 GEMM alone on pre-quantized operands (``a`` rowwise E4M3 + ``sa [M]``, ``b [G, N, K]``
per (expert, column) + ``sb [G, N]``, quantized once outside the timing), for each case of
``config.RAGGED_GROUPED_GEMM_SPECS`` (``--models``, ``--layers``), in ONE process:

* ``default``: ``grouped_gemm_fp8_tma`` as the op runs it (the config tuner's choice among
  the candidates ``PRIMUS_TURBO_GROUPED_GEMM_FP8_KERNEL`` selects; its first call, which
  tunes, is outside the timing);
* every plan of ``--plans`` forced (``variant:config``: ``f8tma`` / ``f8tmas`` session 7,
  ``f8s`` session 8, see ``grouped_gemm_fp8_tma``).

Timing: ``--rounds`` interleaved rounds, each timing every candidate once with the harness's
``time_ms`` (``--timing graph`` default: CUDA-graph replay, L2 flushed before each sample); a
candidate's figure is the median of its round medians. Each forced plan's output is compared
BITWISE with ``f8tma`` on the same tile ("same" column: ``f8s`` must be equal, exit status 1
otherwise).
Prints per candidate ms, TFLOPS and ``ref / ours`` where ``ref`` is the first plan of
``--plans`` (session 7's winner ``f8tma:m128n128k128g8w4s3`` by default).

    python benchmark/ops/training/bench_grouped_gemm_fp8_plans.py --models Qwen3-30B-A3B \\
        --plans f8tma:m128n128k128g8w4s3,f8s:m128n128k128g8w4s3 -o out.csv
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parents[1])]  # config.py, harness.py
if str(_HERE.parents[2]) not in sys.path:
    sys.path.append(str(_HERE.parents[2]))

from config import ragged_grouped_gemm_cases  # noqa: E402
from harness import set_timing, time_ms, use_bench_stream  # noqa: E402

DEFAULT_PLANS = (
    "f8tma:m128n128k128g8w4s3,f8s:m128n128k128g8w4s3,f8s:m128n256k128g8w8s3,f8s:m128n256k128g8w8s4"
)


def _plan(name: str, family):
    """``variant:config`` -> ``(variant, GemmConfig)`` among the fp8 tiles of ``family``."""
    from primus_turbo.triton.grouped_gemm import grouped_gemm_fp8_tma as mod

    variant, _, cfg_name = name.partition(":")
    cfgs = {c.name: c for c in mod.fp8_tma_configs(family)}
    kinds = ("f8tma", "f8tmas", *mod.PRE_VARIANTS)
    if variant not in kinds or cfg_name not in cfgs:
        raise ValueError(f"--plans: expected variant:config with variant in {kinds} and config "
                         f"in {sorted(cfgs)}, got {name!r}")  # fmt: skip
    return variant, cfgs[cfg_name]


def _operands(case, device):
    """Rowwise fp8 operands of one case (seeded), quantized once."""
    from primus_turbo.pytorch.core.low_precision import ScalingGranularity
    from primus_turbo.pytorch.ops.grouped_gemm_fp8 import _quant_experts, _quant_rows
    from primus_turbo.pytorch.reference import group_offsets

    torch.manual_seed(case.seed)
    lens = case.group_lens()
    gl = torch.tensor(lens, dtype=torch.int64, device=device)
    a = torch.randn(case.m, case.k, dtype=torch.bfloat16, device=device)
    b = torch.randn(case.g, case.n, case.k, dtype=torch.bfloat16, device=device) * 0.05
    f8, row = torch.float8_e4m3fn, ScalingGranularity.ROWWISE
    qa, sa = _quant_rows(a, f8, row)
    qb, sb = _quant_experts(b, f8, row)
    return qa, sa.reshape(-1), qb, sb, group_offsets(gl)


def _caller(mod, ops, out_dtype, cfg=None, variant="f8tma"):
    """``grouped_gemm_fp8_tma`` on ``ops`` (``cfg`` None: the tuner's choice)."""
    qa, sa, qb, sb, offs = ops
    return lambda: mod.grouped_gemm_fp8_tma(qa, qb, offs, sa, sb, out_dtype, cfg, variant)


def run(args) -> list[dict]:
    from primus_turbo.pytorch.core.platform import arch_family
    from primus_turbo.triton.grouped_gemm import grouped_gemm_fp8_tma as mod

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    family = arch_family(device)
    plans = [_plan(p, family) for p in args.plans.split(",") if p]
    bf = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = []
    cases = [c for c in ragged_grouped_gemm_cases(args.models, args.profile)
             if not args.layers or c.layer in args.layers]  # fmt: skip
    for case in cases:
        ops = _operands(case, device)
        flops = 2.0 * case.m * case.n * case.k
        cands = {"default": _caller(mod, ops, bf)}
        same = {"default": ""}
        for variant, cfg in plans:
            name = f"{variant}:{cfg.name}"
            fn = _caller(mod, ops, bf, cfg, variant)
            try:
                got = fn()
                ref = _caller(mod, ops, bf, cfg, "f8tma")()
                same[name] = str(bool(torch.equal(got, ref)))
                cands[name] = fn
            except Exception as e:  # e.g. out of shared memory for this tile
                print(f"  {case.label} {name}: unavailable: {type(e).__name__}: {str(e)[:160]}")
        cands["default"]()  # the tuner's first call, outside the timing
        ms = interleaved_medians(cands, args)
        ref_ms = ms[next(k for k in cands if k != "default")] if len(cands) > 1 else ms["default"]
        print(f"{case.label} G={case.g} M={case.m} N={case.n} K={case.k}")
        for key, t in sorted(ms.items(), key=lambda kv: kv[1]):
            tf = flops / t / 1e9
            row = {"Case": case.label, "Plan": key, "ms": t, "TFLOPS": tf,
                   "vs ref": ref_ms / t, "same as f8tma": same[key]}  # fmt: skip
            rows.append(row)
            print(f"  {key:28s} {t:8.4f} ms {tf:8.1f} TFLOPS  x{ref_ms / t:.3f}  "
                  f"bitwise={same[key] or '-'}")  # fmt: skip
    return rows


def interleaved_medians(cands: dict, args) -> dict[str, float]:
    """``{name: ms}``: each candidate's median over ``args.rounds`` rounds of ``time_ms``, the
    order reversed every other round (drift shared by all candidates)."""
    meds: dict[str, list[float]] = {k: [] for k in cands}
    for r in range(args.rounds):
        order = list(cands) if r % 2 == 0 else list(cands)[::-1]
        for key in order:
            meds[key].append(time_ms(cands[key], args.warmup_ms, args.rep_ms).median_ms)
    return {k: statistics.median(v) for k, v in meds.items()}


def ab_parser(doc: str) -> argparse.ArgumentParser:
    """The options of the interleaved FP8 grouped A/B benches (this one and
    bench_grouped_gemm_fp8_knobs.py): cases, rounds, timing, profile, CSV."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", nargs="+", default=None, help="config.RAGGED_GROUPED_GEMM_SPECS")
    p.add_argument("--layers", nargs="+", default=None, choices=("gate_up", "down"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timing", choices=("eager", "graph"), default="graph")
    p.add_argument("--warmup-ms", type=float, default=None)
    p.add_argument("--rep-ms", type=float, default=None)
    p.add_argument("--profile", choices=("gpu", "cpu"), default=None)
    p.add_argument("-o", "--output", default=None, help="CSV path")
    return p


def ab_run(args, run) -> list[dict]:
    """Resolve the profile and models, set the timing mode, ``run(args)``, write the CSV."""
    if args.profile is None:
        args.profile = "gpu" if torch.cuda.is_available() else "cpu"
    if args.models:
        args.models = [x for item in args.models for x in item.split(",") if x]
    set_timing(args.timing)
    if args.profile == "gpu" and args.timing == "graph":
        use_bench_stream()
    rows = run(args)
    if args.output and rows:
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with open(args.output, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        print(f"Results saved to {args.output}")
    return rows


def main(argv=None) -> int:
    p = ab_parser(__doc__)
    p.add_argument("--plans", default=DEFAULT_PLANS, help="comma-separated variant:config")
    rows = ab_run(p.parse_args(argv), run)
    return 0 if all(r["same as f8tma"] in ("", "True") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
