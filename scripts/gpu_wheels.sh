#!/usr/bin/env bash
# Download, on a machine with PyPI, the wheels scripts/gpu_validate.sh installs on the GPU machine,
# which has Python 3.12, torch, Triton, a newer transformers, tokenizers, safetensors, pillow,
# peft and pytest but no package registry: the transformers / tokenizers this environment's
# tests are written against (the reference must be the same code), pytgi's server dependencies,
# and what those need that torch does not bring. CPython 3.12 manylinux x86_64 builds only, one
# version of each (this environment's), into .gpu-wheels/ (git-ignored; carry it), then a check:
# every wheel's Requires-Dist (for Python 3.12 on Linux x86_64, no extras) must be carried or in
# EXPECTED (what the GPU machine has with torch), and the folder must stay under 40 MB.
#
#   bash scripts/gpu_wheels.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.gpu-wheels}"
rm -rf "$dest"
mkdir -p "$dest"
packages=(
  transformers tokenizers huggingface_hub regex requests urllib3 charset_normalizer certifi idna
  pyyaml tqdm peft accelerate
  fastapi starlette annotated-doc uvicorn h11 click anyio sniffio pydantic pydantic_core
  annotated-types typing-inspection typing_extensions httpx httpcore prometheus_client
  llguidance swagger-ui-bundle opentelemetry-api
)
# the versions installed here (every package above is), read in one go
mapfile -t specs < <(python -c '
import sys
from importlib.metadata import version
for name in sys.argv[1:]:
    print(f"{name}=={version(name)}")' "${packages[@]}")
pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$dest" "${specs[@]}"
python - "$dest" <<'EOF'
import sys
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

# on the GPU machine with torch 2.11 (its own dependencies), numpy, pillow, safetensors, pytest
EXPECTED = {"torch", "numpy", "filelock", "fsspec", "jinja2", "markupsafe", "packaging",
            "safetensors", "psutil", "triton", "sympy", "networkx", "setuptools", "pillow",
            "hf-xet", "pytest"}
env = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3",
       "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
       "implementation_name": "cpython", "extra": ""}
wheels = sorted(Path(sys.argv[1]).glob("*.whl"))
carried = {canonicalize_name(parse_wheel_filename(w.name)[0]) for w in wheels}
if len(carried) != len(wheels):
    sys.exit("gpu_wheels: more than one version of a package")
missing = {}
for wheel in wheels:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = canonicalize_name(req.name)
        if name not in carried and name not in EXPECTED:
            missing.setdefault(name, []).append(wheel.name.split("-")[0])
size = sum(w.stat().st_size for w in wheels)
print(f"{len(wheels)} wheels, {size / 2**20:.1f} MiB")
if missing:
    sys.exit(f"gpu_wheels: required but not carried: {missing}")
if size > 40 * 2**20:
    sys.exit("gpu_wheels: over 40 MiB")
EOF
