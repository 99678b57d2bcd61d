#!/usr/bin/env bash
# One budgeted device call: install, GPU tests (verbose, so a budget kill still leaves per-test
# results) and benchmarks, each under its own time budget. With two visible GPUs the work runs in
# two lanes at once: lane 0 = tests then BENCH_A on GPU 0, lane 1 = BENCH_B on GPU 1 (benchmarks
# of one lane never share a GPU with anything else). With one GPU everything runs in order.
# Outputs under $OUT: summary.txt and logs.tgz (build.log, env.txt, tests.log, bench_<name>.log,
# csv/*.csv): the device tool brings back at most 8 files, so the logs travel as one.
#
#   TESTS="tests/native tests/pytorch" TEST_BUDGET=330 BENCH_A="rmsnorm moe" \
#     BENCH_B="gemm_auto attention" bash scripts/gpu_sweep.sh
#
# TEST_ARGS adds pytest arguments (e.g. "-k 'gemm and not fp8'"); WORKERS sets xdist workers;
# TESTS_B runs a second test set on GPU 1 (lane 1) before BENCH_B (after it and LINES_B with
# TESTS_B_LAST=1). SOLO names benchmarks run
# first, alone on the machine (dispatch-overhead timings are CPU-bound: nothing else may run).
# LINES_A / LINES_B name files of extra commands, one per line: "name|seconds|command" (env
# assignments allowed in front of the command); they run after BENCH_A / BENCH_B.
# Benchmark names: see bench_cmd below.
set -uo pipefail
OUT=${OUT:-build/gpu_out}
mkdir -p "$OUT/csv"
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
summary="$OUT/summary.txt"
B=benchmark/ops/training

say() { echo "$*" | tee -a "$summary"; }
T_START=$(date +%s)
# DEADLINE (seconds after the start, default 540): no step starts after it, and each step's own
# timeout is cut to what is left, so the call ends (and packs its logs) inside the device limit.
left() { echo $((${DEADLINE:-540} - ($(date +%s) - T_START))); }
cap() { # requested seconds -> min(requested, left); prints 0 when under 10 s are left
  local l
  l=$(left)
  if [ "$l" -lt 10 ]; then echo 0; elif [ "$1" -lt "$l" ]; then echo "$1"; else echo "$l"; fi
}

bench_cmd() { # name -> "seconds script args..."
  local c="$OUT/csv/$1.csv"
  case $1 in
  gemm_auto) echo "200 $B/bench_gemm_turbo.py --dtype bf16 --backend auto -o $c" ;;
  gemm_triton) echo "240 $B/bench_gemm_turbo.py --dtype bf16 --backend TRITON -o $c" ;;
  gemm_overhead) echo "40 $B/bench_gemm_turbo.py --dtype bf16 --backend auto --overhead -o $c" ;;
  rmsnorm) echo "50 $B/bench_rmsnorm_turbo.py --dtype bf16 --backends TURBO,TRITON -o $c" ;;
  rmsnorm_persist | rmsnorm_prev) echo "35 $B/bench_rmsnorm_turbo.py --dtype bf16 --backends TURBO -o $c" ;;
  attention) echo "200 $B/bench_attention_turbo.py --budget-s 170 -o $c" ;;
  grouped) echo "100 $B/bench_grouped_gemm_turbo.py --dtype bf16 --backend auto -o $c" ;;
  grouped_triton) echo "100 $B/bench_grouped_gemm_turbo.py --dtype bf16 --backend TRITON -o $c" ;;
  grouped_fp8) echo "80 $B/bench_grouped_gemm_turbo.py --dtype bf16 --fp8 --max-cases 4 -o $c" ;;
  fp8_tr) echo "80 $B/bench_gemm_fp8_turbo.py --granularity tensorwise rowwise --backend auto -o $c" ;;
  fp8_block) echo "80 $B/bench_gemm_fp8_turbo.py --granularity blockwise --backend TRITON -o $c" ;;
  fp8_linear) echo "70 $B/bench_gemm_fp8_turbo.py --suite linear --linear-size 8192 -o $c" ;;
  quant) echo "60 $B/bench_quantization_turbo.py -o $c" ;;
  moe) echo "60 $B/bench_moe_turbo.py --part all -o $c" ;;
  swiglu) echo "30 $B/bench_activation_turbo.py --act swiglu -o $c" ;;
  *) echo "" ;;
  esac
}

bench_env() { # name -> extra environment
  case $1 in
  rmsnorm_persist) echo "PRIMUS_TURBO_RMSNORM_CPP_PLAN=persist" ;;
  rmsnorm_prev) echo "PRIMUS_TURBO_RMSNORM_CPP_PLAN=prev" ;;
  *) echo "PRIMUS_TURBO_NONE=1" ;;
  esac
}

run_bench() { # name
  local spec secs t rc
  spec=$(bench_cmd "$1")
  [ -z "$spec" ] && { say "bench $1: unknown name"; return; }
  secs=$(cap "${spec%% *}")
  [ "$secs" = 0 ] && { say "bench $1: skipped, deadline"; return; }
  t=$(date +%s)
  # shellcheck disable=SC2046,SC2086
  env $(bench_env "$1") timeout "$secs" python3 ${spec#* } >"$OUT/bench_$1.log" 2>&1
  rc=$?
  say "bench $1 rc=$rc $(($(date +%s) - t)) s"
}

run_tests() { # log-name, test paths...
  local t rc log="$OUT/$1.log"
  shift
  t=$(date +%s)
  eval "timeout $(cap "${TEST_BUDGET:-180}") python3 -m pytest $* -n ${WORKERS:-8} -v --timeout=150 \
    -p no:cacheprovider -rfE --durations=40 ${TEST_ARGS:-}" >"$log" 2>&1
  rc=$?
  say "$(basename "$log" .log) rc=$rc $(($(date +%s) - t)) s passed: $(grep -cE " PASSED" "$log")"
  grep -E " (FAILED|ERROR) " "$log" | sed 's/.* \(FAILED\|ERROR\) /\1 /' | sort -u |
    tee -a "$summary"
}

run_lines() { # file of "name|seconds|command" lines
  local name secs cmd t rc
  [ -f "$1" ] || return 0
  while IFS='|' read -r name secs cmd; do
    [ -z "$name" ] && continue
    case $name in "#"*) continue ;; esac
    secs=$(cap "$secs")
    [ "$secs" = 0 ] && { say "line $name: skipped, deadline"; continue; }
    t=$(date +%s)
    timeout "$secs" bash -c "$cmd" >"$OUT/bench_$name.log" 2>&1 </dev/null
    rc=$?
    say "line $name rc=$rc $(($(date +%s) - t)) s"
  done <"$1"
}

lane() { # gpu, test-set (may be empty), tests-last (0/1), lines file, bench names...
  local gpu=$1 tests=$2 last=$3 lines=$4
  shift 4
  export CUDA_VISIBLE_DEVICES=$gpu
  # shellcheck disable=SC2086
  [ -n "${tests// /}" ] && [ "$last" != 1 ] && run_tests "tests_gpu$gpu" $tests
  for name in "$@"; do run_bench "$name"; done
  run_lines "$lines"
  # shellcheck disable=SC2086
  [ -n "${tests// /}" ] && [ "$last" = 1 ] && run_tests "tests_gpu$gpu" $tests
  return 0
}

t0=$(date +%s)
python3 -m pip install -v --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1
say "install rc=$? $(($(date +%s) - t0)) s"
{
  python3 scripts/env_check.py
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  g++ --version | head -1
  echo "CC=${CC:-} CXX=${CXX:-}"
  "${CXX:-c++}" --version | head -1
  "${CXX:-c++}" -print-file-name=libstdc++.so
  grep -E "building with|WARNING: CXX" "$OUT/build.log"
  echo "libstdc++ internals defined in _C: $(nm -C --defined-only primus_turbo/pytorch/_C*.so |
    grep -cE '_M_insert|codecvt')"
  ldd primus_turbo/pytorch/_C*.so | grep -E 'stdc|gcc_s|gomp'
} >"$OUT/env.txt" 2>&1
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
say "gpus: $ngpu"
for name in ${SOLO:-}; do CUDA_VISIBLE_DEVICES=0 run_bench "$name"; done
# shellcheck disable=SC2086
if [ "$ngpu" -ge 2 ]; then
  lane 0 "${TESTS:-}" 0 "${LINES_A:-}" ${BENCH_A:-} &
  lane 1 "${TESTS_B:-}" "${TESTS_B_LAST:-0}" "${LINES_B:-}" ${BENCH_B:-} &
  wait
else
  lane 0 "${TESTS:-} ${TESTS_B:-}" 0 "${LINES_A:-}" ${BENCH_A:-} ${BENCH_B:-}
  run_lines "${LINES_B:-}"
fi
say "total $(($(date +%s) - t0)) s"
(cd "$OUT" && tar czf logs.tgz --remove-files ./*.log env.txt csv)
