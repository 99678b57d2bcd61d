"""Run one quantization recipe a few times on the GPU, for a profiler (ncu) to pick a launch.

    ncu --clock-control none --kernel-name regex:quant --launch-skip 4 --launch-count 1 \
        python3 scripts/prof_quant.py block1x128_dual 8192 4096

Recipes and calls are those of benchmark/ops/training/bench_quantization_turbo.py.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmark", "ops", "training"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmark"))

from bench_quantization_turbo import recipes  # noqa: E402

from primus_turbo.pytorch.core.platform import fp8_dtypes  # noqa: E402


def main() -> None:
    name, m, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    calls = int(sys.argv[4]) if len(sys.argv) > 4 else 8
    fn = recipes(fp8_dtypes("cuda")[0])[name][0]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    for _ in range(calls):
        fn(x)
    torch.cuda.synchronize()
    print(f"prof_quant: {name} {m}x{k} x{calls} done")


if __name__ == "__main__":
    main()
