"""A/B of the FP8 rowwise grouped GEMM forward variants in one process, graph replays interleaved.

Per case (MoE shapes of ``config.RAGGED_GROUPED_GEMM_SPECS``), every variant's forward (no
autograd recording) is captured in a CUDA graph, then the graphs are replayed in turn, sample by
sample (L2 flushed and an idle kernel queued before each sample, as ``harness``'s graph timing),
so clock and power drift reach every variant alike. Variants:

* ``bf16``: ``turbo.ops.grouped_gemm`` (the baseline of the 1.5x target);
* ``fp8``: ``turbo.ops.grouped_gemm_fp8`` rowwise with the pipeline off;
* ``pipe:<spec>``: the same with ``PRIMUS_TURBO_GROUPED_GEMM_FP8_PIPELINE=<spec>`` (each
  ``--pipelines`` entry; see ``kernels/grouped_gemm/grouped_gemm_fp8_pipe.py``);
* ``wcache``: pipeline off, ``PRIMUS_TURBO_GROUPED_GEMM_FP8_WEIGHT_CACHE=1`` (weights quantized
  once, as within one optimizer step) -- with ``--wcache``;
* pieces alone: ``quant_a``, ``quant_b`` (the op's two quantizations), ``quant_a_win`` (the
  pipeline's row-window quantization of a, all groups in one window) and ``gemm`` (the TMA fp8
  GEMM on operands quantized beforehand, tuned plan); ``gemm:chunk1`` (the pipeline's chunk
  kernel over all experts, one launch; ``gemm:chunk1pf`` with its scales prefetched into L1);
  ``gemm:<plan>`` per ``--gemm-configs``.

Prints per case the median ms, TFLOPS and the ratio ``bf16 ms / variant ms`` (target >= 1.5),
then the geomean of that ratio per variant. Usage:
    python benchmark/ops/training/bench_grouped_gemm_fp8_pipe.py --models DeepSeek-V3 \\
        --pipelines 4:16:2 8:16:4 --wcache -o out.csv
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parents[1])]  # config.py, harness.py
if str(_HERE.parents[2]) not in sys.path:
    sys.path.append(str(_HERE.parents[2]))  # the repo root, for an uninstalled checkout

import torch  # noqa: E402
from config import ragged_grouped_gemm_cases  # noqa: E402
from harness import Results, add_common_args, geomean, output_path, resolve_profile  # noqa: E402

import primus_turbo.pytorch as turbo  # noqa: E402
from primus_turbo.pytorch.core import BackendType, GlobalBackendManager  # noqa: E402


def _set_env(pipeline: str, wcache: bool) -> None:
    import importlib

    from primus_turbo.pytorch.kernels.grouped_gemm import grouped_gemm_fp8_pipe as pipe

    op = importlib.import_module("primus_turbo.pytorch.ops.grouped_gemm_fp8")  # not the function
    os.environ["PRIMUS_TURBO_GROUPED_GEMM_FP8_PIPELINE"] = pipeline
    os.environ["PRIMUS_TURBO_GROUPED_GEMM_FP8_WEIGHT_CACHE"] = "1" if wcache else "0"
    pipe.spec.cache_clear()
    op._weight_cache_on.cache_clear()
    op._WEIGHT_CACHE.clear()


def _variants(a, b, gl, args) -> dict:
    """name -> (env (pipeline, wcache), fn)."""
    from primus_turbo.pytorch.core.low_precision import Float8QuantConfig, ScalingGranularity
    from primus_turbo.pytorch.ops.grouped_gemm_fp8 import _quant_experts, _quant_rows
    from primus_turbo.pytorch.reference import group_offsets
    from primus_turbo.triton.grouped_gemm.grouped_gemm_fp8_tma import grouped_gemm_fp8_tma

    row = ScalingGranularity.ROWWISE
    cfg = Float8QuantConfig(granularity=row)
    f8 = torch.float8_e4m3fn
    fp8 = lambda: turbo.ops.grouped_gemm_fp8(a, b, gl, trans_b=True, config=cfg)  # noqa: E731
    out = {"bf16": (("0", False), lambda: turbo.ops.grouped_gemm(a, b, gl, trans_b=True))}
    out["fp8"] = (("0", False), fp8)
    for spec in args.pipelines:
        out[f"pipe:{spec}"] = ((spec, False), fp8)
    if args.wcache:
        out["wcache"] = (("0", True), fp8)
    offs = group_offsets(gl)
    qa, sa = _quant_rows(a, f8, row)
    qb, sb = _quant_experts(b, f8, row)
    out["quant_a"] = (("0", False), lambda: _quant_rows(a, f8, row))
    out["quant_b"] = (("0", False), lambda: _quant_experts(b, f8, row))
    out["quant_a_win"] = (("0", False), lambda: _quant_window(a, offs, f8))
    out["gemm"] = (("0", False), lambda: grouped_gemm_fp8_tma(qa, qb, offs, sa, sb, torch.bfloat16))
    bf = torch.bfloat16
    out["gemm:chunk1"] = (("0", False), lambda: _one_chunk(qa, qb, offs, sa, sb, False))
    if device_is_cuda(
        a
    ):  # + the scales prefetched into L1 (PRIMUS_TURBO_GROUPED_GEMM_FP8_PREFETCH)
        out["gemm:chunk1pf"] = (("0", False), lambda: _one_chunk(qa, qb, offs, sa, sb, True))
    for name in args.gemm_configs:  # the GEMM alone on one plan each (the tile A/B)
        variant, tile = _plan(name)
        run = lambda t=tile, v=variant: grouped_gemm_fp8_tma(qa, qb, offs, sa, sb, bf, t, v)  # noqa: E731
        out[f"gemm:{name}"] = (("0", False), run)
    return out


def _quant_window(a, offs, f8):
    """The pipeline's row-window quantization over all groups (vs ``quant_a``)."""
    from primus_turbo.triton.grouped_gemm.grouped_gemm_fp8_quant import quant_rows_window

    q = torch.empty(a.shape, dtype=f8, device=a.device)
    s = torch.empty(a.shape[0], dtype=torch.float32, device=a.device)
    quant_rows_window(a, q, s, offs)
    return q, s


def device_is_cuda(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.version.hip is None


def _one_chunk(qa, qb, offs, sa, sb, prefetch: bool):
    """The pipelined forward's chunk kernel over all experts in one launch (vs ``gemm``: the
    same tile on ``grouped_gemm_flat_tma_kernel``)."""
    from primus_turbo.pytorch.core.platform import num_compute_units
    from primus_turbo.triton.grouped_gemm.grouped_gemm_fp8_tma import chunk_plan, launch_fp8_chunk

    plan = chunk_plan()
    c = torch.empty((qa.shape[0], qb.shape[1]), dtype=torch.bfloat16, device=qa.device)
    programs = num_compute_units(qa.device) * plan[1].programs_per_cu if qa.is_cuda else 4
    launch_fp8_chunk(qa, qb, c, offs, sa, sb, plan, programs, True, prefetch)
    return c


def _plan(name: str):
    """``[variant:]config`` -> ``(variant, GemmConfig)``: a candidate of ``fp8_tma_configs`` by
    name (``f8tmas:m128n256k128g8w8s3``), or any ``m<BM>n<BN>k<BK>g<G>w<W>s<S>[x<programs per
    SM>]`` tile outside the candidate list (``m256n128k128g8w8s4``)."""
    import re

    from primus_turbo.pytorch.core.platform import ArchFamily, triton_interpret
    from primus_turbo.triton.gemm.gemm_configs import GemmConfig
    from primus_turbo.triton.grouped_gemm.grouped_gemm_fp8_tma import fp8_tma_configs

    variant, _, cfg_name = name.rpartition(":")
    family = ArchFamily.CPU if triton_interpret() else ArchFamily.HOPPER
    cfgs = {c.name: c for c in fp8_tma_configs(family)}
    if cfg_name in cfgs:
        return variant or "f8tma", cfgs[cfg_name]
    hit = re.fullmatch(r"m(\d+)n(\d+)k(\d+)g(\d+)w(\d+)s(\d+)(?:x(\d+))?", cfg_name)
    if hit is None:
        raise ValueError(
            f"--gemm-configs: {cfg_name!r} not in {sorted(cfgs)} nor m..n..k..g..w..s.."
        )
    v = [int(x) for x in hit.groups(default="1")]
    return variant or "f8tma", GemmConfig(*v)


def _interleaved_ms(graphs: dict, rounds: int) -> dict[str, float]:
    """Median ms of each graph over ``rounds`` samples, the graphs replayed in turn."""
    from harness import _LAUNCH_SLACK_CYCLES, bench_stream
    from triton import runtime

    driver = runtime.driver.active
    cache = driver.get_empty_cache_for_benchmark()
    stream = bench_stream()
    times = {name: [] for name in graphs}
    with torch.cuda.stream(stream):
        for g in graphs.values():  # warm-up
            g.replay()
        for _ in range(rounds):
            for name, g in graphs.items():
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                driver.clear_cache(cache)
                torch.cuda._sleep(_LAUNCH_SLACK_CYCLES)
                start.record(stream)
                g.replay()
                end.record(stream)
                times[name].append((start, end))
    torch.cuda.synchronize()
    res = {}
    for name, pairs in times.items():
        ms = sorted(s.elapsed_time(e) for s, e in pairs)
        res[name] = ms[len(ms) // 2]
    return res


def _cpu_ms(fns: dict) -> dict[str, float]:
    import time

    res = {}
    for name, fn in fns.items():
        t = time.perf_counter()
        fn()
        res[name] = (time.perf_counter() - t) * 1e3
    return res


def run_case(case, args, device) -> dict:
    from harness import _capture

    g, m, n, k = case.g, case.m, case.n, case.k
    torch.manual_seed(case.seed)
    a = torch.randn((m, k), dtype=torch.bfloat16, device=device)
    b = (torch.randn((g, n, k), device=device) / math.sqrt(k)).to(torch.bfloat16)
    gl = torch.tensor(case.group_lens(), dtype=torch.int64, device=device)
    variants = _variants(a, b, gl, args)
    runs, graphs, firsts = {}, {}, {}
    for name, (env, fn) in variants.items():
        _set_env(*env)
        try:
            out = fn()  # compile / tune outside the timing (and fill the weight cache)
        except Exception as e:  # noqa: BLE001 -- one failing variant must not end the A/B
            print(f"  {name}: FAILED {type(e).__name__}: {str(e)[:200]}")
            continue
        out = out[0] if isinstance(out, tuple) else out
        base = "fp8" if name.startswith(("pipe", "wcache")) else "gemm"
        if name in ("fp8", "gemm"):
            firsts[name] = out.float()
        elif name.startswith(("pipe", "wcache", "gemm:")) and base in firsts:
            ref = firsts[base]  # equal to the unpipelined fp8 forward / the tuned GEMM
            err = ((out.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
            print(f"  {name}: rel diff to {base} {err:.2e}{'' if err < 1e-3 else '  MISMATCH'}")
        if device.type == "cuda":
            try:
                graphs[name] = _capture(fn, None)
            except Exception as e:  # noqa: BLE001 -- report, time the others
                print(f"  {name}: CAPTURE FAILED {type(e).__name__}: {str(e)[:200]}")
                torch.cuda.synchronize()
        else:
            runs[name] = fn
    _set_env("0", False)
    ms = _interleaved_ms(graphs, args.rounds) if graphs else _cpu_ms(runs)
    flops = 2.0 * m * n * k
    row = {"Case": case.label, "G": g, "M": m, "N": n, "K": k}
    for name, t in ms.items():
        row[f"{name} ms"] = t
        if not name.startswith("quant"):
            row[f"{name} TFLOPS"] = flops / t / 1e9
            row[f"{name} vs bf16"] = ms.get("bf16", math.nan) / t
    print(f"{case.label} G={g} M={m} N={n} K={k}")
    for name, t in ms.items():
        extra = f"  x{row[f'{name} vs bf16']:.3f} vs bf16" if f"{name} vs bf16" in row else ""
        print(f"  {name:>18}: {t:8.3f} ms{extra}")
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", nargs="+", default=None)
    p.add_argument("--max-cases", type=int, default=None)
    p.add_argument("--pipelines", nargs="*", default=["4:16:2", "8:16:4"],
                   help="PRIMUS_TURBO_GROUPED_GEMM_FP8_PIPELINE specs to time")  # fmt: skip
    p.add_argument("--wcache", action="store_true", help="also time the weight cache")
    p.add_argument(
        "--gemm-configs",
        nargs="*",
        default=[],
        help="also time the fp8 GEMM alone on these plans ([f8tma|f8tmas:]<config>)",
    )
    p.add_argument("--rounds", type=int, default=30, help="samples per variant (GPU)")
    add_common_args(p)
    args = p.parse_args(argv)
    profile, info = resolve_profile(args.profile)
    print(info.banner())
    GlobalBackendManager.reset()
    GlobalBackendManager.set_grouped_gemm_backend(BackendType.TRITON)
    results = Results(info)
    cases = ragged_grouped_gemm_cases(args.models, profile)[: args.max_cases]
    for case in cases:
        results.add(run_case(case, args, info.device))
    cols = [c for c in results.rows[0] if c.endswith("vs bf16")] if results.rows else []
    print("geomean vs bf16: " + ", ".join(f"{c[:-8]} x{geomean(results.column(c)):.3f}"
                                          for c in cols))  # fmt: skip
    name = f"grouped_gemm_fp8_pipe_{info.date_compact}_{info.gpu}.csv"
    print(f"Results saved to {results.write_csv(output_path(args.output, name, 1, 0))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
