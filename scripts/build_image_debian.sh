#!/usr/bin/env bash
# Builds the CPU image (`Dockerfile`) or, with --cuda, the CUDA one (`Dockerfile.cuda`) where no
# base image can be pulled and pip inside a build cannot reach an index: the base is made from
# Debian packages and every wheel comes from a local folder, mounted into the build's RUN steps
# (never copied into a layer).
#
#   scripts/build_image_debian.sh [TAG]         (default localhost/pytgi-cpu:latest; root, Debian)
#   scripts/build_image_debian.sh --cuda [TAG]  (default localhost/pytgi-cuda:latest)
#
# The CUDA image uses the same bookworm base, not an NVIDIA one: torch's CUDA wheel brings the
# CUDA libraries as nvidia-* wheels and the host's driver comes in through the NVIDIA container
# toolkit. Its torch is TORCH_CUDA_VERSION (default 2.14.1, the CUDA build this sandbox's pip
# reaches; the project pins 2.13.0, whose CUDA wheel is not here), installed before pytgi and kept.
#
# Needs: mmdebstrap, podman, buildah (Debian's), and a pip on the host that can fetch pytgi's
# dependencies (its own index or find-links). Steps:
#   1. `mmdebstrap` a bookworm rootfs with python3, pip, python3-dev, g++ (standing in for
#      python:3.11-slim: `python` links to python3, pip may install system-wide), `podman import`
#      it as localhost/pytgi-base:bookworm (once; delete that image to rebuild it);
#   2. `pip wheel` pytgi's dependencies (torch's CPU wheel included) into $WORK_DIR/wheels, or for
#      --cuda the CUDA torch and pytgi's other dependencies into $WORK_DIR/wheels-cuda;
#   3. `buildah bud` the Dockerfile on that base with pip pointed at the wheels (--no-index).
# Storage is vfs (no overlay in this sandbox): give the same `--storage-driver vfs` to podman when
# running the image (docs/DEPLOYMENT.md has the full `podman run` line).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cuda=0
if [ "${1:-}" = "--cuda" ]; then cuda=1; shift; fi
if [ $cuda = 1 ]; then tag=${1:-localhost/pytgi-cuda:latest}; else tag=${1:-localhost/pytgi-cpu:latest}; fi
torch_cuda=${TORCH_CUDA_VERSION:-2.14.1}
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

local_pip="--no-index --find-links /wheels"
if [ $cuda = 1 ]; then
    wheels=$work/wheels-cuda
    echo "== wheels: torch==$torch_cuda (CUDA) and pytgi's other dependencies -> $wheels"
    python3 -c "import sys, tomllib; deps = tomllib.load(open(sys.argv[1], 'rb'))['project']['dependencies']; \
print('\n'.join(d for d in deps if not d.startswith('torch')))" "$root/pyproject.toml" > "$work/requirements-cuda.txt"
    pip wheel -q -w "$wheels" "torch==$torch_cuda" -r "$work/requirements-cuda.txt" "setuptools>=68" wheel
    args=(--build-arg CUDA_BASE="$base" --build-arg TORCH_VERSION="$torch_cuda")
    dockerfile=$root/Dockerfile.cuda
else
    wheels=$work/wheels
    echo "== wheels: pytgi's dependencies -> $wheels"
    pip wheel -q -w "$wheels" "$root" "setuptools>=68" wheel
    args=(--build-arg BASE_IMAGE="$base")
    dockerfile=$root/Dockerfile
fi
rm -f "$wheels"/pytgi-*.whl  # the build installs pytgi from the context, as with docker

echo "== image: buildah bud $dockerfile -> $tag"
# --format docker: the OCI image format has no HEALTHCHECK (buildah drops it with a warning)
buildah "${storage[@]}" bud --isolation chroot --network host --format docker \
    --volume "$wheels:/wheels:ro" "${args[@]}" \
    --build-arg TORCH_PIP_ARGS="$local_pip" --build-arg PIP_ARGS="$local_pip" \
    --layers=false -t "$tag" -f "$dockerfile" "$root"
echo "== built $tag"
