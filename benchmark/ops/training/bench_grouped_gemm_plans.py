"""Grouped GEMM kernel plans A/B in device time, interleaved (session 8).

For each case and GEMM of a training step (``fwd`` = ``a @ b[g]^T``, NT; ``dgrad`` =
``grad @ b[g]``, NN; ``wgrad`` = ``grad_g^T @ a_g``, variable K), times in ONE process:

* ``default``: ``grouped_gemm_triton`` / ``variable_k_triton`` as the op runs them (the config
  tuner's choice; its first call, which tunes, is outside the timing);
* every plan of ``--plans`` forced as the only candidate (``variant:config``, e.g.
  ``tma:m128n256k64g16w8s3``; ``--vk-plans`` for the wgrad, e.g. ``tmavs:m256n128k64g8w8s4``);
* the peers ``grouped_mm`` (``torch._grouped_mm``) and ``loop`` (one ``torch.matmul`` per
  expert with the group sizes known on the host, plus ``torch.cat``: what a plain PyTorch MoE
  layer runs).

Timing: ``--rounds`` interleaved rounds, each timing every candidate once with the harness's
``time_ms`` (``--timing graph`` by default: CUDA-graph replay, L2 flushed before each sample);
a candidate's figure is the median of its round medians. Interleaving spreads clock and
thermal drift (5-15 % on the H200 under sustained GEMM load, session 6) over all candidates
instead of charging it to the last ones. Each forced plan's output is checked against the
default's (relative max error). Prints per candidate the ms, TFLOPS and the ratios
``grouped_mm / ours``, ``loop / ours``, ``default / ours``; ``--b2b`` adds the config tuner's
timing (back-to-back launches, no flush) of every candidate.

    python benchmark/ops/training/bench_grouped_gemm_plans.py --models DeepSeek-V3 \\
        --gemms wgrad --vk-plans tmavs:m256n128k64g8w8s4,tmavs:m128n256k64g16w8s4 -o out.csv
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
from harness import set_timing, time_ms  # noqa: E402

GEMMS = ("fwd", "dgrad", "wgrad")


def _plan(name: str):
    """``variant:config`` -> ``(variant, GemmConfig)`` from every Hopper plan we have."""
    from primus_turbo.pytorch.core.platform import ArchFamily
    from primus_turbo.triton.grouped_gemm import grouped_gemm_configs as gc

    variant, _, cfg_name = name.partition(":")
    fams = (ArchFamily.HOPPER, ArchFamily.CPU)
    cfgs = {c.name: c for f in fams
            for c in (*gc.grouped_gemm_configs(f), *gc.tma_configs(f, wgrad=True))}  # fmt: skip
    if not cfg_name or cfg_name not in cfgs:
        raise ValueError(f"--plans: expected variant:config with config in {sorted(cfgs)}, got "
                         f"{name!r}")  # fmt: skip
    return variant, cfgs[cfg_name]


class _Forced:
    """Within the block, the TRITON grouped GEMM runs ``plan`` only (fwd/dgrad or wgrad)."""

    def __init__(self, plan, wgrad: bool):
        self.plan, self.wgrad = plan, wgrad

    def __enter__(self):
        from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel as gk

        names = ("forward_plans", "kernel_variant", "variable_k_plans", "variable_k_variant")
        self.saved = {n: getattr(gk, n) for n in names}
        if self.plan is not None:
            if self.wgrad:
                gk.variable_k_variant = lambda: "tune"
                gk.variable_k_plans = lambda *a, **k: [self.plan]
            else:
                gk.kernel_variant = lambda: "tune"
                gk.forward_plans = lambda *a, **k: [self.plan]
        return self

    def __exit__(self, *exc):
        from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel as gk

        for n, f in self.saved.items():
            setattr(gk, n, f)
        return False


def _gemm_fns(gemm, a, b, grad, offs, ends, lens):
    """``(ours, grouped_mm, loop)`` callables of one GEMM (ours honours ``_Forced``)."""
    from primus_turbo.triton.grouped_gemm.grouped_gemm_kernel import (
        grouped_gemm_triton,
        variable_k_triton,
    )

    starts = [0]
    for n in lens:
        starts.append(starts[-1] + n)
    g = b.shape[0]
    if gemm == "fwd":
        return (
            lambda: grouped_gemm_triton(a, b, offs, True),
            lambda: torch._grouped_mm(a, b.transpose(1, 2), offs=ends),
            lambda: torch.cat([a[starts[i] : starts[i + 1]] @ b[i].t() for i in range(g)]),
        )
    if gemm == "dgrad":
        return (
            lambda: grouped_gemm_triton(grad, b, offs, False),
            lambda: torch._grouped_mm(grad, b, offs=ends),
            lambda: torch.cat([grad[starts[i] : starts[i + 1]] @ b[i] for i in range(g)]),
        )
    return (
        lambda: variable_k_triton(grad, a, offs, g, a.dtype),
        lambda: torch._grouped_mm(grad.t(), a, offs=ends),
        lambda: torch.stack(
            [grad[starts[i] : starts[i + 1]].t() @ a[starts[i] : starts[i + 1]] for i in range(g)]
        ),
    )


def _b2b(alive, cands, wgrad) -> dict[str, float]:
    """Every candidate timed as the config tuner times plans (``time_rounds``: 3 interleaved
    rounds of back-to-back launches, no L2 flush, no graph): where its ranking differs from
    the graph timing's, the tuner picks a plan the benchmark does not confirm."""
    from primus_turbo.triton.grouped_gemm.grouped_gemm_tune import time_rounds

    def launch(name):
        plan, fn = cands[name]
        with _Forced(plan, wgrad):
            fn()

    return time_rounds(list(alive), launch)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", nargs="*", default=["DeepSeek-V3"])
    p.add_argument("--layers", nargs="*", default=["gate_up", "down"])
    p.add_argument("--gemms", nargs="*", default=["fwd"], choices=GEMMS)
    p.add_argument("--plans", default="", help="fwd/dgrad plans, comma list of variant:config")
    p.add_argument("--vk-plans", default="", help="wgrad plans, comma list of variant:config")
    p.add_argument("--peers", nargs="*", default=["grouped_mm", "loop"],
                   choices=("grouped_mm", "loop"))  # fmt: skip
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--warmup-ms", type=float, default=20.0)
    p.add_argument("--rep-ms", type=float, default=60.0)
    p.add_argument("--timing", default="graph", choices=("graph", "eager"))
    p.add_argument("--b2b", action="store_true", help="also the config tuner's timing")
    p.add_argument("-o", "--output", default=None, help="CSV path")
    args = p.parse_args(argv)
    gpu = torch.cuda.is_available()
    if not gpu and os.environ.get("TRITON_INTERPRET") != "1":
        print("no CUDA device: nothing to time (TRITON_INTERPRET=1: a tiny CPU smoke run)")
        return 0
    from primus_turbo.pytorch.reference import group_offsets

    set_timing(args.timing)
    plans = [_plan(x) for x in args.plans.split(",") if x.strip()]
    vk_plans = [_plan(x) for x in args.vk_plans.split(",") if x.strip()]
    dev = torch.device("cuda" if gpu else "cpu")
    if not gpu:  # smoke run: tiny shapes, interpreter tiles, no vendor peer
        args.peers = [x for x in args.peers if x != "grouped_mm"]
    rows = []
    cases = ragged_grouped_gemm_cases(args.models, profile="gpu" if gpu else "cpu")
    cases = [c for c in cases if c.layer in args.layers]
    for test_id, case in enumerate(cases, 1):
        torch.manual_seed(test_id)
        g, m, n, k = case.g, case.m, case.n, case.k
        lens = case.group_lens()
        a = torch.randn((m, k), dtype=torch.bfloat16, device=dev)
        b = (torch.randn((g, n, k), device=dev) / k**0.5).to(torch.bfloat16)
        grad = torch.randn((m, n), dtype=torch.bfloat16, device=dev)
        gl = torch.tensor(lens, dtype=torch.int64, device=dev)
        offs, ends = group_offsets(gl), torch.cumsum(gl, 0).to(torch.int32)
        flops = 2.0 * sum(lens) * n * k
        for gemm in args.gemms:
            ours, peer_gm, peer_loop = _gemm_fns(gemm, a, b, grad, offs, ends, lens)
            wgrad = gemm == "wgrad"
            cands = {"default": (None, ours)}
            for plan in vk_plans if wgrad else plans:
                cands[f"{plan[0]}:{plan[1].name}"] = (plan, ours)
            if "grouped_mm" in args.peers:
                cands["grouped_mm"] = (None, peer_gm)
            if "loop" in args.peers:
                cands["loop"] = (None, peer_loop)
            print(f"{case.label} {gemm} G={g} M={m} N={n} K={k}")
            ref = ours().float()  # the default: tunes here, outside the timing
            scale = ref.abs().max().item() or 1.0
            errs, alive = {}, []
            for name, (plan, fn) in cands.items():
                try:
                    with _Forced(plan, wgrad):
                        out = fn().float()  # compile + check
                    errs[name] = (out - ref).abs().max().item() / scale
                    alive.append(name)
                except Exception as e:  # noqa: BLE001 -- report and go on
                    print(f"  {name}: FAILED {type(e).__name__}: {str(e)[:200]}")
            per_round = {x: [] for x in alive}
            for r in range(args.rounds):
                order = alive[r % len(alive) :] + alive[: r % len(alive)]
                for name in order:
                    plan, fn = cands[name]
                    with _Forced(plan, wgrad):
                        t = time_ms(fn, args.warmup_ms, args.rep_ms).median_ms
                    per_round[name].append(t)
            ms = {x: statistics.median(v) for x, v in per_round.items()}
            b2b = _b2b(alive, cands, wgrad) if args.b2b and gpu else {}
            for name in alive:
                t = ms[name]
                rel = {f"x {peer}": ms[peer] / t for peer in ("grouped_mm", "loop", "default")
                       if peer in ms}  # fmt: skip
                spread = (max(per_round[name]) - min(per_round[name])) / t
                extra = {}
                if name in b2b:  # the tuner's way: back-to-back launches, no flush
                    extra["b2b ms"] = b2b[name]
                    if "grouped_mm" in b2b:
                        extra["b2b x grouped_mm"] = b2b["grouped_mm"] / b2b[name]
                print(f"  {name:26s} {t:7.3f} ms {flops / t / 1e9:7.1f} TFLOPS | "
                      + " | ".join(f"{kx} {v:.3f}" for kx, v in rel.items())
                      + f" | spread {spread:.1%} | rel err {errs[name]:.1e}"
                      + "".join(f" | {kx} {v:.3f}" for kx, v in extra.items()))  # fmt: skip
                rows.append({"case": case.label, "gemm": gemm, "candidate": name, "ms": t,
                             "tflops": flops / t / 1e9, **rel, "spread": spread,
                             "rel_err": errs[name], **extra})  # fmt: skip
            from primus_turbo.triton.grouped_gemm import grouped_gemm_kernel as gk

            for key, choice in gk._tuned.items():
                if key[0] == ("vk" if wgrad else "fwd") and key[2:4] in ((n, k), (k, n)):
                    print(f"  tuned {key[0]} {key[2]}x{key[3]}: {choice}")
    if args.output and rows:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        fields = list(dict.fromkeys(f for r in rows for f in r))
        with open(args.output, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(rows)
        print(f"Results saved to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
