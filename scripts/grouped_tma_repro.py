"""Repro of call 10.6's DeepSeek-V3 gate_up failure ("Failed to create tensor map descriptor:
invalid device context") of the TRITON grouped GEMM: eager forward + backward, then the same
step under CUDA-graph capture, printing full tracebacks."""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import primus_turbo.pytorch as turbo  # noqa: E402
from benchmark.ops.training.config import ragged_grouped_gemm_cases  # noqa: E402


def run(label, fn):
    try:
        fn()
        torch.cuda.synchronize()
        print(f"{label}: OK", flush=True)
    except Exception:  # noqa: BLE001 - the repro prints every failure
        print(f"{label}: FAILED", flush=True)
        traceback.print_exc()


def main() -> int:
    # sys.argv[1]: PRIMUS_TURBO_GROUPED_GEMM_DEFAULT (triton | tune), set before the first call
    os.environ["PRIMUS_TURBO_GROUPED_GEMM_DEFAULT"] = sys.argv[1] if len(sys.argv) > 1 else "tune"
    case = ragged_grouped_gemm_cases(["DeepSeek-V3"])[0]
    print(case, flush=True)
    a = torch.randn(case.m, case.k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(case.g, case.n, case.k, device="cuda", dtype=torch.bfloat16) * 0.02
    b.requires_grad_()
    gl = torch.tensor(case.group_lens(), device="cuda", dtype=torch.int64)

    def step():
        out = turbo.ops.grouped_gemm(a, b, gl, trans_b=True)
        ga, gb = torch.autograd.grad(out, (a, b), torch.ones_like(out))
        return ga, gb

    run("eager step (autograd)", step)
    run("eager step again", step)
    g = torch.cuda.CUDAGraph()

    def capture():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            step()
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            step()
        g.replay()

    run("graph capture + replay", capture)
    return 0


if __name__ == "__main__":
    sys.exit(main())
