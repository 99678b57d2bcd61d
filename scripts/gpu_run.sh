#!/usr/bin/env bash
# One lent-GPU session in one call: install, env facts, GPU tests, benchmark suite.
# Usage (device tool): bash scripts/gpu_run.sh [tests|bench|explore|all]
# Budgets (seconds) keep the call inside the tool's 10-minute limit:
#   TEST_BUDGET (default 240), BENCH_BUDGET (default 300), BENCH_ARGS (e.g. "-g gemm_bf16").
# Everything lands in $OUT as at most 5 files: env.txt, tests.log, suite.log, bench.tgz, explore.log.
set -uo pipefail
OUT=${OUT:-build/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
what=${1:-all}
python3 -m pip install -q --no-build-isolation --no-deps -e . >/tmp/install.log 2>&1 ||
  cat /tmp/install.log
{
  python3 scripts/env_check.py
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
} >"$OUT/env.txt" 2>&1
if [[ $what == tests || $what == all ]]; then
  timeout "${TEST_BUDGET:-240}" python3 -m pytest tests -n 8 --timeout=600 -q -p no:cacheprovider \
    >"$OUT/tests.log" 2>&1
  echo "tests rc=$? (124 = budget reached)"
  grep -E "passed|failed|FAILED|ERROR" "$OUT/tests.log" | tail -8
fi
if [[ $what == bench || $what == all ]]; then
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
  timeout "${BENCH_BUDGET:-300}" python3 benchmark/run_suite.py -d /tmp/bench ${BENCH_ARGS:-} \
    >"$OUT/suite.log" 2>&1
  echo "bench rc=$? (124 = budget reached)"
  grep -E "Geomean|us/call|  (gemm|quick)" "$OUT/suite.log" | tail -12
  tar czf "$OUT/bench.tgz" -C /tmp bench
fi
if [[ $what == explore ]]; then
  python3 scripts/gemm_explore.py ${EXPLORE_ARGS:-} >"$OUT/explore.log" 2>&1
  tail -15 "$OUT/explore.log"
fi
