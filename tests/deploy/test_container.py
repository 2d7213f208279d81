"""The images built by scripts/build_image_debian.sh, run with podman: the CPU one (`Dockerfile`)
and the CUDA one (`Dockerfile.cuda`, `--cuda`), each where it is present. Each keeps TGI's
conventions in its config, serves the bundled demo model on /generate (the CUDA image on its CPU
fallback where there is no GPU, as here), has its CPU kernels built at image build time (not at
start), passes its HEALTHCHECK, and drains on `podman stop` to exit 0. The CUDA image's torch is a
CUDA build (`torch.version.cuda` set) whose CUDA libraries load without a GPU.

Marked `container`, deselected by default: building the image takes many minutes, so the test
only runs an image that is already there (`pytest -m container tests/deploy/test_container.py`)
and skips where podman or the image is missing. The `podman run` flags are the ones this sandbox
needs (docs/DEPLOYMENT.md says why each is there)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time

import httpx
import pytest

pytestmark = pytest.mark.container

IMAGES = {"cpu": "localhost/pytgi-cpu:latest", "cuda": "localhost/pytgi-cuda:latest"}
BUILD = {"cpu": "scripts/build_image_debian.sh", "cuda": "scripts/build_image_debian.sh --cuda"}
PODMAN = ["podman", "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--runtime", "runc"]
RUN_FLAGS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096"]


def _podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout)


def _logs(name: str) -> str:
    logs = _podman("logs", name)
    return logs.stdout + logs.stderr


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _image(kind: str) -> str:
    image = IMAGES[kind]
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed")
    if _podman("image", "exists", image).returncode != 0:
        pytest.skip(f"no {image}: build it with {BUILD[kind]}")
    return image


@pytest.fixture(scope="module", params=sorted(IMAGES))
def container(request):
    image = _image(request.param)
    port = _free_port()
    name = f"pytgi-test-{request.param}-{port}"
    started = _podman(
        "run", "-d", "--name", name, *RUN_FLAGS, "-p", f"127.0.0.1:{port}:80", image,
        "--num-threads", "1", "--max-batch-prefill-tokens", "256",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        yield request.param, name, f"http://127.0.0.1:{port}"
    finally:
        _podman("rm", "-f", "-t", "0", name, timeout=600)  # vfs: deletes a whole rootfs copy


def _wait_healthy(name: str, url: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        state = _podman("inspect", "-f", "{{.State.Status}}", name).stdout.strip()
        assert state == "running", _logs(name)
        time.sleep(1)
    raise TimeoutError(_logs(name))


@pytest.mark.parametrize("kind", sorted(IMAGES))
def test_image_config_keeps_tgi_conventions(kind):
    [config] = json.loads(_podman("image", "inspect", _image(kind)).stdout)
    assert config["Config"]["Entrypoint"] == ["text-generation-launcher"]
    env = dict(item.split("=", 1) for item in config["Config"]["Env"])
    assert env["PORT"] == "80" and env["HF_HOME"] == "/data"
    assert "80/tcp" in config["Config"]["ExposedPorts"]
    healthcheck = config.get("Healthcheck") or config["Config"]["Healthcheck"]  # docker format
    assert "/health" in " ".join(healthcheck["Test"])


def test_container_serves_generate_and_drains_on_stop(container):
    kind, name, url = container
    _wait_healthy(name, url)
    body = {"inputs": "In the beginning", "parameters": {"max_new_tokens": 8, "details": True}}
    response = httpx.post(f"{url}/generate", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["details"]["generated_tokens"] == 8
    assert response.json()["generated_text"]

    logs = _logs(name)
    assert "Building the CPU kernels" not in logs  # built into the image
    assert "CPU kernels ready" in logs
    assert _podman("healthcheck", "run", name).returncode == 0
    if kind == "cuda":
        _check_cuda_torch(name)

    assert _podman("stop", "-t", "95", name, timeout=120).returncode == 0
    assert _podman("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip() == "0"
    assert "Shut down cleanly" in _logs(name)


def _check_cuda_torch(name: str) -> None:
    """torch in the CUDA image is a CUDA build and its CUDA libraries (the nvidia-* wheels) load;
    with no GPU (and no driver) CUDA is unavailable and the server above ran on the CPU."""
    probe = "import torch; print(torch.version.cuda, torch.cuda.is_available())"
    out = _podman("exec", name, "python3", "-c", probe)
    assert out.returncode == 0, out.stderr
    version, available = out.stdout.split()
    assert version.split(".")[0].isdigit(), out.stdout
    if available == "False":  # no GPU here: the server chose its CPU platform
        assert "platform: cpu (compiled kernels" in _logs(name)
