"""Dense GEMM benchmark: ``turbo.ops.gemm`` against ``torch.matmul`` on model shapes.

For every shape (``config.dense_gemm_cases``): correctness first (out, da, db against
``gemm_ref`` in fp32: normalised allclose and SNR -> Check PASS/FAIL/ERROR), then forward and
backward timings of the turbo op and of the peer a user would otherwise call (``torch.matmul``)
in the same run. FLOPs: forward ``2MNK``, backward ``4MNK``, step ``6MNK`` over fwd + bwd time.

    python benchmark/ops/training/bench_gemm_turbo.py --dtype bf16 --backend TRITON
    python benchmark/ops/training/bench_gemm_turbo.py --overhead      # dispatch cost, 256^3

Layouts name the op's transpose flags: NT = ``a [M, K]``, ``b [N, K]``, ``trans_b=True``
(weights, the default); NN = ``b [K, N]``; TN = ``a [K, M]``, ``trans_a=True``, ``b [K, N]``.
Timing, CSV and table code live in ``benchmark/harness.py``; this script only builds inputs.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import statistics
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parents[1])]  # config.py, harness.py
if str(_HERE.parents[2]) not in sys.path:
    sys.path.append(str(_HERE.parents[2]))  # the repo root, for an uninstalled checkout

import torch  # noqa: E402
from config import GemmCase, dense_gemm_cases  # noqa: E402
from harness import (  # noqa: E402
    SNR_THRESHOLD_DB,
    DeviceInfo,
    Mode,
    Results,
    add_common_args,
    bench_pair,
    check_allclose,
    compute_snr,
    cpu_notice,
    geomean,
    output_path,
    ratio,
    resolve_profile,
    shard,
    synchronize,
    tflops,
    time_loop_ms,
)

import primus_turbo.pytorch as turbo  # noqa: E402
from primus_turbo.pytorch.core import BackendType, GlobalBackendManager  # noqa: E402
from primus_turbo.pytorch.reference import gemm_ref  # noqa: E402

GemmFn = Callable[[torch.Tensor, torch.Tensor, bool, bool], torch.Tensor]

# layout -> (trans_a, trans_b)
LAYOUTS: dict[str, tuple[bool, bool]] = {
    "NT": (False, True),
    "NN": (False, False),
    "TN": (True, False),
}
BACKENDS = ("auto", "HIPBLASLT", "TRITON", "TORCH")


def _turbo_gemm(a: torch.Tensor, b: torch.Tensor, ta: bool, tb: bool) -> torch.Tensor:
    return turbo.ops.gemm(a, b, trans_a=ta, trans_b=tb)


def _torch_matmul(a: torch.Tensor, b: torch.Tensor, ta: bool, tb: bool) -> torch.Tensor:
    return torch.matmul(a.t() if ta else a, b.t() if tb else b)


@dataclasses.dataclass(frozen=True)
class Variant:
    """One precision of the benchmark: the op, its peer and its correctness gate.

    fp8 / fp4 slot in as further entries (input dtype bf16, ``op`` = ``turbo.ops.gemm_fp8`` with
    a quant config, ``peer`` = ``torch._scaled_mm``, ``allclose=False``, SNR gate per format) and
    a ``--granularity`` that selects among them; the filename tag then carries the granularity.
    """

    name: str
    dtype: torch.dtype  # input dtype
    snr_db: float  # every SNR (out, da, db) must exceed this
    allclose: bool  # also gate on the normalised allclose (high-precision formats)
    op: GemmFn
    peer: GemmFn
    peer_name: str

    @property
    def tag(self) -> str:
        return self.name


VARIANTS: dict[str, Variant] = {
    "bf16": Variant(
        "bf16",
        torch.bfloat16,
        SNR_THRESHOLD_DB["bf16"],
        True,
        _turbo_gemm,
        _torch_matmul,
        "torch.matmul",
    ),
    "fp16": Variant(
        "fp16",
        torch.float16,
        SNR_THRESHOLD_DB["fp16"],
        True,
        _turbo_gemm,
        _torch_matmul,
        "torch.matmul",
    ),
}

TABLE_COLUMNS = [
    "Case",
    "Layer",
    "M",
    "N",
    "K",
    "Resolved Backend",
    "Check",
    "Forward TFLOPS",
    "Backward TFLOPS",
    "Step TFLOPS",
    "torch Forward TFLOPS",
    "torch Backward TFLOPS",
    "Forward Ratio",
    "Backward Ratio",
    "Step Ratio",
    "out_snr",
    "da_snr",
    "db_snr",
]


# Numeric columns of every row (NaN when a case errors before they are measured).
METRIC_COLUMNS = [
    "Forward Time (ms)",
    "Forward Time Stddev (ms)",
    "Forward TFLOPS",
    "Backward Time (ms)",
    "Backward Time Stddev (ms)",
    "Backward TFLOPS",
    "Step Time (ms)",
    "Step TFLOPS",
    "torch Forward Time (ms)",
    "torch Forward TFLOPS",
    "torch Backward Time (ms)",
    "torch Backward TFLOPS",
    "torch Step TFLOPS",
    "Forward Ratio",
    "Backward Ratio",
    "Step Ratio",
    "out_snr",
    "da_snr",
    "db_snr",
]


def make_inputs(
    case: GemmCase, layout: str, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, bool, bool]:
    ta, tb = LAYOUTS[layout]
    a_shape = (case.k, case.m) if ta else (case.m, case.k)
    b_shape = (case.n, case.k) if tb else (case.k, case.n)
    a = torch.randn(a_shape, dtype=dtype, device=device, requires_grad=True)
    b = torch.randn(b_shape, dtype=dtype, device=device, requires_grad=True)
    return a, b, ta, tb


def check_case(
    variant: Variant, a: torch.Tensor, b: torch.Tensor, ta: bool, tb: bool, grad: torch.Tensor
) -> tuple[bool, dict[str, float]]:
    """Check out, da, db of the turbo op against ``gemm_ref`` on fp32 copies of the inputs."""
    out = variant.op(a, b, ta, tb)
    out.backward(grad)
    a32 = a.detach().float().requires_grad_()
    b32 = b.detach().float().requires_grad_()
    ref = gemm_ref(a32, b32, ta, tb, torch.float32)
    ref.backward(grad.float())
    pairs = {"out": (out, ref), "da": (a.grad, a32.grad), "db": (b.grad, b32.grad)}
    snrs = {f"{k}_snr": compute_snr(r, o) for k, (o, r) in pairs.items()}
    ok = all(s > variant.snr_db for s in snrs.values())
    if variant.allclose:
        ok = ok and all(check_allclose(o, r, variant.dtype) for o, r in pairs.values())
    a.grad = b.grad = None
    return ok, snrs


def resolved_backend(a: torch.Tensor, b: torch.Tensor, ta: bool, tb: bool) -> str:
    from primus_turbo.pytorch.kernels.gemm.gemm_impl import GemmDispatcher

    try:
        kw = {"a": a, "b": b, "trans_a": ta, "trans_b": tb, "out_dtype": a.dtype}
        return GemmDispatcher.resolve(**kw).name
    except Exception as e:  # the pinned backend cannot run this input: reported by the op too
        return f"none ({type(e).__name__})"


def run_case(
    test_id: int, case: GemmCase, variant: Variant, args: argparse.Namespace, info: DeviceInfo
) -> dict:
    m, n, k = case.m, case.n, case.k
    row: dict = {
        "TestID": test_id,
        "Case": case.case,
        "Layer": case.layer,
        "MBS": case.mbs,
        "M": m,
        "N": n,
        "K": k,
        "Dtype": variant.name,
        "Layout": args.layout,
        "Backend": args.backend,
        "Resolved Backend": "",
        "Peer": variant.peer_name,
        "Check": "ERROR",
    }
    row.update(dict.fromkeys(METRIC_COLUMNS, math.nan))  # NaN until measured
    device = info.device
    torch.manual_seed(test_id)
    try:
        a, b, ta, tb = make_inputs(case, args.layout, variant.dtype, device)
        row["Resolved Backend"] = resolved_backend(a, b, ta, tb)
        grad = torch.randn((m, n), dtype=variant.dtype, device=device)
        ok, snrs = check_case(variant, a, b, ta, tb, grad)
        row.update(snrs)
        row["Check"] = "PASS" if ok else "FAIL"
        if device.type == "cuda":
            torch.cuda.empty_cache()

        ap, bp = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
        t, p = bench_pair(
            (lambda: variant.op(a, b, ta, tb), (a, b)),
            (lambda: variant.peer(ap, bp, ta, tb), (ap, bp)),
            grad,
            warmup=args.warmup_ms,
            rep=args.rep_ms,
            device=device,
        )
    except Exception as e:
        print(f"  ERROR: {type(e).__name__}: {e}")
        if os.environ.get("BENCH_TRACEBACK"):
            traceback.print_exc()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return row

    fwd_flops, bwd_flops = 2.0 * m * n * k, 4.0 * m * n * k
    fwd, bwd = t[Mode.FWD], t[Mode.BWD]
    step_ms = fwd.median_ms + bwd.median_ms
    peer_step_ms = p[Mode.FWD].median_ms + p[Mode.BWD].median_ms
    row.update(
        {
            "Forward Time (ms)": fwd.median_ms,
            "Forward Time Stddev (ms)": fwd.stddev_ms,
            "Forward TFLOPS": tflops(fwd_flops, fwd.median_ms),
            "Backward Time (ms)": bwd.median_ms,
            "Backward Time Stddev (ms)": bwd.stddev_ms,
            "Backward TFLOPS": tflops(bwd_flops, bwd.median_ms),
            "Step Time (ms)": step_ms,
            "Step TFLOPS": tflops(fwd_flops + bwd_flops, step_ms),
            "torch Forward Time (ms)": p[Mode.FWD].median_ms,
            "torch Forward TFLOPS": tflops(fwd_flops, p[Mode.FWD].median_ms),
            "torch Backward Time (ms)": p[Mode.BWD].median_ms,
            "torch Backward TFLOPS": tflops(bwd_flops, p[Mode.BWD].median_ms),
            "torch Step TFLOPS": tflops(fwd_flops + bwd_flops, peer_step_ms),
        }
    )
    for name in ("Forward", "Backward", "Step"):
        row[f"{name} Ratio"] = ratio(row[f"{name} TFLOPS"], row[f"torch {name} TFLOPS"])
    return row


def run_overhead(variant: Variant, args: argparse.Namespace, info: DeviceInfo, results: Results):
    """Wall-clock microseconds per call of many back-to-back small GEMMs (dispatch-bound)."""
    m, n, k = args.overhead_shape
    device = info.device
    iters = args.overhead_iters or (2000 if info.is_gpu else 20)
    rounds = 6 if info.is_gpu else 2
    for requires_grad in (False, True):
        torch.manual_seed(0)
        a = torch.randn((m, k), dtype=variant.dtype, device=device, requires_grad=requires_grad)
        b = torch.randn((n, k), dtype=variant.dtype, device=device, requires_grad=requires_grad)
        calls = {
            name: functools.partial(fn, a, b, False, True)
            for name, fn in (("turbo", variant.op), ("torch", variant.peer))
        }
        for call in calls.values():
            for _ in range(20):
                call()
        synchronize(device)
        samples: dict[str, list[float]] = {name: [] for name in calls}
        for r in range(rounds):  # interleaved, alternating order: drift reaches both alike
            for name in calls if r % 2 == 0 else reversed(calls):
                samples[name].append(time_loop_ms(calls[name], iters, device) * 1e3)
        per_call_us = {name: statistics.median(v) for name, v in samples.items()}
        row = {
            "Case": "overhead",
            "Mode": "fwd (requires_grad)" if requires_grad else "fwd (no grad)",
            "M": m,
            "N": n,
            "K": k,
            "Dtype": variant.name,
            "Backend": args.backend,
            "Resolved Backend": resolved_backend(a, b, False, True),
            "Iters": iters,
            "Turbo (us/call)": per_call_us["turbo"],
            "torch.matmul (us/call)": per_call_us["torch"],
            "Overhead (us)": per_call_us["turbo"] - per_call_us["torch"],
        }
        results.add(row)
        print(
            f"{row['Mode']:>20}: ops.gemm {row['Turbo (us/call)']:.2f} us/call, torch.matmul "
            f"{row['torch.matmul (us/call)']:.2f} us/call, "
            f"difference {row['Overhead (us)']:+.2f} us"
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dtype", choices=sorted(VARIANTS), default="bf16")
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="auto: the library's own dispatch (env var / autotune / default); else pinned",
    )
    p.add_argument("--models", nargs="+", default=None, help="model names (config.DENSE_MODELS)")
    p.add_argument("--mbs", type=int, default=1, help="micro-batch size: M = seqlen * MBS")
    p.add_argument("--layout", choices=sorted(LAYOUTS), default="NT")
    p.add_argument("--max-cases", type=int, default=None, help="run only the first N cases")
    p.add_argument("--overhead", action="store_true", help="measure dispatch overhead only")
    p.add_argument("--overhead-shape", type=int, nargs=3, default=(256, 256, 256))
    p.add_argument("--overhead-iters", type=int, default=None, help="calls per timed loop")
    add_common_args(p)
    args = p.parse_args(argv)
    if args.models:
        args.models = [x for item in args.models for x in item.split(",") if x]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    profile, info = resolve_profile(args.profile)
    variant = VARIANTS[args.dtype]
    GlobalBackendManager.reset()
    if args.backend != "auto":
        GlobalBackendManager.set_gemm_backend(BackendType.parse(args.backend))
    elif os.environ.get("PRIMUS_TURBO_GEMM_BACKEND"):
        env = os.environ["PRIMUS_TURBO_GEMM_BACKEND"]
        print(f"note: auto honours PRIMUS_TURBO_GEMM_BACKEND={env}")
    print(info.banner())
    print(f"profile: {profile} | dtype {variant.name} | backend {args.backend} | {args.layout}")
    notice = cpu_notice(info)
    if notice:
        print(notice)

    results = Results(info)
    tag = f"{variant.tag}_{args.backend}" + ("" if args.layout == "NT" else f"_{args.layout}")
    if args.overhead:
        run_overhead(variant, args, info, results)
        name = f"gemm_turbo_overhead_{tag}_{info.date_compact}_{info.gpu}.csv"
        path = results.write_csv(output_path(args.output, name))
        print(f"Results saved to {path}")
        return 0

    if profile == "cpu" and args.models:
        print("note: --models is ignored by the cpu profile")
    cases = dense_gemm_cases(args.models, args.mbs, profile)[: args.max_cases]
    for test_id, case in shard(cases, args.num_shards, args.shard_id):
        print(f"[{test_id}/{len(cases)}] {case.label} M={case.m} N={case.n} K={case.k}")
        row = results.add(run_case(test_id, case, variant, args, info))
        print(
            f"  {row['Check']} ({row['Resolved Backend']}) fwd {row['Forward TFLOPS']:.2f} "
            f"bwd {row['Backward TFLOPS']:.2f} TFLOPS | vs {variant.peer_name} x"
            f"{row['Forward Ratio']:.3f} / x{row['Backward Ratio']:.3f} | SNR out "
            f"{row['out_snr']:.1f} da {row['da_snr']:.1f} db {row['db_snr']:.1f} dB"
        )

    print()
    print(results.markdown(TABLE_COLUMNS))
    passed = lambda r: r["Check"] == "PASS"  # noqa: E731
    print(
        f"\nGeomean over {len(results.column('Check', passed))}/{len(results.rows)} PASS rows: "
        f"turbo TFLOPS fwd {geomean(results.column('Forward TFLOPS', passed)):.4g} "
        f"bwd {geomean(results.column('Backward TFLOPS', passed)):.4g} "
        f"step {geomean(results.column('Step TFLOPS', passed)):.4g}; "
        f"ratio vs {variant.peer_name} fwd {geomean(results.column('Forward Ratio', passed)):.3f} "
        f"bwd {geomean(results.column('Backward Ratio', passed)):.3f} "
        f"step {geomean(results.column('Step Ratio', passed)):.3f}"
    )
    if notice:
        print(notice)
    name = f"gemm_turbo_{tag}_{info.date_compact}_{info.gpu}.csv"
    path = results.write_csv(output_path(args.output, name, args.num_shards, args.shard_id))
    print(f"Results saved to {path}")
    return 0 if all(r["Check"] == "PASS" for r in results.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
