"""Grouped GEMM dgrad plans, each timed three ways (session 6 diagnosis).

The TRITON dgrad ``grad @ b[g]`` (``grouped_gemm_triton(grad, b, offs, False)``: NN, ``b``
``[G, N, K]`` read as ``[G, K', N']`` rows with the output columns contiguous) exactly as
``bench_grouped_gemm_turbo.kernel_times`` calls it, once per plan (forced through
``PRIMUS_TURBO_GROUPED_GEMM_DGRAD_CONFIG``, so nothing is tuned), and ``torch._grouped_mm``:

* ``graph``: the harness (``time_ms``: CUDA-graph replay, L2 flushed before each sample, the
  median; what the op benchmark reports);
* ``eager``: ``do_bench`` (L2 flushed, no graph);
* ``b2b``: the config tuner's way (``grouped_gemm_tune.time_rounds``: best of 3 rounds, each the
  mean of back-to-back launches, no flush);
* ``b2b_long``: one round of 50 back-to-back launches (~300 ms of sustained load: if this is
  near ``graph`` and far from ``b2b``, clocks under sustained load explain the gap, not the
  graph or the L2 flush).

The peer is timed before and after the plans (clock / power drift shows as a difference). A
plan's output is checked against the peer's (relative max error). One line per plan with the
ratio peer / ours for each timing."""

from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parents[1])]  # config.py, harness.py
if str(_HERE.parents[2]) not in sys.path:
    sys.path.append(str(_HERE.parents[2]))

from config import ragged_grouped_gemm_cases  # noqa: E402
from harness import set_timing, time_ms  # noqa: E402

DEFAULT_PLANS = (
    "flat:m128n256k64g8w8s3,tma:m128n256k64g8w8s4,tma:m128n256k64g8w8s3,"
    "tman:m128n256k64g8w8s3,table:m128n256k64g8w8s3"
)


def _b2b_ms(fn, rounds: int = 3, budget_ms: float = 25.0) -> float:
    from primus_turbo.triton.grouped_gemm.grouped_gemm_tune import time_rounds

    return time_rounds(["x"], lambda _: fn(), rounds, budget_ms)["x"]


def _times(fn, args) -> dict[str, float]:
    out = {}
    for mode in ("graph", "eager"):
        set_timing(mode)
        out[mode] = time_ms(fn, args.warmup_ms, args.rep_ms).median_ms
    out["b2b"] = _b2b_ms(fn)
    out["b2b_long"] = _b2b_ms(fn, rounds=1, budget_ms=300.0)  # 50 launches: sustained load
    return out


def _force(plan: str) -> None:
    from primus_turbo.triton.grouped_gemm import grouped_gemm_configs as gc
    from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel as gk

    os.environ[gc.DGRAD_CONFIG_VAR] = plan
    gc.config_filter.cache_clear()
    gk._tuned.clear()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", nargs="*", default=["DeepSeek-V3"])
    p.add_argument("--layers", nargs="*", default=["gate_up"])
    p.add_argument("--plans", default=DEFAULT_PLANS, help="comma list of variant:config")
    p.add_argument("--warmup-ms", type=float, default=50.0)
    p.add_argument("--rep-ms", type=float, default=200.0)
    p.add_argument("-o", "--output", default=None, help="CSV path")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to time")
        return 0
    from primus_turbo.pytorch.reference import group_offsets
    from primus_turbo.triton.grouped_gemm.grouped_gemm_kernel import grouped_gemm_triton

    dev = torch.device("cuda")
    rows = []
    cases = [c for c in ragged_grouped_gemm_cases(args.models) if c.layer in args.layers]
    for test_id, case in enumerate(cases, 1):
        torch.manual_seed(test_id)
        g, m, n, k = case.g, case.m, case.n, case.k
        b = (torch.randn((g, n, k), device=dev) / k**0.5).to(torch.bfloat16)
        grad = torch.randn((m, n), dtype=torch.bfloat16, device=dev)
        gl = torch.tensor(case.group_lens(), dtype=torch.int64, device=dev)
        offs, ends = group_offsets(gl), torch.cumsum(gl, 0).to(torch.int32)
        print(f"{case.label} G={g} M={m}: dgrad [{m}, {n}] @ [{n}, {k}] per group (NN)")

        def peer(grad=grad, b=b, ends=ends):
            return torch._grouped_mm(grad, b, offs=ends)

        ref = peer().float()
        scale = ref.abs().max().item() or 1.0
        before = _times(peer, args)
        per_plan = {}
        for plan in args.plans.split(","):
            _force(plan)

            def ours(grad=grad, b=b, offs=offs):
                return grouped_gemm_triton(grad, b, offs, False)

            try:
                err = (ours().float() - ref).abs().max().item() / scale
                per_plan[plan] = (_times(ours, args), err)
            except Exception as e:  # noqa: BLE001 -- report and go on with the next plan
                print(f"  {plan}: FAILED {type(e).__name__}: {str(e)[:200]}")
        after = _times(peer, args)
        print(
            "  grouped_mm ms (before / after): "
            + " | ".join(f"{x} {before[x]:.3f} / {after[x]:.3f}" for x in before)
        )
        for plan, (t, err) in per_plan.items():
            peer_t = {x: (before[x] + after[x]) / 2 for x in t}
            ratios = " | ".join(f"{x} {t[x]:.3f} ms x{peer_t[x] / t[x]:.3f}" for x in t)
            print(f"  {plan:28s} {ratios} | rel err {err:.1e}")
            rows.append({"case": case.label, "plan": plan, "rel_err": err,
                         **{f"{x} ms": t[x] for x in t},
                         **{f"{x} ratio": peer_t[x] / t[x] for x in t}})  # fmt: skip
    if args.output and rows:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        with open(args.output, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        print(f"Results saved to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
