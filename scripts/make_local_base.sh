#!/usr/bin/env bash
# Makes a local stand-in for the ROCm PyTorch base image, for machines that reach no image
# registry (CI and developer machines here): a debootstrap Debian bookworm root with python3,
# g++ and a venv at /opt/venv holding the pinned CPU torch (and numpy), `docker import`ed.
# docker/Dockerfile then builds on it with --build-arg BASE_IMAGE=<this tag>, exactly as it
# builds on rocm/pytorch on a ROCm node.
#
# Usage: scripts/make_local_base.sh [TAG]    (root; needs debootstrap and a running dockerd)
# Env:   DOCKER (docker CLI, default: docker), DEBIAN_MIRROR, TORCH_SPEC (default torch==2.13.0),
#        WORK_DIR (scratch, default build/localbase), FORCE=1 (rebuild even if TAG exists).
# The image is skipped when TAG already exists (a content label records the inputs).
set -euo pipefail

TAG=${1:-primus-turbo-localbase:bookworm-torch2.13}
DOCKER=${DOCKER:-docker}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
NUMPY_SPEC=${NUMPY_SPEC:-numpy<2.3}
ROOT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK_DIR=${WORK_DIR:-$ROOT_DIR/build/localbase}
ROOTFS=$WORK_DIR/rootfs
# what the image is made from: a different value means the existing image is stale
INPUTS="bookworm|$TORCH_SPEC|$NUMPY_SPEC|v1"

log() { echo ">> [make_local_base] $*"; }

if [ "${FORCE:-0}" != 1 ] && [ "$($DOCKER image inspect -f \
    '{{ index .Config.Labels "primus.localbase.inputs" }}' "$TAG" 2>/dev/null)" = "$INPUTS" ]; then
    log "$TAG exists and is current; FORCE=1 rebuilds it"
    exit 0
fi

[ "$(id -u)" = 0 ] || { echo "error: debootstrap needs root" >&2; exit 1; }
command -v debootstrap >/dev/null || {
    echo "error: debootstrap missing (apt-get install debootstrap)" >&2
    exit 1
}

t0=$SECONDS
rm -rf "$ROOTFS"
mkdir -p "$ROOTFS"
log "debootstrap bookworm -> $ROOTFS"
debootstrap --variant=minbase \
    --include=python3,python3-venv,python3-dev,g++,make,git,ca-certificates \
    bookworm "$ROOTFS" "$MIRROR" >"$WORK_DIR/debootstrap.log" 2>&1 || {
    tail -n 30 "$WORK_DIR/debootstrap.log" >&2
    exit 1
}

# The host's CA bundle (it may carry a site CA that pip needs to reach the package index).
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    cp /etc/ssl/certs/ca-certificates.crt "$ROOTFS/etc/ssl/certs/ca-certificates.crt"
fi

# Wheels the host pip already has on local disk (the CPU torch wheel lies in its find-links).
mkdir -p "$ROOTFS/tmp/wheels"
for d in $(pip config get global.find-links 2>/dev/null) ${PIP_FIND_LINKS:-}; do
    if [ -d "$d" ]; then cp -n "$d"/*.whl "$ROOTFS/tmp/wheels/" 2>/dev/null || true; fi
done

log "venv /opt/venv with $TORCH_SPEC $NUMPY_SPEC"
chroot "$ROOTFS" /usr/bin/python3 -m venv /opt/venv
chroot "$ROOTFS" /usr/bin/env -i PATH=/opt/venv/bin:/usr/bin:/bin HOME=/root \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    /opt/venv/bin/python -m pip install --progress-bar off --find-links /tmp/wheels \
    "$TORCH_SPEC" "$NUMPY_SPEC"
rm -rf "$ROOTFS/tmp/wheels" "$ROOTFS/root/.cache" "$ROOTFS/var/cache/apt/archives/"*.deb \
    "$ROOTFS/var/lib/apt/lists/"*

log "docker import -> $TAG"
tar -C "$ROOTFS" --numeric-owner -c . | $DOCKER import \
    --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change "LABEL primus.localbase.inputs=$INPUTS" \
    --change 'CMD ["/bin/bash"]' \
    - "$TAG"
rm -rf "$ROOTFS"
log "done in $((SECONDS - t0)) s: $TAG"
