"""Where a grouped GEMM training step spends its time, ours vs ``torch._grouped_mm`` (GPU).

Per case: the autograd step (forward, then ``backward(grad)``) of ``turbo.ops.grouped_gemm``
(backend auto) and of the vendor peer, profiled in alternating rounds after a warm-up (so both
sides see the same sustained-load clock), with every CUDA kernel's time summed per step.
Prints, per side, each kernel's count and microseconds per step and the step's wall time
(CUDA events, no profiler), then the per-phase ratio peer / ours. This tells which GEMM of
the step loses in situ, where ``bench_grouped_gemm_turbo.py --kernels`` times each alone.

    python3 scripts/step_profile.py --models DeepSeek-V3 Mixtral-8x7B --rounds 4
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark" / "ops" / "training"))

from config import ragged_grouped_gemm_cases  # noqa: E402

import primus_turbo.pytorch as turbo  # noqa: E402


def _ours(a, b, gl, ends):
    return turbo.ops.grouped_gemm(a, b, gl, trans_b=True)


def _peer(a, b, gl, ends):
    return torch._grouped_mm(a, b.transpose(-2, -1), offs=ends)


def _step(fn, a, b, gl, ends, grad):
    a.grad = b.grad = None
    fn(a, b, gl, ends).backward(grad)


def _clock_mhz() -> float:
    try:  # pynvml behind it; absent on some installs
        return float(torch.cuda.clock_rate())
    except Exception:
        return float("nan")


def _wall_ms(fn, args, reps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        _step(fn, *args)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def _profile(fn, args, reps: int, into: dict) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            _step(fn, *args)
        torch.cuda.synchronize()
    for ev in prof.key_averages():
        t = getattr(ev, "self_device_time_total", None) or getattr(ev, "self_cuda_time_total", 0)
        if t > 0 and ev.count > 0:
            into[ev.key][0] += ev.count / reps
            into[ev.key][1] += t / reps


def run_case(case, rounds: int, reps: int) -> None:
    torch.manual_seed(0)
    dev = torch.device("cuda")
    lens = case.group_lens()
    g, m, n, k = case.g, case.m, case.n, case.k
    a = torch.randn((m, k), dtype=torch.bfloat16, device=dev, requires_grad=True)
    b = (torch.randn((g, n, k), device=dev) / math.sqrt(k)).to(torch.bfloat16).requires_grad_()
    gl = torch.tensor(lens, dtype=torch.int64, device=dev)
    ends = torch.cumsum(gl, 0).to(torch.int32)
    grad = torch.randn((m, n), dtype=torch.bfloat16, device=dev)
    args = (a, b, gl, ends, grad)
    sides = {"ours": _ours, "grouped_mm": _peer}
    for fn in sides.values():  # tuner / first-call work outside the timing
        for _ in range(2):
            _step(fn, *args)
    torch.cuda.synchronize()
    kern = {s: defaultdict(lambda: [0.0, 0.0]) for s in sides}
    wall = {s: [] for s in sides}
    clocks = {s: [] for s in sides}
    for r in range(rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for s in order:
            wall[s].append(_wall_ms(sides[s], args, reps))
            clocks[s].append(_clock_mhz())
            _profile(sides[s], args, reps, kern[s])
    flops = 6.0 * m * n * k
    print(f"== {case.label} G={g} M={m} N={n} K={k}")
    tot = {}
    for s in sides:
        w = sorted(wall[s])[len(wall[s]) // 2]
        tot[s] = sum(v[1] for v in kern[s].values()) / rounds
        rounds_ms = [round(x, 3) for x in wall[s]]
        print(
            f"  {s}: wall {w:.3f} ms/step ({flops / w / 1e9:.1f} TFLOPS), kernels "
            f"{tot[s] / 1e3:.3f} ms/step; wall per round {rounds_ms}"
        )
        for key, (cnt, us) in sorted(kern[s].items(), key=lambda x: -x[1][1]):
            print(f"    {us / rounds:10.1f} us  x{cnt / rounds:4.1f}  {key[:110]}")
    w_o, w_p = (sorted(wall[s])[len(wall[s]) // 2] for s in sides)
    ksum = tot["grouped_mm"] / tot["ours"]
    print(f"  ratio grouped_mm / ours: wall {w_p / w_o:.3f}, kernel sum {ksum:.3f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", nargs="+", default=["DeepSeek-V3", "Mixtral-8x7B"])
    p.add_argument("--kinds", nargs="+", default=["gate_up", "down"])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("step_profile: needs a CUDA GPU")
        return 1
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__}")
    for case in ragged_grouped_gemm_cases(args.models, "gpu"):
        if case.layer in args.kinds:
            run_case(case, args.rounds, args.reps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
