#!/usr/bin/env bash
# conda-build build script: the same setup.py build as the wheel, against the host pytorch.
# GPU_ARCHS comes from the variant (meta.yaml script_env); never `native` in a package build.
set -euxo pipefail

case ";${GPU_ARCHS:-};" in
    ";;" | *";native;"*)
        echo "error: GPU_ARCHS must name the arch set (gfx942, gfx950, gfx942;gfx950)" >&2
        exit 1
        ;;
esac
export PYTORCH_ROCM_ARCH="${GPU_ARCHS}"
export MAX_JOBS="${MAX_JOBS:-${CPU_COUNT:-2}}"
if command -v ccache >/dev/null; then export PATH="${BUILD_PREFIX}/lib/ccache/bin:${PATH}"; fi

"${PYTHON}" -m pip install . --no-deps --no-build-isolation -vv
