#!/usr/bin/env bash
# Docker driver behind `make docker-build`, `make docker-test` and `make docker-run`.
#
#   scripts/docker.sh build   build docker/Dockerfile, target $DOCKER_TARGET (runtime)
#   scripts/docker.sh test    local base (unless BASE_IMAGE is set) -> build the dev stage ->
#                             `make test` inside the container, no network; prints timings
#   scripts/docker.sh run     interactive container with the GPU flags of this node
#
# Env (the Makefile passes its variables of the same names):
#   IMAGE=primus-turbo  DOCKER_TARGET=runtime  BASE_IMAGE=<empty: the Dockerfile's pinned base>
#   DOCKER_GPU_ARCHS="gfx942;gfx950"  MAX_JOBS  TORCH_CUDA_ARCH_LIST  SHM_SIZE=64g
#   BUILD_FROM=worktree|head (head: `git archive HEAD`, committed files only; the name avoids
#   DOCKER_CONTEXT, which the docker CLI reads)
#   DOCKER_TEST_ARGS (extra `make test` arguments inside, e.g. PYTEST_ARGS='-m "not slow"')
#   DOCKER_TEST_RUNTIME=1: `test` also builds the builder + runtime stages and imports the wheel
#   START_DOCKERD=1: start dockerd (vfs storage, no bridge/iptables) when none answers (root).
set -euo pipefail

ROOT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT_DIR"

IMAGE=${IMAGE:-primus-turbo}
DOCKER_TARGET=${DOCKER_TARGET:-runtime}
BASE_IMAGE=${BASE_IMAGE:-}
DOCKER_GPU_ARCHS=${DOCKER_GPU_ARCHS:-gfx942;gfx950}
BUILD_FROM=${BUILD_FROM:-worktree}
SHM_SIZE=${SHM_SIZE:-64g}
LOCAL_BASE=${LOCAL_BASE:-primus-turbo-localbase:bookworm-torch2.13}
DOCKER=${DOCKER:-}

log() { echo ">> [docker.sh] $*"; }
die() {
    echo "error: $*" >&2
    exit 1
}

# dockerd reachable, else (root, START_DOCKERD=1) started the way this CPU machine allows.
ensure_daemon() {
    local cli=${DOCKER:-docker}
    if $cli info >/dev/null 2>&1; then return 0; fi
    if [ "${START_DOCKERD:-0}" = 1 ] && [ "$(id -u)" = 0 ] && command -v dockerd >/dev/null; then
        mkdir -p build
        log "starting dockerd (vfs, no bridge) -> build/dockerd.log"
        nohup dockerd --storage-driver=vfs --iptables=false --bridge=none \
            >build/dockerd.log 2>&1 &
        for _ in $(seq 1 60); do
            if $cli info >/dev/null 2>&1; then return 0; fi
            sleep 1
        done
    fi
    die "no docker daemon answers (start one, or run with START_DOCKERD=1 as root)"
}

# A docker CLI whose `build` runs BuildKit (RUN --mount): docker with buildx, or a CLI with the
# daemon-side builder (DOCKER_BUILDKIT=1, e.g. Debian's docker.io 20.10 at /usr/bin/docker).
pick_cli() {
    if [ -n "$DOCKER" ]; then return 0; fi
    local cli major
    for cli in docker /usr/bin/docker; do
        command -v "$cli" >/dev/null || continue
        if "$cli" buildx version >/dev/null 2>&1; then
            DOCKER=$cli
            return 0
        fi
        # CLIs before 23.0 carry their own BuildKit client (DOCKER_BUILDKIT=1)
        major=$("$cli" --version 2>/dev/null | sed -nE 's/^Docker version ([0-9]+)\..*/\1/p' || true)
        if [ -n "$major" ] && [ "$major" -lt 23 ]; then
            DOCKER=$cli
            return 0
        fi
    done
    die "no docker CLI with BuildKit found (install docker-buildx, or docker.io)"
}

build_version() {
    local v
    v=$(python3 -c 'import sys; sys.path.insert(0, "."); import setup; print(setup.get_version()[0])' \
        2>/dev/null || echo 0.1.0)
    # a HEAD context is clean whatever the work tree holds
    if [ "$BUILD_FROM" = head ]; then v=${v%.dirty}; fi
    echo "$v"
}

# build TARGET TAG [extra docker build args...]
build() {
    local target=$1 tag=$2
    shift 2
    local args=(-f docker/Dockerfile --target "$target" -t "$tag"
        --build-arg "GPU_ARCHS=$DOCKER_GPU_ARCHS"
        --build-arg "PRIMUS_TURBO_BUILD_VERSION=$(build_version)")
    [ -n "$BASE_IMAGE" ] && args+=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
    # a daemon started without a bridge (--bridge=none, as on the CPU machines here) can only
    # give RUN steps the host network (the steps pip-install from the package index)
    if ! $DOCKER network inspect bridge >/dev/null 2>&1; then args+=(--network=host); fi
    [ -n "${MAX_JOBS:-}" ] && args+=(--build-arg "MAX_JOBS=$MAX_JOBS")
    [ -n "${TORCH_CUDA_ARCH_LIST:-}" ] \
        && args+=(--build-arg "TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST")
    log "build $tag (target $target, base ${BASE_IMAGE:-Dockerfile default}, context $BUILD_FROM)"
    if [ "$BUILD_FROM" = head ]; then
        git archive --format=tar HEAD | DOCKER_BUILDKIT=1 $DOCKER build "${args[@]}" "$@" -
    else
        DOCKER_BUILDKIT=1 $DOCKER build "${args[@]}" "$@" .
    fi
}

cmd_build() {
    pick_cli
    ensure_daemon
    build "$DOCKER_TARGET" "$IMAGE:$DOCKER_TARGET"
}

cmd_test() {
    pick_cli
    ensure_daemon
    local t0=$SECONDS t1 t2 t3
    if [ -z "$BASE_IMAGE" ]; then
        DOCKER=$DOCKER bash scripts/make_local_base.sh "$LOCAL_BASE"
        BASE_IMAGE=$LOCAL_BASE
    fi
    t1=$SECONDS
    build dev "$IMAGE:dev-test"
    t2=$SECONDS
    log "make test inside $IMAGE:dev-test (no network)"
    local rc=0
    # shellcheck disable=SC2086 # DOCKER_TEST_ARGS is a list of make arguments
    $DOCKER run --rm --network=none "$IMAGE:dev-test" make test ${DOCKER_TEST_ARGS:-} || rc=$?
    t3=$SECONDS
    if [ "$rc" = 0 ] && [ "${DOCKER_TEST_RUNTIME:-0}" = 1 ]; then
        # builder (wheel + code-object check) and runtime stages, then an import smoke test
        build runtime "$IMAGE:runtime-test"
        $DOCKER run --rm --network=none "$IMAGE:runtime-test" python3 -c \
            "import primus_turbo.pytorch as t, primus_turbo; print('runtime ok', primus_turbo.__version__)" \
            || rc=$?
    fi
    log "timings: base $((t1 - t0)) s, dev image build $((t2 - t1)) s, make test $((t3 - t2)) s," \
        "runtime stage $((SECONDS - t3)) s, total $((SECONDS - t0)) s (rc=$rc)"
    return "$rc"
}

cmd_run() {
    pick_cli
    local flags=(-it --rm --ipc=host --shm-size="$SHM_SIZE" -v "$ROOT_DIR:/workspace/host")
    if [ -e /dev/kfd ]; then
        flags+=(--device=/dev/kfd --device=/dev/dri --group-add video
            --cap-add=SYS_PTRACE --security-opt seccomp=unconfined)
    elif command -v nvidia-smi >/dev/null; then
        flags+=(--gpus all)
    else
        log "no /dev/kfd and no nvidia-smi: the container gets no GPU"
    fi
    $DOCKER run "${flags[@]}" "$IMAGE:$DOCKER_TARGET" "$@"
}

case "${1:-}" in
    build) cmd_build ;;
    test) cmd_test ;;
    run)
        shift
        cmd_run "$@"
        ;;
    *) die "usage: $0 build|test|run [command...]" ;;
esac
