#!/usr/bin/env bash
# One device-tool session: env facts, GPU test subset, then the step given as $1.
# Usage on the lent GPU: bash scripts/gpu_run.sh [tests|explore|bench|all]
set -uo pipefail
OUT=${OUT:-build/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
what=${1:-all}
python3 -m pip install -q --no-build-isolation --no-deps -e . >"$OUT/install.log" 2>&1 || cat "$OUT/install.log"
python3 scripts/env_check.py 2>&1 | tee "$OUT/env.txt"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee -a "$OUT/env.txt"
if [[ $what == tests || $what == all ]]; then
  python3 -m pytest tests -n 8 --timeout=600 -q -x 2>&1 | tee "$OUT/tests.log" | tail -25
  python3 -m pytest tests -n 4 --timeout=600 -q --deterministic-only 2>&1 | tee "$OUT/tests_det.log" | tail -5
fi
if [[ $what == explore || $what == all ]]; then
  python3 scripts/gemm_explore.py ${EXPLORE_ARGS:-} 2>&1 | tee "$OUT/explore.log" | tail -20
fi
if [[ $what == bench || $what == all ]]; then
  python3 benchmark/run_suite.py -d "$OUT/bench" 2>&1 | tee "$OUT/bench.log" | tail -60
fi
