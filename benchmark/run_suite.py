"""Benchmark suite runner (``make bench``): runs the task table for the detected profile.

* gpu profile (a GPU is visible): the model-shape benchmarks, one CSV per task.
* cpu profile (no GPU): tiny shapes on the CPU that exercise every benchmark code path in well
  under a minute. Its numbers are NOT performance figures. (Triton kernels under
  ``TRITON_INTERPRET=1`` take minutes even at 64^3, so the cpu profile uses the TORCH backend and
  the default dispatch.)

    python benchmark/run_suite.py                       # CSVs under benchmark/results/
    python benchmark/run_suite.py -d /tmp/bench -g gemm_bf16
    python benchmark/run_suite.py --list

A new op adds entries to ``TASKS``: ``label`` (unique), ``group`` (for ``-g``), ``profile``
("gpu"/"cpu"), ``script`` (relative to ``benchmark/``), ``args``, ``env`` (extra environment,
e.g. a ``PRIMUS_TURBO_*_BACKEND``), ``output`` (file name; ``{date}``/``{gpu}`` are filled in) and
optionally ``output_flag`` (default ``-o``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
GEMM = "ops/training/bench_gemm_turbo.py"
QUICK = "quick_test_bench.py"

TASKS: list[dict[str, Any]] = [
    # ---- gpu profile -------------------------------------------------------------------------
    {
        "label": "gemm_bf16_auto",
        "group": "gemm_bf16",
        "profile": "gpu",
        "script": GEMM,
        "args": ["--dtype", "bf16", "--backend", "auto"],
        "env": {},
        "output": "gemm_turbo_bf16_auto_{date}_{gpu}.csv",
    },
    {
        "label": "gemm_bf16_triton",
        "group": "gemm_bf16",
        "profile": "gpu",
        "script": GEMM,
        "args": ["--dtype", "bf16", "--backend", "TRITON"],
        "env": {},
        "output": "gemm_turbo_bf16_TRITON_{date}_{gpu}.csv",
    },
    {
        "label": "gemm_bf16_overhead_auto",
        "group": "gemm_overhead",
        "profile": "gpu",
        "script": GEMM,
        "args": ["--dtype", "bf16", "--backend", "auto", "--overhead"],
        "env": {},
        "output": "gemm_turbo_overhead_bf16_auto_{date}_{gpu}.csv",
    },
    {
        "label": "gemm_bf16_overhead_triton",
        "group": "gemm_overhead",
        "profile": "gpu",
        "script": GEMM,
        "args": ["--dtype", "bf16", "--backend", "TRITON", "--overhead"],
        "env": {},
        "output": "gemm_turbo_overhead_bf16_TRITON_{date}_{gpu}.csv",
    },
    {
        "label": "quick_gemm_bf16_triton",
        "group": "quick",
        "profile": "gpu",
        "script": QUICK,
        "args": [],
        "env": {"PRIMUS_TURBO_GEMM_BACKEND": "TRITON"},
        "output": "quick_gemm_bf16_TRITON_{date}_{gpu}.csv",
        "output_flag": "--summary-csv",
    },
    {
        "label": "rmsnorm_bf16",
        "group": "rmsnorm",
        "profile": "gpu",
        "script": "ops/training/bench_rmsnorm_turbo.py",
        "args": ["--dtype", "bf16", "--backends", "TURBO,TRITON,TORCH"],
        "env": {},
        "output": "rmsnorm_turbo_bf16_{date}_{gpu}.csv",
    },
    {
        # A/B: the C++ backend with its previous kernels (one row per block forward, backward
        # without row prefetch); compare with the TURBO rows of rmsnorm_bf16.
        "label": "rmsnorm_bf16_cpp_prev",
        "group": "rmsnorm",
        "profile": "gpu",
        "script": "ops/training/bench_rmsnorm_turbo.py",
        "args": ["--dtype", "bf16", "--backends", "TURBO"],
        "env": {"PRIMUS_TURBO_RMSNORM_CPP_PERSIST": "0"},
        "output": "rmsnorm_turbo_bf16_cpp_prev_{date}_{gpu}.csv",
    },
    {
        # A/B: the C++ backend with the persistent 512-thread-per-row kernels (the default before
        # the "tiles" plan); compare with the TURBO rows of rmsnorm_bf16.
        "label": "rmsnorm_bf16_cpp_persist",
        "group": "rmsnorm",
        "profile": "gpu",
        "script": "ops/training/bench_rmsnorm_turbo.py",
        "args": ["--dtype", "bf16", "--backends", "TURBO"],
        "env": {"PRIMUS_TURBO_RMSNORM_CPP_PLAN": "persist"},
        "output": "rmsnorm_turbo_bf16_cpp_persist_{date}_{gpu}.csv",
    },
    {
        "label": "attention_bf16",
        "group": "attention",
        "profile": "gpu",
        "script": "ops/training/bench_attention_turbo.py",
        "args": ["--profile", "gpu"],
        "env": {},
        "output": "attention_turbo_bf16_{date}_{gpu}.csv",
    },
    {
        "label": "gemm_fp8_tensor_row_auto",
        "group": "gemm_fp8",
        "profile": "gpu",
        "script": "ops/training/bench_gemm_fp8_turbo.py",
        "args": ["--granularity", "tensorwise", "rowwise", "--backend", "auto"],
        "env": {},
        "output": "gemm_fp8_turbo_gemm_tensorwise-rowwise_auto_{date}_{gpu}.csv",
    },
    {
        "label": "gemm_fp8_blockwise_triton",
        "group": "gemm_fp8",
        "profile": "gpu",
        "script": "ops/training/bench_gemm_fp8_turbo.py",
        "args": ["--granularity", "blockwise", "--backend", "TRITON"],
        "env": {},
        "output": "gemm_fp8_turbo_gemm_blockwise_TRITON_{date}_{gpu}.csv",
    },
    {
        "label": "linear_fp8_8192",
        "group": "gemm_fp8",
        "profile": "gpu",
        "script": "ops/training/bench_gemm_fp8_turbo.py",
        "args": ["--suite", "linear", "--linear-size", "8192"],
        "env": {},
        "output": "gemm_fp8_turbo_linear_tensorwise-rowwise-blockwise_auto_{date}_{gpu}.csv",
    },
    {
        "label": "quantization_fp8",
        "group": "quantization",
        "profile": "gpu",
        "script": "ops/training/bench_quantization_turbo.py",
        "args": ["--profile", "gpu", "--max-shapes", "2"],  # <= 40 s: 6 dynamic compiles
        "env": {},
        "output": "quantization_turbo_{date}_{gpu}.csv",
    },
    # ---- cpu profile (code-path smoke; not performance) --------------------------------------
    {
        "label": "cpu_attention_bf16",
        "group": "attention",
        "profile": "cpu",
        "script": "ops/training/bench_attention_turbo.py",
        "args": ["--profile", "cpu"],
        "env": {"TRITON_INTERPRET": "1"},
        "output": "attention_turbo_bf16_{date}_{gpu}.csv",
    },
    {
        "label": "cpu_rmsnorm_bf16",
        "group": "rmsnorm",
        "profile": "cpu",
        "script": "ops/training/bench_rmsnorm_turbo.py",
        "args": ["--profile", "cpu", "--dtype", "bf16", "--backends", "auto,TURBO,TORCH"],
        "env": {},
        "output": "rmsnorm_turbo_bf16_{date}_{gpu}.csv",
    },
    {
        "label": "cpu_gemm_bf16_auto",
        "group": "gemm_bf16",
        "profile": "cpu",
        "script": GEMM,
        "args": ["--profile", "cpu", "--dtype", "bf16", "--backend", "auto"],
        "env": {},
        "output": "gemm_turbo_bf16_auto_{date}_{gpu}.csv",
    },
    {
        "label": "cpu_gemm_bf16_torch",
        "group": "gemm_bf16",
        "profile": "cpu",
        "script": GEMM,
        "args": ["--profile", "cpu", "--dtype", "bf16", "--backend", "TORCH", "--layout", "NN"],
        "env": {},
        "output": "gemm_turbo_bf16_TORCH_NN_{date}_{gpu}.csv",
    },
    {
        "label": "cpu_gemm_bf16_overhead_auto",
        "group": "gemm_overhead",
        "profile": "cpu",
        "script": GEMM,
        "args": ["--profile", "cpu", "--dtype", "bf16", "--backend", "auto", "--overhead"],
        "env": {},
        "output": "gemm_turbo_overhead_bf16_auto_{date}_{gpu}.csv",
    },
    {
        "label": "cpu_quick_gemm_bf16_torch",
        "group": "quick",
        "profile": "cpu",
        "script": QUICK,
        "args": ["--cpu-smoke"],
        "env": {"PRIMUS_TURBO_GEMM_BACKEND": "TORCH"},
        "output": "quick_gemm_bf16_TORCH_{date}_{gpu}.csv",
        "output_flag": "--summary-csv",
    },
    # ---- grouped GEMM (MoE experts; non-uniform group sizes) --------------------------------
    {
        "label": "grouped_gemm_bf16_triton",
        "group": "grouped_gemm",
        "profile": "gpu",
        "script": "ops/training/bench_grouped_gemm_turbo.py",
        "args": ["--dtype", "bf16", "--backend", "TRITON"],
        "env": {},
        "output": "grouped_gemm_turbo_bf16_TRITON_{date}_{gpu}.csv",
    },
    {
        "label": "grouped_gemm_bf16_default",
        "group": "grouped_gemm",
        "profile": "gpu",
        "script": "ops/training/bench_grouped_gemm_turbo.py",
        "args": ["--dtype", "bf16", "--backend", "auto"],
        "env": {},
        "output": "grouped_gemm_turbo_bf16_auto_{date}_{gpu}.csv",
    },
    {
        "label": "grouped_gemm_bf16_triton_tma",
        "group": "grouped_gemm_tma",
        "profile": "gpu",
        "script": "ops/training/bench_grouped_gemm_turbo.py",
        "args": ["--dtype", "bf16", "--backend", "TRITON"],
        "env": {"PRIMUS_TURBO_GROUPED_GEMM_TMA": "1"},
        "output": "grouped_gemm_turbo_bf16_TRITON_tma_{date}_{gpu}.csv",
    },
    {
        "label": "grouped_gemm_fp8_rowwise_triton",
        "group": "grouped_gemm",
        "profile": "gpu",
        "script": "ops/training/bench_grouped_gemm_turbo.py",
        "args": ["--dtype", "bf16", "--backend", "TRITON", "--fp8", "rowwise", "--skip-check"],
        "env": {},
        "output": "grouped_gemm_turbo_bf16_fp8rowwise_TRITON_{date}_{gpu}.csv",
    },
    {
        "label": "grouped_gemm_fp8_rowwise_vendor",
        "group": "grouped_gemm",
        "profile": "gpu",
        "script": "ops/training/bench_grouped_gemm_turbo.py",
        "args": ["--dtype", "bf16", "--backend", "HIPBLASLT", "--fp8", "rowwise", "--skip-check"],
        "env": {},
        "output": "grouped_gemm_turbo_bf16_fp8rowwise_HIPBLASLT_{date}_{gpu}.csv",
    },
    {
        "label": "grouped_gemm_fp8_rowwise_pieces",
        "group": "grouped_gemm_fp8",
        "profile": "gpu",
        "script": "ops/training/bench_grouped_gemm_turbo.py",
        "args": [
            "--backend",
            "TRITON",
            "--fp8",
            "rowwise",
            "--fp8-kernels",
            "--kernels-only",
            "--skip-check",
        ],
        "env": {},
        "output": "grouped_gemm_turbo_bf16_fp8rowwise_pieces_{date}_{gpu}.csv",
    },
    {
        "label": "grouped_gemm_fp8_rowwise_prequant",
        "group": "grouped_gemm_fp8",
        "profile": "gpu",
        "script": "ops/training/bench_grouped_gemm_turbo.py",
        "args": [
            "--backend",
            "TRITON",
            "--fp8",
            "rowwise",
            "--fp8-weights",
            "prequant",
            "--fwd-only",
            "--peers",
            "turbo_bf16",
            "turbo_fp8",
            "--skip-check",
        ],
        "env": {},
        "output": "grouped_gemm_turbo_bf16_fp8rowwise_prequant_TRITON_{date}_{gpu}.csv",
    },
    {
        "label": "cpu_grouped_gemm_bf16_torch",
        "group": "grouped_gemm",
        "profile": "cpu",
        "script": "ops/training/bench_grouped_gemm_turbo.py",
        "args": ["--profile", "cpu", "--dtype", "bf16", "--backend", "TORCH"],
        "env": {},
        "output": "grouped_gemm_turbo_bf16_TORCH_{date}_{gpu}.csv",
    },
    # ---- MoE routing ops, MoE layer, gated activations (issue 5 part B) ---------------------
    {
        "label": "moe_permute_layer_bf16",
        "group": "moe",
        "profile": "gpu",
        "script": "ops/training/bench_moe_turbo.py",
        "args": ["--part", "all"],
        "env": {},
        "output": "moe_turbo_{date}_{gpu}.csv",
    },
    {
        "label": "moe_layer_fp8_rowwise",
        "group": "moe",
        "profile": "gpu",
        "script": "ops/training/bench_moe_turbo.py",
        "args": ["--part", "layer", "--fp8", "rowwise"],
        "env": {},
        "output": "moe_turbo_layer_fp8_rowwise_{date}_{gpu}.csv",
    },
    # fp8 MoE layer (defaults: fused activations, weight cache) vs our bf16 layer, graph timing;
    # CPU smoke entries of it and of the pre-quantized fp8 grouped GEMM (session 7, g8)
    {
        "label": "moe_layer_fp8_rowwise_vs_bf16",
        "group": "moe",
        "profile": "gpu",
        "script": "ops/training/bench_moe_turbo.py",
        "args": [
            "--part",
            "layer",
            "--fp8",
            "rowwise",
            "--fp8-weight-cache",
            "--peer",
            "bf16",
            "--timing",
            "graph",
        ],
        "env": {},
        "output": "moe_turbo_layer_fp8_rowwise_vs_bf16_{date}_{gpu}.csv",
    },
    {
        "label": "cpu_moe_layer_fp8_rowwise_vs_bf16",
        "group": "moe",
        "profile": "cpu",
        "script": "ops/training/bench_moe_turbo.py",
        "args": ["--profile", "cpu", "--part", "layer", "--fp8", "rowwise", "--peer", "bf16"],
        "env": {},
        "output": "moe_turbo_layer_fp8_rowwise_vs_bf16_{date}_{gpu}.csv",
    },
    {
        "label": "cpu_grouped_gemm_fp8_rowwise_prequant",
        "group": "grouped_gemm_fp8",
        "profile": "cpu",
        "script": "ops/training/bench_grouped_gemm_turbo.py",
        "args": [
            "--profile",
            "cpu",
            "--fp8",
            "rowwise",
            "--fp8-weights",
            "prequant",
            "--fwd-only",
            "--peers",
            "turbo_bf16",
            "--max-cases",
            "2",
        ],
        "env": {},
        "output": "grouped_gemm_turbo_bf16_fp8rowwise_prequant_TORCH_{date}_{gpu}.csv",
    },
    {
        "label": "activation_swiglu_bf16",
        "group": "activation",
        "profile": "gpu",
        "script": "ops/training/bench_activation_turbo.py",
        "args": ["--act", "swiglu"],
        "env": {},
        "output": "activation_turbo_swiglu_{date}_{gpu}.csv",
    },
    {
        "label": "cpu_moe_permute_layer_bf16",
        "group": "moe",
        "profile": "cpu",
        "script": "ops/training/bench_moe_turbo.py",
        "args": ["--profile", "cpu", "--part", "all"],
        "env": {},
        "output": "moe_turbo_{date}_{gpu}.csv",
    },
    {
        "label": "cpu_activation_swiglu_bf16",
        "group": "activation",
        "profile": "cpu",
        "script": "ops/training/bench_activation_turbo.py",
        "args": ["--profile", "cpu", "--act", "swiglu"],
        "env": {},
        "output": "activation_turbo_swiglu_{date}_{gpu}.csv",
    },
    {
        "label": "cpu_gemm_fp8_auto",
        "group": "gemm_fp8",
        "profile": "cpu",
        "script": "ops/training/bench_gemm_fp8_turbo.py",
        "args": ["--profile", "cpu", "--max-cases", "2"],
        "env": {},
        "output": "gemm_fp8_turbo_gemm_tensorwise-rowwise-blockwise_auto_{date}_{gpu}.csv",
    },
    {
        "label": "cpu_linear_fp8",
        "group": "gemm_fp8",
        "profile": "cpu",
        "script": "ops/training/bench_gemm_fp8_turbo.py",
        "args": [
            "--profile",
            "cpu",
            "--suite",
            "linear",
            "--granularity",
            "tensorwise",
            "blockwise",
        ],
        "env": {},
        "output": "gemm_fp8_turbo_linear_tensorwise-blockwise_auto_{date}_{gpu}.csv",
    },
    {
        "label": "cpu_quantization_fp8",
        "group": "quantization",
        "profile": "cpu",
        "script": "ops/training/bench_quantization_turbo.py",
        "args": ["--profile", "cpu", "--max-shapes", "2"],
        "env": {},
        "output": "quantization_turbo_{date}_{gpu}.csv",
    },
]

CPU_NOTICE = (
    "CPU profile: tiny shapes on the CPU, TORCH backend and default dispatch. These runs check "
    "that every benchmark code path works; the numbers are NOT performance figures."
)


def detect() -> tuple[bool, str]:
    """``(gpu visible, short device name)`` via the shared harness."""
    sys.path.insert(0, str(BENCH_DIR))
    from harness import device_info

    info = device_info()
    return info.is_gpu, info.gpu


def select(
    profile: str, groups: list[str] | None, labels: list[str] | None
) -> list[dict[str, Any]]:
    tasks = [t for t in TASKS if t["profile"] == profile]
    if groups:
        tasks = [t for t in tasks if t["group"] in groups]
    if labels:
        tasks = [t for t in tasks if t["label"] in labels]
    return tasks


def run_task(task: dict[str, Any], out_dir: Path, gpu: str, date: str) -> tuple[int, float, Path]:
    """Run one task, streaming its output to the console and to ``<out_dir>/logs/<label>.log``."""
    output = out_dir / task["output"].format(date=date, gpu=gpu)
    cmd = [sys.executable, str(BENCH_DIR / task["script"]), *task["args"]]
    cmd += [task.get("output_flag", "-o"), str(output)]
    env = {**os.environ, **task.get("env", {})}
    pythonpath = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + pythonpath if pythonpath else "")
    log_path = out_dir / "logs" / f"{task['label']}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    extra_env = " ".join(f"{k}={v}" for k, v in task.get("env", {}).items())
    print(f"\n=== {task['label']}: {extra_env + ' ' if extra_env else ''}{' '.join(cmd[1:])}")
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            log.write(line)
        rc = proc.wait()
    return rc, time.perf_counter() - t0, output


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("-d", "--output-dir", default=str(BENCH_DIR / "results"))
    p.add_argument("-g", "--group", nargs="+", default=None, help="only these groups")
    p.add_argument("-l", "--label", nargs="+", default=None, help="only these task labels")
    p.add_argument("--profile", choices=("gpu", "cpu"), default=None, help="default: detected")
    p.add_argument("--list", action="store_true", help="list the tasks and exit")
    args = p.parse_args(argv)

    if args.list:
        for t in TASKS:
            print(f"{t['profile']:4} {t['group']:14} {t['label']:28} {t['script']} {t['args']}")
        return 0

    t_start = time.perf_counter()
    has_gpu, gpu = detect()
    profile = args.profile or ("gpu" if has_gpu else "cpu")
    if profile == "gpu" and not has_gpu:
        print("error: --profile gpu but no GPU is visible", file=sys.stderr)
        return 2
    if profile == "cpu":
        gpu = "cpu"
    tasks = select(profile, args.group, args.label)
    if not tasks:
        print(f"error: no {profile} task matches the filters", file=sys.stderr)
        return 2
    out_dir = Path(args.output_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    date = datetime.date.today().strftime("%Y%m%d")
    print(f"profile: {profile} ({gpu}) | {len(tasks)} tasks | output: {out_dir}")
    if profile == "cpu":
        print(CPU_NOTICE)

    summary = []
    for task in tasks:
        rc, secs, output = run_task(task, out_dir, gpu, date)
        summary.append((task["label"], rc, secs, output))

    print(f"\n=== suite summary ({profile} profile)")
    for label, rc, secs, output in summary:
        status = "ok" if rc == 0 else f"FAILED (rc={rc})"
        shown = output.name if output.exists() else "(no output)"
        print(f"  {label:30} {status:16} {secs:7.1f} s  {shown}")
    print(f"total {time.perf_counter() - t_start:.1f} s; CSVs and logs under {out_dir}")
    if profile == "cpu":
        print(CPU_NOTICE)
    return 0 if all(rc == 0 for _, rc, _, _ in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
