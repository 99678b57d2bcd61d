#!/usr/bin/env bash
# One lent-GPU session in one call: install (builds the C++/CUDA extension), env facts, GPU tests,
# benchmark suite.
# Usage (device tool): bash scripts/gpu_run.sh [tests|bench|explore|all]
# Knobs (environment):
#   TEST_BUDGET (s, default 240), TEST_PATHS (default "tests"), TEST_ARGS (extra pytest args),
#   BENCH_BUDGET (s, default 300), BENCH_ARGS (e.g. "-g gemm_bf16 -g rmsnorm"), EXPLORE_ARGS.
# Everything lands in $OUT as a few files: env.txt, build.log, tests.log, suite.log, bench.tgz,
# explore.log.
set -uo pipefail
OUT=${OUT:-build/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export MAX_JOBS=${MAX_JOBS:-16}
what=${1:-all}
start=$(date +%s)
python3 -m pip install -v --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1
echo "install rc=$? in $(($(date +%s) - start)) s"
{
  python3 scripts/env_check.py
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
} >"$OUT/env.txt" 2>&1
if [[ $what == tests || $what == all ]]; then
  t0=$(date +%s)
  # shellcheck disable=SC2086  # TEST_PATHS / TEST_ARGS are lists
  timeout "${TEST_BUDGET:-240}" python3 -m pytest ${TEST_PATHS:-tests} -n 8 --timeout=600 -q \
    -rfE -p no:cacheprovider ${TEST_ARGS:-} >"$OUT/tests.log" 2>&1
  echo "tests rc=$? (124 = budget reached) in $(($(date +%s) - t0)) s"
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -25
fi
if [[ $what == bench || $what == all ]]; then
  t0=$(date +%s)
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
  timeout "${BENCH_BUDGET:-300}" python3 benchmark/run_suite.py -d /tmp/bench ${BENCH_ARGS:-} \
    >"$OUT/suite.log" 2>&1
  echo "bench rc=$? (124 = budget reached) in $(($(date +%s) - t0)) s"
  grep -iE "geomean|us/call|FAIL" "$OUT/suite.log" | tail -40
  tar czf "$OUT/bench.tgz" -C /tmp bench
fi
if [[ $what == explore ]]; then
  # shellcheck disable=SC2086
  python3 scripts/gemm_explore.py ${EXPLORE_ARGS:-} >"$OUT/explore.log" 2>&1
  tail -15 "$OUT/explore.log"
fi
