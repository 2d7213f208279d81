"""The container recipes keep TGI's conventions (entrypoint, port 80 via PORT, HF_HOME=/data) plus a
HEALTHCHECK on /health and the CPU kernels built at image build time. Static checks: no image can
be built here (docs/DEPLOYMENT.md says what was and was not run)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ["Dockerfile", "Dockerfile.cuda"]


def _instructions(name: str) -> list[tuple[str, str]]:
    text = (ROOT / name).read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def _env(instructions) -> dict[str, str]:
    env = {}
    for keyword, rest in instructions:
        if keyword == "ENV":
            env.update(re.findall(r"(\w+)=(\S+)", rest))
    return env


@pytest.mark.parametrize("name", RECIPES)
def test_tgi_conventions(name):
    instructions = _instructions(name)
    env = _env(instructions)
    assert env["PORT"] == "80" and env["HF_HOME"] == "/data"
    assert ("ENTRYPOINT", '["text-generation-launcher"]') in instructions
    assert ("EXPOSE", "80") in instructions and ("VOLUME", "/data") in instructions
    assert ("STOPSIGNAL", "SIGTERM") in instructions
    [health] = [rest for keyword, rest in instructions if keyword == "HEALTHCHECK"]
    assert "/health" in health and "PORT" in health


@pytest.mark.parametrize("name", RECIPES)
def test_kernels_are_built_in_the_image(name):
    instructions = _instructions(name)
    env = _env(instructions)
    runs = [rest for keyword, rest in instructions if keyword == "RUN"]
    build = [i for i, run in enumerate(runs) if "load_cpu_kernels" in run]
    install = [i for i, run in enumerate(runs) if re.search(r"pip3? install (\S+ )*\.( |$)", run)]
    assert build and install and build[0] > install[0]  # after pytgi is installed
    # the runtime looks where the build wrote (the kernels' directory root)
    assert env["TORCH_EXTENSIONS_DIR"].startswith("/opt/")
    # ... given as the server gives it: torch's default root ignores TORCH_EXTENSIONS_DIR, and a
    # build under /root/.cache was rebuilt at every container's first start
    assert "assert l(envs.torch_extensions_dir())" in runs[build[0]]


@pytest.mark.parametrize("name", RECIPES)
def test_copied_paths_exist(name):
    for keyword, rest in _instructions(name):
        if keyword == "COPY":
            for source in rest.split()[:-1]:
                assert (ROOT / source).exists(), source


def test_torch_version_matches_the_project_pin():
    pin = re.search(r'"torch==([^"]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert f"torch=={pin}" in (ROOT / "Dockerfile").read_text()
    # the CUDA recipe's default; scripts/build_image_debian.sh --cuda overrides it with the CUDA
    # build it can reach, which the next step must not replace
    assert f"ARG TORCH_VERSION={pin}" in (ROOT / "Dockerfile.cuda").read_text()


def test_cuda_recipe_keeps_its_torch_when_installing_pytgi():
    runs = [rest for keyword, rest in _instructions("Dockerfile.cuda") if keyword == "RUN"]
    [torch] = [i for i, run in enumerate(runs) if "torch==${TORCH_VERSION}" in run]
    [pytgi] = [run for run in runs if re.search(r"pip3 install (\S+ )*\.( |$)", run)]
    assert runs.index(pytgi) > torch
    assert "--no-deps" in pytgi and "not r.startswith('torch')" in pytgi
