#!/usr/bin/env bash
# `make conda-build`: conda packages of primus-turbo into $CONDA_OUT.
#
# * conda-build installed: `conda build recipe/` for every variant of
#   recipe/conda_build_config.yaml (CONDA_GPU_ARCHS="gfx950" builds only that arch set).
# * otherwise (CI and developer machines here): the wheel of this tree, built against the
#   interpreter's torch (GPU_ARCHS=$CONDA_GPU_ARCHS), packed by scripts/conda_pack.py with the
#   recipe's metadata for that variant (a CPU build says `cpu` in its build string).
# Env: PY (python, default python3), CONDA_OUT (default build/conda), CONDA_GPU_ARCHS.
set -euo pipefail

ROOT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT_DIR"
PY=${PY:-python3}
CONDA_OUT=${CONDA_OUT:-build/conda}
CONDA_GPU_ARCHS=${CONDA_GPU_ARCHS:-}

version=$("$PY" -c 'import sys; sys.path.insert(0, "."); import setup; print(setup.get_version()[0])')
export PRIMUS_TURBO_BUILD_VERSION=$version
mkdir -p "$CONDA_OUT"

if command -v conda >/dev/null && conda build --help >/dev/null 2>&1; then
    args=(recipe --output-folder "$CONDA_OUT")
    if [ -n "$CONDA_GPU_ARCHS" ]; then args+=(--variants "{gpu_archs: ['$CONDA_GPU_ARCHS']}"); fi
    echo ">> conda build ${args[*]} (version $version)"
    conda build "${args[@]}"
    exit 0
fi

archs=${CONDA_GPU_ARCHS:-gfx942;gfx950}
echo ">> conda-build not found: wheel + scripts/conda_pack.py (version $version, archs $archs)"
wheel_dir=$(mktemp -d)
trap 'rm -rf "$wheel_dir"' EXIT
GPU_ARCHS=$archs PYTORCH_ROCM_ARCH=$archs \
    "$PY" -m pip wheel --no-build-isolation --no-deps -q -w "$wheel_dir" .
torch_xy=$("$PY" -c 'import torch; print(".".join(torch.__version__.split(".")[:2]))')
pyver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
"$PY" scripts/conda_pack.py --wheel "$wheel_dir"/*.whl --out "$CONDA_OUT" \
    --gpu-archs "$archs" --python "$pyver" --variant "pytorch=$torch_xy"
