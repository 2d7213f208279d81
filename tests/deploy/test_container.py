"""The CPU image (`Dockerfile`, built by scripts/build_image_debian.sh) run with podman: TGI's
conventions in its config, the bundled demo model served on /generate, the CPU kernels built at
image build time (not at start), the HEALTHCHECK passing, and `podman stop` draining to exit 0.

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

IMAGE = "localhost/pytgi-cpu:latest"
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


@pytest.fixture(scope="module")
def container():
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed")
    if _podman("image", "exists", IMAGE).returncode != 0:
        pytest.skip(f"no {IMAGE}: build it with scripts/build_image_debian.sh")
    port = _free_port()
    name = f"pytgi-test-{port}"
    started = _podman(
        "run", "-d", "--name", name, *RUN_FLAGS, "-p", f"127.0.0.1:{port}:80", IMAGE,
        "--num-threads", "1", "--max-batch-prefill-tokens", "256",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        yield name, f"http://127.0.0.1:{port}"
    finally:
        _podman("rm", "-f", "-t", "0", name)


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


def test_image_config_keeps_tgi_conventions():
    if shutil.which("podman") is None or _podman("image", "exists", IMAGE).returncode != 0:
        pytest.skip("podman or the image is missing")
    [config] = json.loads(_podman("image", "inspect", IMAGE).stdout)
    assert config["Config"]["Entrypoint"] == ["text-generation-launcher"]
    env = dict(item.split("=", 1) for item in config["Config"]["Env"])
    assert env["PORT"] == "80" and env["HF_HOME"] == "/data"
    assert "80/tcp" in config["Config"]["ExposedPorts"]
    assert "/health" in " ".join(config["Config"]["Healthcheck"]["Test"])  # docker format


def test_container_serves_generate_and_drains_on_stop(container):
    name, url = container
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

    assert _podman("stop", "-t", "95", name, timeout=120).returncode == 0
    assert _podman("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip() == "0"
    assert "Shut down cleanly" in _logs(name)
