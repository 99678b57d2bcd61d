"""Developer tool: time every Triton GEMM config (and grid size) against torch.matmul on a GPU.

Prints one line per (shape, config) and the best config per shape, so the per-family config
data in primus_turbo/triton/gemm/gemm_configs.py can be chosen from measurements.
Usage: python scripts/gemm_explore.py [--layout NT] [--quick]

``--weak``: kernel-only (profiler, L2 flushed) and do_bench times of plain, composite-N
(``block_n2``), TMA (``_tma``) and flattened (``PRIMUS_TURBO_GEMM_FLATTEN``) plans on the
DeepSeek-V3 shapes below 0.8x torch.matmul (kv_a, q_a, kv_b; NT), each vs torch.matmul's
kernel; ``--smoke`` runs it on the CPU interpreter at tiny sizes (a syntax check, no timing).
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
    p.add_argument("--weak", action="store_true", help="time composite/flatten plans (see doc)")
    p.add_argument("--smoke", action="store_true", help="with --weak: CPU interpreter, tiny")
    p.add_argument("--shapes", default="kv_a,kv_b", help="with --weak: names from WEAK")
    args = p.parse_args()
    if args.weak:
        return weak(args.shapes.split(","), args.smoke)
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


# DeepSeek-V3 forward GEMMs below 0.8x torch.matmul in session 3 (M, N, K; NT)
WEAK = {"kv_a": (4096, 576, 7168), "q_a": (4096, 1536, 7168), "kv_b": (4096, 32768, 512)}


def _kernel_us(fn, flush, gpu: bool, reps: int = 20) -> float:
    """Mean device time per call of the kernels ``fn`` launches (the L2 flush excluded)."""
    from torch.profiler import ProfilerActivity, profile

    act = ProfilerActivity.CUDA if gpu else ProfilerActivity.CPU
    with profile(activities=[act]) as prof:
        for _ in range(reps):
            flush.zero_()
            fn()
        if gpu:
            torch.cuda.synchronize()
    skip = ("zero", "fill", "Fill", "Memset", "memset")
    ev = [e for e in prof.key_averages() if e.device_time_total > 0 or not gpu]
    ev = [e for e in ev if not any(w in e.key for w in skip) and not e.key.startswith("aten::")]
    if not gpu:
        return 0.0
    return sum(e.device_time_total for e in ev) / reps


def weak(names: list[str], smoke: bool) -> None:
    from primus_turbo.pytorch.core.platform import ArchFamily
    from primus_turbo.triton.gemm.gemm_configs import (
        GemmConfig,
        narrow_candidates,
        narrow_config,
        select_narrow,
    )

    gpu = not smoke
    dev = "cuda" if gpu else "cpu"
    fam = arch_family() if gpu else ArchFamily.CPU
    sms = num_compute_units() if gpu else 4
    flush = torch.empty(256 << 20 if gpu else 1 << 10, dtype=torch.int8, device=dev)
    flat0 = gk._flatten_for
    print(f"device={torch.cuda.get_device_name() if gpu else 'cpu'} family={fam.name} sms={sms}")
    for name in names:
        m, n, k = WEAK[name] if gpu else (40, 36, 300)
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, k, device=dev, dtype=torch.bfloat16)  # NT: weight [N, K]
        c = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
        ref = a.float() @ b.float().T
        flops = 2 * m * n * k
        t_ref = _kernel_us(lambda: torch.matmul(a, b.T), flush, gpu)
        print(
            f"{name} {m}x{n}x{k}: torch.matmul kernel {t_ref:.1f} us"
            f" ({flops / max(t_ref, 1e-9) / 1e6:.0f} TF); 0.7x needs <= {t_ref / 0.7:.1f} us"
        )
        if gpu:
            plains = list(gemm_configs(fam))
            # composite grid (kv_a): the tuner's candidates first, then bk/warps/stages/GROUP_M
            # variants of 128x(128+16), wider narrow blocks and 64x(256+32)
            picked = select_narrow(m, n, k, fam, sms)
            comps = list(narrow_candidates(m, n, k, fam, sms)) if name == "kv_a" else []
            if name == "kv_a":
                grid = [
                    (128, 128, 16, 64, 8, 3, 8),
                    (128, 128, 16, 64, 8, 5, 8),
                    (128, 128, 16, 64, 8, 6, 8),
                    (128, 128, 16, 64, 4, 4, 8),
                    (128, 128, 16, 128, 4, 3, 8),
                    (128, 128, 16, 64, 8, 4, 4),
                    (128, 128, 16, 128, 8, 3, 4),
                    (128, 128, 32, 128, 8, 3, 8),
                    (64, 256, 32, 64, 4, 4, 8),
                    (64, 256, 32, 64, 8, 4, 8),
                ]
                comps += [narrow_config(fam, *g[:4], *g[4:6], group_m=g[6]) for g in grid]
                tma = [(64, 8, 5), (128, 8, 3), (64, 4, 4), (128, 4, 3)]
                comps += [narrow_config(fam, 128, 128, 16, *t, tma=True) for t in tma]
                comps += [narrow_config(fam, 128, 128, 32, 64, 8, 4, tma=True)]
                comps += [narrow_config(fam, 64, 256, 32, 64, 4, 4, tma=True)]
        else:
            plains = list(gemm_configs(fam))[:1]
            comps = [dataclasses.replace(plains[0], block_n2=8)]
            picked = comps[0]
        plains = plains[:3]  # 128x256, 256x128, 128x128 w4 on Hopper (the tuner's usual picks)
        if gpu:  # two co-resident CTAs per SM: one's epilogue overlaps the other's K loop (kv_b)
            plains.append(dataclasses.replace(plains[2], num_stages=3, programs_per_cu=2))
            # TMA versions (PRIMUS_TURBO_GEMM_TMA=1): 128x256 s3/s4, 128x128 w4 s3 2/SM
            plains += [dataclasses.replace(plains[0], tma=True),
                       dataclasses.replace(plains[0], tma=True, num_stages=4),
                       dataclasses.replace(plains[3], tma=True)]  # fmt: skip
        # flat=1 for the plain plans (PRIMUS_TURBO_GEMM_FLATTEN=auto), flat=0 for them only on
        # kv_b (the A/B of run 4.2); composites flat=0 (auto), flat=1 only for the first
        plans = [(cfg, True) for cfg in plains]
        if name != "kv_a" or not gpu:
            plans += [(cfg, False) for cfg in plains if not cfg.tma]
        plans += [(cfg, False) for cfg in comps]
        plans += [(cfg, True) for cfg in comps[:1]]
        if gpu:  # last (a hang here loses only these): TMA + warp specialization (w4 only)
            ws = [GemmConfig(128, 256, 64, 8, 4, 3, tma=True, ws=True),
                  GemmConfig(128, 128, 64, 8, 4, 4, tma=True, ws=True)]  # fmt: skip
            if name == "kv_a":
                ws += [narrow_config(fam, 128, 128, 16, 64, 4, s, ws=True) for s in (3, 4)]
                ws += [narrow_config(fam, 128, 128, 16, 128, 4, 3, ws=True)]
            plans += [(cfg, False) for cfg in ws]
        for cfg, flat in plans:
            gk._flatten_for = lambda cfg, family, flat=flat: flat

            def run(cfg=cfg):
                gk._launch(a, b, c, m, n, k, (k, 1), (1, k), cfg, fam)

            try:
                run()
                err = ((c.float() - ref).abs().max() / ref.abs().max()).item()
                host = triton.testing.do_bench(run, warmup=10, rep=50) * 1e3 if gpu else 0.0
                kern = _kernel_us(run, flush, gpu)
            except Exception as exc:  # noqa: BLE001
                print(
                    f"  {cfg.name}{' flat' if flat else ''}: ERROR {type(exc).__name__}: "
                    f"{str(exc)[:100]}"
                )
                continue
            tag = " <- select_narrow" if picked is not None and cfg == picked else ""
            tag += f" ({cfg.programs_per_cu}/SM)" if cfg.programs_per_cu > 1 else ""
            tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.tile_n)
            print(
                f"  {cfg.name:44s} flat={int(flat)} tiles={tiles:5d} do_bench {host:7.1f} us"
                f" | kernel {kern:7.1f} us ratio {t_ref / max(kern, 1e-9):.3f}"
                f" | relerr {err:.1e}{tag}"
            )
    gk._flatten_for = flat0


if __name__ == "__main__":
    main()
