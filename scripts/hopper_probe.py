"""Check and time the Hopper grouped GEMM (csrc/kernels/grouped_gemm_hopper.cu) on the H200.

1. Correctness: small ragged cases (empty groups, a group of 1 row, lengths not multiples of the
   tile, N not a multiple of 256, K not a multiple of 64, rows past the last group) against an
   fp32 reference, for cluster 1 and 2; then every benchmark case against torch._grouped_mm.
2. Speed: the forward of every benchmark case (benchmark/ops/training/config.py), graph replay
   with L2 flushed, ``--rounds`` interleaved rounds of: hopper c1, hopper c2, our Triton kernel
   (its config tuner's choice), torch._grouped_mm, a loop of torch.matmul.

    python scripts/hopper_probe.py [--models DeepSeek-V3 ...] [--rounds 3] [-o out.csv]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

import torch

_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(_ROOT / "benchmark" / "ops" / "training"), str(_ROOT / "benchmark"), str(_ROOT)]

from config import ragged_grouped_gemm_cases  # noqa: E402
from harness import set_timing, time_ms  # noqa: E402

from tests.pytorch.ops.test_grouped_gemm_hopper import CASES  # noqa: E402


def _ref(a, b, lens):
    outs, s = [], 0
    for i, n in enumerate(lens):
        outs.append(a[s : s + n].float() @ b[i].float().t())
        s += n
    out = torch.cat(outs) if outs else a.new_zeros((0, b.shape[1]), dtype=torch.float32)
    tail = a.shape[0] - s
    return torch.cat([out, out.new_zeros((tail, b.shape[1]))])


def check_small(dev) -> int:
    from primus_turbo.pytorch.kernels.grouped_gemm.grouped_gemm_cuda import grouped_gemm_hopper
    from primus_turbo.pytorch.reference import group_offsets

    bad = 0
    for lens, tail, n, k in CASES:
        torch.manual_seed(len(lens) + n + k)
        g, m = len(lens), sum(lens) + tail
        a = torch.randn((m, k), device=dev, dtype=torch.bfloat16)
        b = (torch.randn((g, n, k), device=dev) / k**0.5).to(torch.bfloat16)
        gl = torch.tensor(lens, dtype=torch.int64, device=dev)
        offs = group_offsets(gl)
        ref = _ref(a, b, lens)
        scale = ref.abs().max().item() or 1.0
        for c in (1, 2):
            out = torch.full((m, n), float("nan"), device=dev, dtype=torch.bfloat16)
            out = grouped_gemm_hopper(a, b, offs, c)
            err = (out.float() - ref).abs().max().item() / scale if m else 0.0
            ok = err < 1e-2 and not out.isnan().any().item()
            bad += not ok
            print(f"small lens={lens[:6]}{'...' if g > 6 else ''} tail={tail} N={n} K={k} c{c}: "
                  f"rel err {err:.2e} {'OK' if ok else 'FAIL'}")  # fmt: skip
    return bad


def _candidates(a, b, offs, ends, starts) -> dict:
    from primus_turbo.pytorch.kernels.grouped_gemm.grouped_gemm_cuda import grouped_gemm_hopper
    from primus_turbo.triton.grouped_gemm.grouped_gemm_kernel import grouped_gemm_triton

    g = b.shape[0]
    # variant bits: 1 plain launch (no cluster attribute), 2 drain each k step, 4 GROUP_M 16
    return {
        "hopper_c1": lambda: grouped_gemm_hopper(a, b, offs, 1),
        "hopper_c1_plain": lambda: grouped_gemm_hopper(a, b, offs, 1, 1),
        "hopper_c1_w0": lambda: grouped_gemm_hopper(a, b, offs, 1, 2),
        "hopper_c1_g16": lambda: grouped_gemm_hopper(a, b, offs, 1, 4),
        "hopper_c2": lambda: grouped_gemm_hopper(a, b, offs, 2),
        "hopper_c2_w0": lambda: grouped_gemm_hopper(a, b, offs, 2, 2),
        "hopper_c2_g16": lambda: grouped_gemm_hopper(a, b, offs, 2, 4),
        "triton": lambda: grouped_gemm_triton(a, b, offs, True),
        "grouped_mm": lambda: torch._grouped_mm(a, b.transpose(1, 2), offs=ends),
        "loop": lambda: torch.cat([a[starts[i] : starts[i + 1]] @ b[i].t() for i in range(g)]),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", nargs="*", default=None)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup-ms", type=float, default=20.0)
    p.add_argument("--rep-ms", type=float, default=60.0)
    p.add_argument("--layers", nargs="*", default=["gate_up", "down"])
    p.add_argument("--skip", nargs="*", default=[], help="candidates to leave out")
    p.add_argument("--only", nargs="*", default=None, help="candidates to keep")
    p.add_argument("--once", action="store_true", help="no checks, no timing: 3 calls each (ncu)")
    p.add_argument("-o", "--output", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to do")
        return 0
    from primus_turbo.pytorch.kernels.grouped_gemm.grouped_gemm_cuda import hopper_available
    from primus_turbo.pytorch.reference import group_offsets

    dev = torch.device("cuda")
    if not hopper_available(dev):
        print("hopper kernel not available (build without 9.0a, or not an sm_90 GPU)")
        return 1
    bad = 0 if args.once else check_small(dev)
    set_timing("graph")
    rows = []
    for test_id, case in enumerate(ragged_grouped_gemm_cases(args.models), 1):
        if case.layer not in args.layers:
            continue
        torch.manual_seed(test_id)
        g, m, n, k = case.g, case.m, case.n, case.k
        lens = case.group_lens()
        a = torch.randn((m, k), dtype=torch.bfloat16, device=dev)
        b = (torch.randn((g, n, k), device=dev) / k**0.5).to(torch.bfloat16)
        gl = torch.tensor(lens, dtype=torch.int64, device=dev)
        offs, ends = group_offsets(gl), torch.cumsum(gl, 0).to(torch.int32)
        starts = [0]
        for x in lens:
            starts.append(starts[-1] + x)
        cands = _candidates(a, b, offs, ends, starts)
        cands = {x: f for x, f in cands.items()
                 if x not in args.skip and (args.only is None or x in args.only)}  # fmt: skip
        if args.once:
            for name, fn in cands.items():
                for _ in range(3):
                    fn()
                torch.cuda.synchronize()
                print(f"{case.label} {name}: 3 calls")
            continue
        flops = 2.0 * sum(lens) * n * k
        print(f"{case.label} G={g} M={m} N={n} K={k}")
        ref = torch._grouped_mm(a, b.transpose(1, 2), offs=ends).float()[: starts[-1]]
        scale = ref.abs().max().item() or 1.0
        alive = []
        for name, fn in cands.items():
            try:
                err = (fn().float()[: starts[-1]] - ref).abs().max().item() / scale
                alive.append(name)
                if name.startswith("hopper") and not err < 1e-2:
                    bad += 1
                print(f"  {name}: rel err vs grouped_mm {err:.2e}")
            except Exception as e:  # noqa: BLE001 -- report and go on
                bad += 1
                print(f"  {name}: FAILED {type(e).__name__}: {str(e)[:300]}")
        per = {x: [] for x in alive}
        for r in range(args.rounds):
            order = alive[r % len(alive) :] + alive[: r % len(alive)]
            for name in order:
                per[name].append(time_ms(cands[name], args.warmup_ms, args.rep_ms).median_ms)
        ms = {x: statistics.median(v) for x, v in per.items()}
        for name in alive:
            t = ms[name]
            rel = {f"x {q}": ms[q] / t for q in ("grouped_mm", "loop", "triton") if q in ms}
            print(f"  {name:11s} {t:7.3f} ms {flops / t / 1e9:7.1f} TFLOPS | "
                  + " | ".join(f"{kx} {v:.3f}" for kx, v in rel.items()))  # fmt: skip
            rows.append({"case": case.label, "candidate": name, "ms": t,
                         "tflops": flops / t / 1e9, **rel})  # fmt: skip
    if args.output and rows:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        with open(args.output, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(x for r in rows for x in r)))
            w.writeheader()
            w.writerows(rows)
    print(f"hopper probe: {bad} failure(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
