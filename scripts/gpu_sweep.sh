#!/usr/bin/env bash
# One budgeted device call covering every op family: install, GPU tests (verbose, so a budget
# kill still leaves per-test results), then a short benchmark of each family with its own
# time budget. Outputs under $OUT: summary.txt and logs.tgz (build.log, env.txt, tests.log,
# bench_<name>.log): the device tool brings back at most 8 files, so the logs travel as one.
# Usage: TEST_BUDGET=180 bash scripts/gpu_sweep.sh TEST_PATH...
set -uo pipefail
OUT=${OUT:-build/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16}
summary="$OUT/summary.txt"
t0=$(date +%s)
python3 -m pip install -v --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1
echo "install rc=$? $(($(date +%s) - t0)) s" | tee -a "$summary"
{
  python3 scripts/env_check.py
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  g++ --version | head -1
  ldd primus_turbo/pytorch/_C*.so | grep -E 'stdc|gcc_s|gomp'
} >"$OUT/env.txt" 2>&1
t0=$(date +%s)
timeout "${TEST_BUDGET:-180}" python3 -m pytest "$@" -n 8 -v --timeout=300 -p no:cacheprovider \
  -rfE >"$OUT/tests.log" 2>&1
echo "tests rc=$? $(($(date +%s) - t0)) s" | tee -a "$summary"
grep -cE " PASSED" "$OUT/tests.log" | sed 's/^/passed: /' | tee -a "$summary"
grep -E " (FAILED|ERROR) " "$OUT/tests.log" | sed 's/.* \(FAILED\|ERROR\) /\1 /' | sort -u |
  tee -a "$summary"
B=benchmark/ops/training
bench() { # name seconds script args...
  local name=$1 secs=$2
  shift 2
  local t
  t=$(date +%s)
  timeout "$secs" python3 "$@" >"$OUT/bench_$name.log" 2>&1
  echo "bench $name rc=$? $(($(date +%s) - t)) s" | tee -a "$summary"
}
bench rmsnorm 35 $B/bench_rmsnorm_turbo.py --dtype bf16 --backends TURBO,TRITON
bench gemm_ds 40 $B/bench_gemm_turbo.py --dtype bf16 --backend TRITON --models DeepSeek-V3 \
  --max-cases 3
bench attention 50 $B/bench_attention_turbo.py --models Llama-3-8B Llama-3-70B --seqlens 4096 8192
bench grouped_gemm 50 $B/bench_grouped_gemm_turbo.py --dtype bf16 --backend TRITON --max-cases 4
bench fp8_tr 40 $B/bench_gemm_fp8_turbo.py --granularity tensorwise rowwise --backend auto \
  --max-cases 4
bench fp8_block 35 $B/bench_gemm_fp8_turbo.py --granularity blockwise --backend TRITON --max-cases 3
bench quant 30 $B/bench_quantization_turbo.py --profile gpu --max-shapes 2
bench moe 35 $B/bench_moe_turbo.py --part all
bench swiglu 20 $B/bench_activation_turbo.py --act swiglu
(cd "$OUT" && tar czf logs.tgz --remove-files build.log env.txt tests.log bench_*.log)
