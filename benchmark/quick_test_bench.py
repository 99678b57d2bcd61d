"""Quick per-shape regression gate for kernel optimisation rounds (optimize-handoff template).

Copy into a campaign directory, set ``SHAPES`` (all target shapes for BASELINE and the final
acceptance, 3-5 representative ones for each VALIDATE round) and run with the backend under test:

    PRIMUS_TURBO_GEMM_BACKEND=TRITON python quick_test_bench.py --summary-csv round/benchmark.csv

Per shape: correctness first (SNR of out, da, db against ``gemm_ref`` on fp32 copies of the
inputs; PASS needs all three above the op's threshold), then ``--repeats`` repeats of
``--iters-per-repeat`` back-to-back calls timed with ``perf_counter`` between two
synchronisations; the first repeat is a warm-up and is dropped. Reported: the mean and the
population stddev of the per-repeat TFLOPS (forward ``2MNK``, backward ``4MNK``) and the mean
per-call times. A shape that fails writes a row of NaN numbers with ``Check=FAIL`` (its SNRs are
kept when they were measured). The summary CSV header is fixed (the campaign's CSV reader keys on
it); do not change it. Its timing engine differs from ``bench_<op>_turbo.py`` (do_bench): do not
compare absolute numbers across the two tools.

On a machine without a GPU (or with ``--cpu-smoke``) it runs ``CPU_SMOKE_SHAPES`` on the CPU:
a code-path check, not a performance figure.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib.util
import math
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path


def _bootstrap() -> None:
    """Find ``harness.py`` next to this file, or in the checkout of the installed primus_turbo
    (when this file was copied into a campaign directory)."""
    here = Path(__file__).resolve().parent
    if importlib.util.find_spec("primus_turbo") is None and (here.parent / "primus_turbo").is_dir():
        sys.path.append(str(here.parent))
    candidates = [here]
    spec = importlib.util.find_spec("primus_turbo")
    if spec is not None and spec.origin:
        candidates.append(Path(spec.origin).resolve().parents[1] / "benchmark")
    for c in candidates:
        if (c / "harness.py").is_file():
            sys.path.insert(0, str(c))
            return
    raise SystemExit("quick_test_bench: cannot find benchmark/harness.py (install primus_turbo -e)")


_bootstrap()

import torch  # noqa: E402
from harness import (  # noqa: E402
    SNR_THRESHOLD_DB,
    compute_snr,
    device_info,
    geomean,
    markdown_table,
    synchronize,
    tflops,
    time_loop_ms,
)

import primus_turbo.pytorch as turbo  # noqa: E402
from primus_turbo.pytorch.core.backend import env_var_name, parse_backend_env  # noqa: E402
from primus_turbo.pytorch.reference import gemm_ref  # noqa: E402

# ---- campaign settings ---------------------------------------------------------------------
# (label, M, N, K); B is always 1. Layout NT: a [M, K], b [N, K] (weights), trans_b=True.
SHAPES: list[tuple[str, int, int, int]] = [
    ("llama3.1-8b-qkv", 8192, 6144, 4096),
    ("llama3.1-8b-down", 8192, 4096, 14336),
    ("llama3-70b-gate_up", 8192, 57344, 8192),
    ("qwen2.5-72b-down", 8192, 8192, 29568),
    ("deepseek-v3-kv_a", 4096, 576, 7168),
    ("gpt-oss-attn_out", 4096, 2880, 4096),
]
CPU_SMOKE_SHAPES: list[tuple[str, int, int, int]] = [
    ("cpu-64", 64, 64, 64),
    ("cpu-128x192x64", 128, 192, 64),
    ("cpu-odd", 96, 80, 144),
]
OP = "gemm_bf16"  # key of OPS; the op family whose backend env var must be set is OPS[OP].family
# --------------------------------------------------------------------------------------------

HEADER = [
    "label",
    "B",
    "M",
    "N",
    "K",
    "Check",
    "Forward TFLOPS",
    "Forward TFLOPS_stddev",
    "Backward TFLOPS",
    "Backward TFLOPS_stddev",
    "Forward Time (ms)",
    "Backward Time (ms)",
    "out_snr",
    "da_snr",
    "db_snr",
]


@dataclasses.dataclass(frozen=True)
class QuickOp:
    """The op under test. ``fn(a [M, K], b [N, K]) -> [M, N]`` (NT).

    FP8 blockwise slots in as ``"gemm_fp8_blockwise": QuickOp("gemm", torch.bfloat16,
    SNR_THRESHOLD_DB["fp8_e4m3"], lambda a, b: turbo.ops.gemm_fp8(a, b, trans_b=True,
    config=<blockwise E4M3, block 128>))`` once that op exists.
    """

    family: str  # backend family: PRIMUS_TURBO_<FAMILY>_BACKEND selects the target
    dtype: torch.dtype  # input dtype
    snr_db: float
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


OPS: dict[str, QuickOp] = {
    "gemm_bf16": QuickOp(
        "gemm",
        torch.bfloat16,
        SNR_THRESHOLD_DB["bf16"],
        lambda a, b: turbo.ops.gemm(a, b, trans_b=True),
    ),
}


def _nan_row(label: str, m: int, n: int, k: int) -> dict:
    row = dict.fromkeys(HEADER, math.nan)
    row.update({"label": label, "B": 1, "M": m, "N": n, "K": k, "Check": "FAIL"})
    return row


def check(op: QuickOp, a, b, grad) -> dict[str, float]:
    out = op.fn(a, b)
    out.backward(grad)
    a32 = a.detach().float().requires_grad_()
    b32 = b.detach().float().requires_grad_()
    ref = gemm_ref(a32, b32, False, True, torch.float32)
    ref.backward(grad.float())
    snrs = {
        "out_snr": compute_snr(ref, out),
        "da_snr": compute_snr(a32.grad, a.grad),
        "db_snr": compute_snr(b32.grad, b.grad),
    }
    a.grad = b.grad = None
    return snrs


def run_shape(op: QuickOp, label: str, m: int, n: int, k: int, args, device) -> dict:
    row = _nan_row(label, m, n, k)
    try:
        torch.manual_seed(0)
        a = torch.randn((m, k), dtype=op.dtype, device=device, requires_grad=True)
        b = torch.randn((n, k), dtype=op.dtype, device=device, requires_grad=True)
        grad = torch.randn((m, n), dtype=op.dtype, device=device)
        snrs = check(op, a, b, grad)
        row.update(snrs)
        if not all(s > op.snr_db for s in snrs.values()):
            return row

        out = op.fn(a, b)
        fwd_ms, bwd_ms = [], []
        for r in range(args.repeats):
            f = time_loop_ms(lambda: op.fn(a, b), args.iters_per_repeat, device)
            bk = time_loop_ms(
                lambda: out.backward(grad, retain_graph=True),
                args.iters_per_repeat,
                device,
                grad_to_none=(a, b),
            )
            if r > 0:  # the first repeat is the warm-up
                fwd_ms.append(f)
                bwd_ms.append(bk)
        synchronize(device)
    except Exception as e:
        print(f"  {label}: {type(e).__name__}: {e}")
        return row

    fwd_tf = [tflops(2.0 * m * n * k, t) for t in fwd_ms]
    bwd_tf = [tflops(4.0 * m * n * k, t) for t in bwd_ms]
    row.update(
        {
            "Check": "PASS",
            "Forward TFLOPS": statistics.mean(fwd_tf),
            "Forward TFLOPS_stddev": statistics.pstdev(fwd_tf),
            "Backward TFLOPS": statistics.mean(bwd_tf),
            "Backward TFLOPS_stddev": statistics.pstdev(bwd_tf),
            "Forward Time (ms)": statistics.mean(fwd_ms),
            "Backward Time (ms)": statistics.mean(bwd_ms),
        }
    )
    return row


def _cell(v) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if math.isinf(v) else f"{v:.6g}")
    return str(v)


def write_summary(path: str, rows: list[dict]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        for row in rows:
            w.writerow([_cell(row[c]) for c in HEADER])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeats", type=int, default=3, help="repeats; the first is a warm-up")
    p.add_argument("--iters-per-repeat", type=int, default=50)
    p.add_argument("--summary-csv", default=None, help="write the fixed-schema summary here")
    p.add_argument("--op", choices=sorted(OPS), default=OP)
    p.add_argument("--cpu-smoke", action="store_true", help="CPU_SMOKE_SHAPES on the CPU")
    args = p.parse_args(argv)
    if args.repeats < 2:
        p.error("--repeats must be >= 2 (the first repeat is a warm-up)")
    if args.iters_per_repeat < 1:
        p.error("--iters-per-repeat must be >= 1")

    op = OPS[args.op]
    env = env_var_name(op.family)
    target = os.environ.get(env, "").strip()
    if not target:
        print(
            f"error: {env} is not set. quick_test_bench.py measures one target backend; set it, "
            f"e.g. {env}=TRITON python {Path(__file__).name} ...",
            file=sys.stderr,
        )
        return 2
    try:
        parse_backend_env(target, env)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    cpu = args.cpu_smoke or not torch.cuda.is_available()
    info = device_info(force_cpu=cpu)
    if cpu:
        torch.set_num_threads(int(os.environ.get("BENCH_CPU_THREADS", "1")))
    shapes = CPU_SMOKE_SHAPES if cpu else SHAPES
    print(f"{info.banner()}\nop {args.op} | {env}={target} | {len(shapes)} shapes")
    if cpu:
        print("NOTE: CPU smoke run -- exercises the code paths; NOT a performance figure.")

    rows = []
    for label, m, n, k in shapes:
        row = run_shape(op, label, m, n, k, args, info.device)
        rows.append(row)
        print(
            f"  {label} M={m} N={n} K={k}: {row['Check']} fwd {row['Forward TFLOPS']:.2f} "
            f"(+-{row['Forward TFLOPS_stddev']:.2f}) bwd {row['Backward TFLOPS']:.2f} "
            f"(+-{row['Backward TFLOPS_stddev']:.2f}) TFLOPS | SNR {row['out_snr']:.1f}/"
            f"{row['da_snr']:.1f}/{row['db_snr']:.1f} dB"
        )
    print()
    print(markdown_table(rows, HEADER))
    passed = [r for r in rows if r["Check"] == "PASS"]
    print(
        f"\nGeomean over {len(passed)}/{len(rows)} PASS shapes: "
        f"Forward TFLOPS {geomean(r['Forward TFLOPS'] for r in passed):.4g}, "
        f"Backward TFLOPS {geomean(r['Backward TFLOPS'] for r in passed):.4g}"
    )
    if args.summary_csv:
        write_summary(args.summary_csv, rows)
        print(f"summary written to {args.summary_csv}")
    return 0 if len(passed) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
