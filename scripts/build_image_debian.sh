#!/usr/bin/env bash
# Builds the CPU image (`Dockerfile`) where no base image can be pulled and pip inside a build
# cannot reach an index: the base is made from Debian packages and every wheel comes from a local
# folder, mounted into the build's RUN steps (never copied into a layer).
#
#   scripts/build_image_debian.sh [TAG]      (default localhost/pytgi-cpu:latest; root, Debian)
#
# Needs: mmdebstrap, podman, buildah (Debian's), and a pip on the host that can fetch pytgi's
# dependencies (its own index or find-links). Steps:
#   1. `mmdebstrap` a bookworm rootfs with python3, pip, python3-dev, g++ (standing in for
#      python:3.11-slim: `python` links to python3, pip may install system-wide), `podman import`
#      it as localhost/pytgi-base:bookworm (once; delete that image to rebuild it);
#   2. `pip wheel` pytgi's dependencies (torch's CPU wheel included) into $WORK_DIR/wheels;
#   3. `buildah bud` the Dockerfile on that base with pip pointed at the wheels (--no-index).
# Storage is vfs (no overlay in this sandbox): give the same `--storage-driver vfs` to podman when
# running the image (docs/DEPLOYMENT.md has the full `podman run` line).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tag=${1:-localhost/pytgi-cpu:latest}
work=${WORK_DIR:-/var/tmp/pytgi-image}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
base=localhost/pytgi-base:bookworm
storage=(--storage-driver vfs)
mkdir -p "$work"

if ! podman "${storage[@]}" image exists "$base"; then
    echo "== base: mmdebstrap bookworm -> $base"
    mmdebstrap --variant=minbase \
        --include=python3,python3-pip,python3-dev,g++,ca-certificates \
        --customize-hook='rm -f "$1"/usr/lib/python3.*/EXTERNALLY-MANAGED; ln -sf python3 "$1"/usr/bin/python' \
        bookworm "$work/base.tar" "$mirror"
    podman "${storage[@]}" import --change 'CMD ["/bin/bash"]' "$work/base.tar" "$base"
fi

echo "== wheels: pytgi's dependencies -> $work/wheels"
pip wheel -q -w "$work/wheels" "$root" "setuptools>=68" wheel
rm -f "$work"/wheels/pytgi-*.whl  # the build installs pytgi from the context, as with docker

echo "== image: buildah bud -> $tag"
# --format docker: the OCI image format has no HEALTHCHECK (buildah drops it with a warning)
local_pip="--no-index --find-links /wheels"
buildah "${storage[@]}" bud --isolation chroot --network host --format docker \
    --volume "$work/wheels:/wheels:ro" \
    --build-arg BASE_IMAGE="$base" \
    --build-arg TORCH_PIP_ARGS="$local_pip" --build-arg PIP_ARGS="$local_pip" \
    --layers=false -t "$tag" -f "$root/Dockerfile" "$root"
echo "== built $tag"
