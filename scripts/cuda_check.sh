#!/usr/bin/env bash
# Compile every CUDA kernel of the torch-free kernels library (csrc/kernels/*.cu) for the H200
# (sm_90) with the flags setup.py gives nvcc, on a machine without a GPU: a compile error here
# would otherwise surface only when `pip install -e .` runs on the GPU machine, and lose that
# call. Fails on a compile error; prints the most registers per file and names every kernel
# that spills (a warning: RMSNorm bwd_persist spills 12-24 B and the C++ forward tile kernel,
# not the default forward, 52-84 B; both measured on the H200 as they are).
# Skips (rc 0) where nvcc is not installed. CUDA_CHECK_ARCH=NN picks another arch (default 90a,
# what setup.py builds for an H100 / H200: the Hopper grouped GEMM's wgmma code needs it).
set -uo pipefail
NVCC=${NVCC:-$(command -v nvcc || true)}
if [ -z "$NVCC" ]; then
  echo "cuda-check: no nvcc on this machine, skipped"
  exit 0
fi
arch=${CUDA_CHECK_ARCH:-90a}
sm90a=()
[ "$arch" = 90a ] && sm90a=(-DPRIMUS_TURBO_SM90A)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
rc=0
for src in csrc/kernels/*.cu; do
  log="$out/$(basename "$src").log"
  if ! "$NVCC" -c -O3 -std=c++17 "-gencode=arch=compute_$arch,code=sm_$arch" \
    --expt-relaxed-constexpr -lineinfo -DPRIMUS_TURBO_WITH_GPU "${sm90a[@]}" -Icsrc/include -Xptxas -v \
    "$src" -o "$out/$(basename "$src").o" >"$log" 2>&1; then
    echo "cuda-check: $src FAILED to compile for sm_$arch:"
    grep -E "error" "$log" | head -20
    rc=1
    continue
  fi
  regs=$(grep -oE "Used [0-9]+ registers" "$log" | awk '{print $2}' | sort -n | tail -1)
  # ptxas -v: "Function properties for NAME" precedes "... N bytes spill stores, M bytes spill loads"
  spilling=$(awk '/Function properties for/ {f = $NF}
    /bytes spill stores/ && !/ 0 bytes spill stores, 0 bytes spill loads/ {print "  spills: " f ": " $0}' "$log")
  echo "cuda-check: $src OK (sm_$arch, max ${regs:-0} registers)"
  [ -n "$spilling" ] && echo "$spilling"
done
exit $rc
