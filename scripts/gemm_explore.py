"""Developer tool: time every Triton GEMM config (and grid size) against torch.matmul on a GPU.

Prints one line per (shape, config) and the best config per shape, so the per-family config
data in primus_turbo/triton/gemm/gemm_configs.py can be chosen from measurements.
Usage: python scripts/gemm_explore.py [--layout NT] [--quick]
"""

# ruff: noqa: B023  (closures are called within the loop iteration that defines them)
from __future__ import annotations

import argparse
import dataclasses
import statistics

import torch
import triton

from primus_turbo.pytorch.core.platform import arch_family, num_compute_units
from primus_turbo.triton.gemm import gemm_kernel as gk
from primus_turbo.triton.gemm.gemm_configs import gemm_configs, select_config

SHAPES = [
    (8192, 6144, 4096),
    (8192, 4096, 4096),
    (8192, 28672, 4096),
    (8192, 4096, 14336),
    (8192, 8192, 8192),
    (8192, 57344, 8192),
    (8192, 8192, 28672),
    (8192, 10240, 8192),
    (4096, 2880, 2880),
    (8192, 7168, 18432),
]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layout", default="NT", choices=["NN", "NT", "TN"])
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    fam = arch_family()
    sms = num_compute_units()
    print(f"device={torch.cuda.get_device_name()} family={fam.name} sms={sms}")
    shapes = SHAPES[:4] if args.quick else SHAPES
    summary = []
    for m, n, k in shapes:
        ta, tb = args.layout[0] == "T", args.layout[1] == "T"
        a = torch.randn((k, m) if ta else (m, k), device="cuda", dtype=torch.bfloat16)
        b = torch.randn((n, k) if tb else (k, n), device="cuda", dtype=torch.bfloat16)
        x, y = (a.t() if ta else a), (b.t() if tb else b)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        flops = 2 * m * n * k
        t_ref = triton.testing.do_bench(lambda: torch.matmul(x, y), warmup=25, rep=100)
        ref_tf = flops / t_ref / 1e9
        ref = torch.matmul(x, y).float()
        sa = (x.stride(0), x.stride(1))
        sb = (y.stride(0), y.stride(1))
        best = (0.0, None)
        for cfg in gemm_configs(fam):
            tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
            for mult in (1, 2, 0):
                # 0: one program per tile (classic grid); else a persistent grid of mult x SMs
                per_cu = -(-tiles // sms) if mult == 0 else mult
                variant = dataclasses.replace(cfg, programs_per_cu=per_cu)

                def run(variant=variant):
                    gk._launch(x, y, c, m, n, k, sa, sb, variant, fam)

                try:
                    run()
                    err = (c.float() - ref).norm() / ref.norm()
                    t = triton.testing.do_bench(run, warmup=25, rep=100)
                except Exception as exc:  # noqa: BLE001
                    print(f"  {cfg.name} x{mult}: ERROR {type(exc).__name__}: {str(exc)[:80]}")
                    continue
                tf = flops / t / 1e9
                print(
                    f"  {m}x{n}x{k} {cfg.name:28s} prog={'tiles' if mult == 0 else f'{mult}xSM':5s}"
                    f" {tf:7.1f} TF  ratio={tf / ref_tf:.3f} relerr={err:.1e}"
                )
                if tf > best[0]:
                    best = (tf, f"{cfg.name} {mult}")
        heur = select_config(m, n, k, fam, sms).name
        summary.append((m, n, k, ref_tf, best[0], best[1], heur))
        print(f"{m}x{n}x{k}: torch {ref_tf:.1f} TF, best triton {best[0]:.1f} ({best[1]})")
    print("\nshape | torch TF | best triton TF | ratio | best config | heuristic")
    for m, n, k, r, b, name, h in summary:
        print(f"{m}x{n}x{k} | {r:.0f} | {b:.0f} | {b / r:.3f} | {name} | {h}")
    print("geomean ratio", statistics.geometric_mean([b / r for *_, r, b, _, _ in summary]))


if __name__ == "__main__":
    main()
