#!/usr/bin/env bash
# Download, on a machine with PyPI, the wheels scripts/gpu_validate.sh installs on a GPU machine
# that has torch, Triton and transformers but no package registry: pytgi's server and test
# dependencies at the versions of this environment (binary ones for CPython 3.10-3.13), about
# 15 MB, into .gpu-wheels/ (git-ignored; carry it to the GPU machine).
#
#   bash scripts/gpu_wheels.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.gpu-wheels}"
mkdir -p "$dest"
pure=(fastapi starlette annotated-doc uvicorn h11 click anyio sniffio pydantic annotated-types
      typing-inspection typing_extensions httpx httpcore certifi idna prometheus_client pytest
      pluggy iniconfig packaging Jinja2 tqdm exceptiongroup)  # exceptiongroup, tomli: Python < 3.11
binary=(pydantic_core MarkupSafe tomli)
pin() {  # the version installed here, else the latest
  local v
  v=$(pip show "$1" 2>/dev/null | awk '/^Version:/{print $2}')
  if [[ -n "$v" ]]; then echo "$1==$v"; else echo "$1"; fi
}
for name in "${pure[@]}"; do
  pip download -q --no-deps --only-binary=:all: -d "$dest" "$(pin "$name")"
done
for name in "${binary[@]}"; do
  for py in 3.10 3.11 3.12 3.13; do
    pip download -q --no-deps --only-binary=:all: --python-version "$py" \
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$dest" "$(pin "$name")"
  done
done
ls "$dest" | wc -l
du -sh "$dest"
