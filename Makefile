# Primus-Turbo developer entry points. `make` or `make help` lists the targets.
#
# Interpreter selection (done once, lazily, only by targets that run python):
#   1. PYTHON=/path/to/python given (command line or environment): used as is. No venv is
#      created and its torch/triton are never touched (package installed with --no-deps).
#   2. else, if `python3 -c "import torch"` works (a ROCm/CUDA image, the lent GPU machine):
#      that python3 is used the same way; only missing test tools are pip-installed.
#   3. else (CPU-only machine, CI): .venv is bootstrapped from requirements-dev.txt (pinned CPU
#      torch/triton); .venv/.stamp-deps makes repeated runs skip the install.
# `make info` shows the choice.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
# Every target funnels through the same pip-based setup; running them in parallel would race.
.NOTPARALLEL:
MAKEFLAGS += --no-print-directory

VENV        ?= .venv
SYS_PYTHON  ?= python3
STAMPS      := build/.stamps
# xdist workers: number of cores, at most 8 (override: make test NPROC=4)
NPROC       ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n > 8 ? 8 : n )))
TEST_DIR    ?= tests
TEST_TIMEOUT ?= 600
PYTEST_ARGS ?=
BENCH_ARGS  ?=
WHEELHOUSE  ?= .whl
LINT_PATHS  := $(wildcard primus_turbo tests benchmark scripts setup.py)

# ---- interpreter selection (lazy: `make help` never imports torch) -------------------------
# `X = $(eval X := ...)$(X)` computes X on first use only, then keeps the value.
PY_MODE = $(eval PY_MODE := $(strip $(if $(PYTHON),given,$(if $(shell \
    $(SYS_PYTHON) -c "import torch" >/dev/null 2>&1 && echo y),system,venv))))$(PY_MODE)
PY = $(eval PY := $(strip $(if $(filter given,$(PY_MODE)),$(PYTHON),$(if \
    $(filter system,$(PY_MODE)),$(shell command -v $(SYS_PYTHON)),$(VENV)/bin/python))))$(PY)
# given/system interpreters keep their own torch: never let pip resolve dependencies there
PIP_DEPS_FLAG = $(if $(filter venv,$(PY_MODE)),,--no-deps)
INSTALL_CMD = $(PY) -m pip install --no-build-isolation $(PIP_DEPS_FLAG) -e .
INSTALL_STAMP = $(STAMPS)/install$(subst /,_,$(abspath $(PY)))

# $(call ensure_tools,module:requirement ...): pip-installs, at the version pinned in
# requirements-dev.txt, each tool whose module the interpreter cannot import. Wheels in
# $(WHEELHOUSE) are tried first, offline (a GPU machine may reach no package index).
define ensure_tools
missing=""; \
for pair in $(1); do \
  mod=$${pair%%:*}; req=$${pair#*:}; \
  if ! $(PY) -c "import $$mod" >/dev/null 2>&1; then \
    pin=$$(grep -iE "^$$req[[:space:]]*==" requirements-dev.txt | head -n1 | tr -d '[:space:]'); \
    missing="$$missing $${pin:-$$req}"; \
  fi; \
done; \
if [ -n "$$missing" ]; then \
  echo ">> installing missing tools into $(PY):$$missing"; \
  if [ -d "$(WHEELHOUSE)" ] \
     && $(PY) -m pip install --no-index --find-links "$(WHEELHOUSE)" $$missing; then :; \
  elif $(PY) -m pip install $$missing; then :; \
  else echo "error: could not install$$missing into $(PY); install them by hand" >&2; exit 1; \
  fi; \
fi
endef

# setuptools < 70.1 needs the `wheel` package for editable installs
SETUPTOOLS_HAS_BDIST_WHEEL := import sys, setuptools; \
  sys.exit(tuple(map(int, setuptools.__version__.split('.')[:2])) < (70, 1))

.PHONY: help info venv deps setup build test test-quick test-deterministic test-dist \
        aot-check cuda-check bench env-check lint format clean distclean

help: ## list the targets (default)
	@echo "Primus-Turbo make targets:"
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | \
	  awk 'BEGIN {FS = ":.*## "} {printf "  %-20s %s\n", $$1, $$2}'
	@echo
	@echo "Variables: PYTHON=<interpreter> (use it, no venv)  NPROC=<xdist workers, default min(cores,8)>"
	@echo "           PYTEST_ARGS='<extra pytest args>'  BENCH_ARGS='<extra run_suite.py args>'"
	@echo "           AOT_ARGS='<extra aot_check.py args, e.g. --sample 2>'"

info: ## show which python the targets use and why
	@echo "mode:   $(PY_MODE)  (given: PYTHON=...; system: python3 has torch; venv: $(VENV))"
	@echo "python: $(PY)"
	@echo "nproc:  $(NPROC)"

venv: setup ## prepare the selected interpreter (bootstraps .venv only when no torch is found)

deps: ## install the dev/test tools (and, in .venv mode, the pinned CPU stack)
	@if [ "$(PY_MODE)" = venv ]; then \
	  command -v $(SYS_PYTHON) >/dev/null || { echo "error: $(SYS_PYTHON) not found" >&2; exit 1; }; \
	  if ! $(VENV)/bin/python -c "import sys" >/dev/null 2>&1; then \
	    echo ">> creating $(VENV) with $$(command -v $(SYS_PYTHON))"; \
	    $(SYS_PYTHON) -m venv --clear $(VENV); \
	  fi; \
	  stamp=$(VENV)/.stamp-deps; \
	  if [ ! -f $$stamp ] || [ requirements.txt -nt $$stamp ] \
	     || [ requirements-dev.txt -nt $$stamp ]; then \
	    echo ">> installing requirements-dev.txt into $(VENV)"; \
	    $(PY) -m pip install --progress-bar off -r requirements-dev.txt; \
	    touch $$stamp; \
	  fi; \
	else \
	  $(call ensure_tools,pytest:pytest xdist:pytest-xdist pytest_timeout:pytest-timeout); \
	  if ! $(PY) -c "$(SETUPTOOLS_HAS_BDIST_WHEEL)" >/dev/null 2>&1; then \
	    $(call ensure_tools,wheel:wheel); \
	  fi; \
	fi

setup: deps ## deps + editable install of primus_turbo (skipped when up to date)
	@stamp=$(INSTALL_STAMP); \
	if [ ! -f $$stamp ] || [ setup.py -nt $$stamp ] || [ pyproject.toml -nt $$stamp ] \
	   || [ ! -f primus_turbo/_version.py ] \
	   || [ -n "$$(find csrc -newer $$stamp -type f -print -quit 2>/dev/null)" ]; then \
	  echo "$(INSTALL_CMD)"; $(INSTALL_CMD); \
	  mkdir -p $(STAMPS); touch $$stamp; \
	fi

build: deps ## (re)install in editable mode, building the C++ extension (MAX_JOBS, GPU_ARCHS honoured)
	$(INSTALL_CMD)
	@mkdir -p $(STAMPS) && touch $(INSTALL_STAMP)

test: setup ## run the test suite with xdist (NPROC workers, 600 s per-test timeout)
	$(PY) -m pytest $(TEST_DIR) -n $(NPROC) --timeout=$(TEST_TIMEOUT) --durations=15 $(PYTEST_ARGS)

test-quick: setup ## quick tier: skip `slow` tests, stop at the first failure
	$(PY) -m pytest $(TEST_DIR) -n $(NPROC) --timeout=300 -x -m "not slow" $(PYTEST_ARGS)

test-deterministic: setup ## only the deterministic-marked tests (--deterministic-only)
	$(PY) -m pytest $(TEST_DIR) -n $(NPROC) --timeout=$(TEST_TIMEOUT) --deterministic-only $(PYTEST_ARGS)

test-dist: setup ## only the multi-GPU torch.distributed tests (--dist-only), serially
	$(PY) -m pytest $(TEST_DIR) --timeout=$(TEST_TIMEOUT) --dist-only $(PYTEST_ARGS)

aot-check: setup ## compile Triton kernels ahead of time for gfx942/gfx950 -> build/aot_report.md
	@mkdir -p build
	$(PY) scripts/aot_check.py --out build/aot_report.md $(AOT_ARGS)

cuda-check: ## compile csrc/kernels/*.cu for sm_90 with nvcc (no GPU needed; skipped without nvcc)
	bash scripts/cuda_check.sh

bench: setup ## run the benchmark suite (GPU or CPU profile chosen by the suite)
	$(PY) benchmark/run_suite.py $(BENCH_ARGS)

env-check: setup ## print python/torch/triton/numpy/GPU facts and whether primus_turbo imports
	$(PY) scripts/env_check.py

lint: deps ## ruff check + ruff format --check; hadolint, shellcheck, recipe render check
	@$(call ensure_tools,ruff:ruff)
	$(PY) -m ruff check $(LINT_PATHS)
	$(PY) -m ruff format --check $(LINT_PATHS)
	@$(call ensure_tools,yaml:PyYAML jinja2:jinja2)
	PY=$(PY) bash scripts/lint_delivery.sh

format: deps ## apply ruff fixes and formatting
	@$(call ensure_tools,ruff:ruff)
	$(PY) -m ruff check --fix $(LINT_PATHS)
	$(PY) -m ruff format $(LINT_PATHS)

clean: ## remove build artefacts, caches, egg-info and _version.py (keeps .venv)
	rm -rf build dist .eggs *.egg-info primus_turbo/_version.py primus_turbo/_build_info.py \
	  .pytest_cache .ruff_cache .autotune_cache
	find . \( -path ./.venv -o -path ./.git \) -prune -o \
	  -type d -name __pycache__ -prune -exec rm -rf {} +
	if [ -d primus_turbo ]; then find primus_turbo -name '*.so' -type f -delete; fi

distclean: clean ## clean, and remove .venv too
	rm -rf $(VENV)

# ---- delivery: Docker images and conda packages (docker/README.md, README "Install") --------
IMAGE         ?= primus-turbo
DOCKER_TARGET ?= runtime
# empty: the Dockerfile's pinned rocm/pytorch base; `make docker-test` makes a local one
BASE_IMAGE    ?=
DOCKER_GPU_ARCHS ?= gfx942;gfx950
CONDA_OUT     ?= build/conda
# empty: every variant of recipe/conda_build_config.yaml (conda-build) / gfx942;gfx950 (fallback)
CONDA_GPU_ARCHS ?=
CONDA_CHANNEL ?= build/conda-channel
DOCKER_ENV     = IMAGE='$(IMAGE)' DOCKER_TARGET='$(DOCKER_TARGET)' BASE_IMAGE='$(BASE_IMAGE)' \
                 DOCKER_GPU_ARCHS='$(DOCKER_GPU_ARCHS)'

.PHONY: docker-build docker-test docker-run conda-build conda-channel

docker-build: ## build docker/Dockerfile (DOCKER_TARGET=runtime|dev|builder, BASE_IMAGE, DOCKER_GPU_ARCHS)
	$(DOCKER_ENV) bash scripts/docker.sh build

docker-test: ## local base image + dev image here, then `make test` in the container (CPU tier)
	$(DOCKER_ENV) START_DOCKERD=1 bash scripts/docker.sh test

docker-run: ## interactive container of $(IMAGE):$(DOCKER_TARGET) with this node's GPU flags
	$(DOCKER_ENV) bash scripts/docker.sh run

conda-build: deps ## conda packages into $(CONDA_OUT) (conda-build; else wheel + scripts/conda_pack.py)
	@$(call ensure_tools,yaml:PyYAML jinja2:jinja2 conda_package_handling:conda-package-handling)
	PY=$(PY) CONDA_OUT=$(CONDA_OUT) CONDA_GPU_ARCHS='$(CONDA_GPU_ARCHS)' bash scripts/conda_build.sh

conda-channel: deps ## publish $(CONDA_OUT) packages into $(CONDA_CHANNEL) and index it
	@$(call ensure_tools,conda_package_streaming:conda-package-streaming)
	$(PY) scripts/conda_channel.py --channel $(CONDA_CHANNEL) --force \
	  $$(find $(CONDA_OUT) -name '*.conda' -o -name '*.tar.bz2' | grep -v '/pkgs/' || true)
