#!/usr/bin/env bash
# ncu (hardware counters, clocks left alone) on one launch of each quantization recipe named,
# after a few warm-up calls, plus the copy it is held against:
#   bash scripts/prof_quant.sh 8192 4096 block1x128_dual mx_dual
set -uo pipefail
M=$1 K=$2
shift 2
NCU=$(command -v ncu || find /opt/nvidia/nsight-compute -maxdepth 2 -name ncu -type f 2>/dev/null | head -1)
[ -z "$NCU" ] && { echo "prof_quant: no ncu"; exit 1; }
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --section InstructionStats"
for r in "$@"; do
  echo "=== $r ${M}x${K}"
  # shellcheck disable=SC2086
  "$NCU" --clock-control none --kernel-name regex:'quant|tw_|amax' --launch-skip 6 --launch-count 2 \
    $SECTIONS python3 scripts/prof_quant.py "$r" "$M" "$K" 10 2>&1 | grep -v '^==PROF==' | cut -c1-160
done
echo "=== copy ${M}x${K}"
# shellcheck disable=SC2086
"$NCU" --clock-control none --kernel-name regex:'elementwise|copy' --launch-skip 2 --launch-count 1 \
  $SECTIONS python3 -c "
import torch
x = torch.randn($M, $K, device='cuda', dtype=torch.bfloat16)
for _ in range(5): x.clone()
torch.cuda.synchronize()" 2>&1 | grep -v '^==PROF==' | cut -c1-160
