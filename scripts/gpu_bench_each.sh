#!/usr/bin/env bash
# Run benchmark tasks one by one, each under its own time budget, so that one slow task cannot
# eat the whole device call. Usage: bash scripts/gpu_bench_each.sh LABEL:SECONDS [...]
# Logs and CSVs go to /tmp/bench (run_suite's layout); a summary line per task is printed.
set -uo pipefail
for item in "$@"; do
  label=${item%%:*}
  budget=${item##*:}
  t0=$(date +%s)
  timeout "$budget" python3 benchmark/run_suite.py -d /tmp/bench -l "$label" >/dev/null 2>&1
  rc=$?
  echo "== $label rc=$rc ($(($(date +%s) - t0)) s of $budget)"
  grep -iE "geomean|best |FAIL|ERROR|Traceback" "/tmp/bench/logs/$label.log" 2>/dev/null | cut -c1-220 | tail -8
done
