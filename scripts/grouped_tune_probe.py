"""How stable is the grouped GEMM default dispatch's backend choice? For each MoE benchmark case,
time the candidate backends the way ``GroupedGemmDispatcher.tune`` does, several times, under
each ``PRIMUS_TURBO_GROUPED_GEMM_BACKEND_TUNE`` mode, and print TRITON / HIPBLASLT time ratios
and the pick. Needs an NVIDIA GPU (torch._grouped_mm).

    python scripts/grouped_tune_probe.py --models Qwen3-30B-A3B Mixtral-8x7B --repeats 4
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmark.ops.training.config import ragged_grouped_gemm_cases  # noqa: E402
from primus_turbo.pytorch.core.backend import BackendType  # noqa: E402
from primus_turbo.pytorch.kernels.grouped_gemm import grouped_gemm_impl as impl  # noqa: E402

D = impl.GroupedGemmDispatcher
CANDS = [BackendType.TRITON, BackendType.HIPBLASLT]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=None)
    p.add_argument("--repeats", type=int, default=4)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("needs a GPU")
        return 0
    print("| case | mode | what | TRITON/HIPBLASLT time per repeat | picks TRITON |")
    print("|---|---|---|---|---|")
    for case in ragged_grouped_gemm_cases(args.models):
        gen = torch.Generator(device="cuda").manual_seed(case.seed)
        a = torch.randn(case.m, case.k, device="cuda", dtype=torch.bfloat16, generator=gen)
        b = torch.randn(case.g, case.n, case.k, device="cuda", dtype=torch.bfloat16,
                        generator=gen) * 0.02  # fmt: skip
        gl = torch.tensor(case.group_lens(), device="cuda", dtype=torch.int64)
        for grad in (False, True):
            a.requires_grad_(grad)
            b.requires_grad_(grad)
            kw = dict(a=a, b=b, group_lens=gl, group_offs=None, trans_b=True,
                      out_dtype=torch.bfloat16)  # fmt: skip
            for mode in ("once", "rounds"):
                impl._backend_tune_mode = lambda m=mode: m  # noqa: E731 - the probe's switch
                ratios = []
                for _ in range(args.repeats):
                    with torch.enable_grad():
                        t = D.time_candidates(CANDS, a.device, **kw)
                    ratios.append(t[BackendType.TRITON] / t[BackendType.HIPBLASLT])
                picks = sum(r < 1 for r in ratios)
                what = "step" if grad else "fwd"
                print(f"| {case.label} | {mode} | {what} | "
                      f"{' '.join(f'{r:.3f}' for r in ratios)} | {picks}/{len(ratios)} |",
                      flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
