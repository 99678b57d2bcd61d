"""Smoke tests of the benchmark scripts on the CPU (tiny shapes, subprocesses) and of the
shared harness's pure helpers.

The scripts are run the way users run them (``python benchmark/...``), forced onto the CPU
profile so the test means the same on a GPU machine; each run takes a few seconds.
"""

from __future__ import annotations

import csv
import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmark"
QUICK = BENCH / "quick_test_bench.py"
GEMM = BENCH / "ops" / "training" / "bench_gemm_turbo.py"
SUITE = BENCH / "run_suite.py"

# The seed's summary schema (shared/seeds/000_e7e66ebb8afec5b5.txt); byte-exact.
QUICK_HEADER = (
    "label,B,M,N,K,Check,Forward TFLOPS,Forward TFLOPS_stddev,Backward TFLOPS,"
    "Backward TFLOPS_stddev,Forward Time (ms),Backward Time (ms),out_snr,da_snr,db_snr"
)
TIMEOUT_S = 120  # each run takes ~5-10 s (mostly `import torch`); generous for loaded CI hosts


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, mod)  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


harness = _load("bench_harness_under_test", BENCH / "harness.py")


def _run(script: Path, *args: str, backend: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_TURBO_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if backend is not None:
        env["PRIMUS_TURBO_GEMM_BACKEND"] = backend
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def _read_csv(path: Path) -> tuple[str, list[dict[str, str]]]:
    text = path.read_text()
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return text.splitlines()[0], rows


def _is_float(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


# ------------------------------------------------------------------------------------------
# quick_test_bench.py
# ------------------------------------------------------------------------------------------
def test_quick_bench_cpu_summary_csv(tmp_path):
    out = tmp_path / "quick.csv"
    args = ("--cpu-smoke", "--repeats", "2", "--iters-per-repeat", "3", "--summary-csv", str(out))
    proc = _run(QUICK, *args, backend="TORCH")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    header, rows = _read_csv(out)
    assert header == QUICK_HEADER
    assert rows, "no rows written"
    for row in rows:
        assert row["Check"] == "PASS", row
        assert row["B"] == "1"
        for col in ("M", "N", "K"):
            assert int(row[col]) > 0
        for col in QUICK_HEADER.split(",")[6:]:
            assert _is_float(row[col]), (col, row[col])
            assert math.isfinite(float(row[col])), (col, row[col])
        assert float(row["out_snr"]) > harness.SNR_THRESHOLD_DB["bf16"]
    assert "Geomean over" in proc.stdout


def test_quick_bench_requires_backend_env(tmp_path):
    proc = _run(QUICK, "--cpu-smoke", "--summary-csv", str(tmp_path / "q.csv"))
    assert proc.returncode == 2
    assert "PRIMUS_TURBO_GEMM_BACKEND" in proc.stderr
    assert not (tmp_path / "q.csv").exists()


def test_quick_bench_failed_backend_writes_nan_rows(tmp_path):
    # HIPBLASLT cannot take CPU tensors: every shape must become a NaN row with Check=FAIL.
    out = tmp_path / "q.csv"
    args = ("--cpu-smoke", "--repeats", "2", "--iters-per-repeat", "1", "--summary-csv", str(out))
    proc = _run(QUICK, *args, backend="HIPBLASLT")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    header, rows = _read_csv(out)
    assert header == QUICK_HEADER
    for row in rows:
        assert row["Check"] == "FAIL"
        assert math.isnan(float(row["Forward TFLOPS"]))


# ------------------------------------------------------------------------------------------
# bench_gemm_turbo.py
# ------------------------------------------------------------------------------------------
GEMM_NUMERIC = (
    "TestID",
    "MBS",
    "M",
    "N",
    "K",
    "Forward Time (ms)",
    "Forward TFLOPS",
    "Backward Time (ms)",
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
)


@pytest.mark.parametrize("backend,layout", [("TORCH", "NT"), ("auto", "TN")])
def test_gemm_bench_cpu_profile(tmp_path, backend, layout):
    out = tmp_path / "gemm.csv"
    args = ("--profile", "cpu", "--backend", backend, "--layout", layout, "--max-cases", "2")
    proc = _run(GEMM, *args, "--warmup-ms", "1", "--rep-ms", "3", "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _, rows = _read_csv(out)
    assert len(rows) == 2
    for row in rows:
        assert row["Check"] == "PASS", row
        assert row["Backend"] == backend and row["Layout"] == layout
        assert row["Resolved Backend"] == "TORCH"  # the default dispatch on CPU tensors
        assert row["Platform"] == "CPU" and row["GPU"] == "cpu"
        assert row["torch"] == torch.__version__
        for col in GEMM_NUMERIC:
            assert _is_float(row[col]), (col, row[col])
            assert float(row[col]) > 0, (col, row[col])
    assert "NOT performance figures" in proc.stdout
    assert "Geomean over 2/2 PASS rows" in proc.stdout


def test_gemm_bench_overhead_mode(tmp_path):
    out = tmp_path / "overhead.csv"
    args = ("--profile", "cpu", "--overhead", "--overhead-shape", "32", "32", "32")
    proc = _run(GEMM, *args, "--overhead-iters", "5", "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _, rows = _read_csv(out)
    assert [r["Mode"] for r in rows] == ["fwd (no grad)", "fwd (requires_grad)"]
    for row in rows:
        turbo_us, torch_us = float(row["Turbo (us/call)"]), float(row["torch.matmul (us/call)"])
        assert turbo_us > 0 and torch_us > 0
        assert float(row["Overhead (us)"]) == pytest.approx(turbo_us - torch_us, rel=1e-3, abs=0.01)


def test_suite_lists_tasks():
    proc = _run(SUITE, "--list")
    assert proc.returncode == 0, proc.stderr
    assert "cpu_gemm_bf16_auto" in proc.stdout and "gemm_bf16_triton" in proc.stdout


# ------------------------------------------------------------------------------------------
# harness helpers (in process)
# ------------------------------------------------------------------------------------------
def test_compute_snr():
    ref = torch.randn(1000, dtype=torch.float64)
    assert harness.compute_snr(ref, ref) == math.inf
    assert harness.compute_snr(ref, ref * 1.01) == pytest.approx(40.0, abs=1e-6)
    assert harness.compute_snr(ref, ref.bfloat16()) > harness.SNR_THRESHOLD_DB["bf16"]


def test_check_allclose_is_scale_free():
    ref = torch.randn(64, 64) * 1e4
    assert harness.check_allclose(ref.bfloat16(), ref, torch.bfloat16)
    assert not harness.check_allclose(ref.bfloat16() * 1.1, ref, torch.bfloat16)


def test_geomean_shard_names():
    assert harness.geomean([1.0, 4.0, math.nan, 0.0]) == pytest.approx(2.0)
    assert math.isnan(harness.geomean([]))
    assert harness.shard(list("abcde"), 2, 1) == [(2, "b"), (4, "d")]
    with pytest.raises(ValueError):
        harness.shard([1], 2, 2)
    assert harness.short_gpu_name("NVIDIA H200") == "H200"
    assert harness.short_gpu_name("AMD Instinct MI300X") == "MI300X"
    assert harness.output_path(None, "x.csv", 4, 3).name == "x.part-3.csv"


def test_results_csv_keeps_numbers(tmp_path):
    res = harness.Results(harness.device_info(force_cpu=True))
    res.add({"Case": "a", "M": 8, "Forward TFLOPS": 1.23456789, "Check": "PASS"})
    res.add({"Case": "b", "M": 16, "Forward TFLOPS": math.nan, "Check": "ERROR"})
    path = res.write_csv(tmp_path / "r.csv")
    header, rows = _read_csv(path)
    assert header.split(",")[:4] == ["Case", "M", "Forward TFLOPS", "Check"]
    assert header.split(",")[-5:] == ["Platform", "GPU", "torch", "triton", "date"]
    assert float(rows[0]["Forward TFLOPS"]) == pytest.approx(1.23457)
    assert math.isnan(float(rows[1]["Forward TFLOPS"]))
    assert "| Case |" in res.markdown()


def test_time_ms_cpu():
    t = harness.time_ms(lambda: sum(range(1000)), 1.0, 3.0, device=torch.device("cpu"))
    assert t.median_ms > 0 and t.stddev_ms >= 0


def test_bench_timing_env_validated(monkeypatch):
    """PRIMUS_TURBO_BENCH_TIMING (read at the first timing_mode()): eager/graph, else an error
    naming the variable, the modes and the value."""
    monkeypatch.setitem(harness._TIMING, "mode", None)
    monkeypatch.setenv("PRIMUS_TURBO_BENCH_TIMING", "cuda-graph")
    with pytest.raises(
        ValueError, match=r"PRIMUS_TURBO_BENCH_TIMING .*'eager', 'graph'.*'cuda-graph'"
    ):
        harness.timing_mode()
    monkeypatch.setenv("PRIMUS_TURBO_BENCH_TIMING", "graph")
    assert harness.timing_mode() == "graph"
    monkeypatch.delenv("PRIMUS_TURBO_BENCH_TIMING")
    monkeypatch.setitem(harness._TIMING, "mode", None)
    assert harness.timing_mode() == "eager"
