"""Tensor-parallel faults through the real launcher (`pytgi serve --num-shard 2`): a rank killed
while idle or while a stream is open, a rank that fails during start-up, and a rank that stops
answering in a collective. Each must end the server: open requests fail with TGI's error, /health
answers 503, the launcher exits non-zero with the reason as its last line, and no process is left
behind. A Ctrl-C, which reaches every process, must still drain in-flight requests.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from e2e.server import ServerProcess, free_port, pid_alive

pytestmark = pytest.mark.tp

EXIT_WAIT_S = 60


def process_tree(root: int) -> set[int]:
    """Every live descendant of `root` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def is_rank(pid: int, engine_pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return int(stat.rsplit(")", 1)[1].split()[1]) == engine_pid and b"spawn_main" in cmdline


class TPServer(ServerProcess):
    def __init__(self, model_dir: Path, log_path: Path, num_shard: int = 2):
        super().__init__(
            model_dir,
            "--num-shard", str(num_shard),
            "--master-port", str(free_port()),
            log_path=log_path,
        )  # fmt: skip
        self.seen: set[int] = set()  # every process of the server seen so far

    def watch(self) -> set[int]:
        self.seen |= process_tree(self.proc.pid)
        return self.seen

    def rank_pids(self) -> list[int]:
        """Ranks 1..N-1: the engine process's spawned children."""
        (engine,) = self.child_pids_named(b"spawn_main")
        return sorted(pid for pid in self.watch() if is_rank(pid, engine))

    def child_pids_named(self, marker: bytes) -> list[int]:
        pids = []
        for pid in self.child_pids():
            try:
                if marker in Path(f"/proc/{pid}/cmdline").read_bytes():
                    pids.append(pid)
            except OSError:
                continue
        return pids

    def wait_exit(self, timeout_s: float = EXIT_WAIT_S) -> int:
        """The launcher's exit code, noting its processes while it runs."""
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None:
            assert time.monotonic() < deadline, f"the launcher did not exit:\n{self.logs()}"
            self.watch()
            time.sleep(0.1)
        return self.proc.returncode

    def last_line(self) -> str:
        return self.logs().rstrip().splitlines()[-1]

    def assert_nothing_left(self) -> None:
        deadline = time.monotonic() + 10
        while any(pid_alive(pid) for pid in self.seen) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [pid for pid in self.seen if pid_alive(pid)]
        assert not left, f"processes left behind: {left}\n{self.logs()}"

    def kill_all(self) -> None:
        """Clean-up after a failed test: nothing of this server may outlive it."""
        for pid in self.watch() | {self.proc.pid}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        self._log.close()


@pytest.fixture
def tp_server(tiny_model_factory, tmp_path, monkeypatch):
    """`start(num_shard=2, wait=True, **env)` starts a server (with test-only env vars set)."""
    servers = []

    def start(num_shard: int = 2, wait: bool = True, **env: str) -> TPServer:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        log = tmp_path / f"server{len(servers)}.log"
        server = TPServer(tiny_model_factory("llama"), log, num_shard=num_shard)
        servers.append(server)
        if wait:
            server.wait_healthy()
            server.watch()
        return server

    yield start
    for server in servers:
        server.kill_all()


def health(url: str) -> int | None:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code
    except httpx.HTTPError:
        return None  # the launcher is gone


def assert_health_turns_503(url: str) -> None:
    """/health goes from 200 straight to 503 (then the port closes as the launcher exits)."""
    deadline = time.monotonic() + 10
    statuses = []
    while time.monotonic() < deadline:
        status = health(url)
        statuses.append(status)
        if status != 200:
            break
        time.sleep(0.02)
    assert statuses[-1] == 503, statuses


def test_a_rank_killed_while_idle_ends_the_server(tp_server):
    server = tp_server()
    (rank,) = server.rank_pids()
    os.kill(rank, signal.SIGKILL)
    assert_health_turns_503(server.url)
    assert server.wait_exit() != 0
    assert server.last_line().endswith(
        "Shard failed: tensor-parallel rank 1 died (exit code -9: SIGKILL)"
    ), server.logs()
    server.assert_nothing_left()


def test_a_rank_killed_during_a_stream_fails_the_stream(tp_server):
    server = tp_server()
    (rank,) = server.rank_pids()
    # greedy from this prompt loops without EOS on the tiny model, so the stream stays busy
    body = {"inputs": "Hello world", "parameters": {"max_new_tokens": 400}}
    with httpx.stream("POST", f"{server.url}/generate_stream", json=body, timeout=30) as stream:
        lines = (line for line in stream.iter_lines() if line.startswith("data:"))
        first = json.loads(next(lines)[5:])
        assert "token" in first
        os.kill(rank, signal.SIGKILL)
        events = [json.loads(line[5:]) for line in lines]
        assert health(server.url) in (503, None)  # dead already when the stream failed
    assert events[-1] == {
        "error": "Request failed during generation: "
        "tensor-parallel rank 1 died (exit code -9: SIGKILL)",
        "error_type": "generation",
    }
    assert server.wait_exit() != 0
    assert server.last_line().endswith(
        "Shard failed: tensor-parallel rank 1 died (exit code -9: SIGKILL)"
    )
    server.assert_nothing_left()


def test_a_rank_that_stops_answering_is_bounded_by_the_collective_timeout(tp_server):
    server = tp_server(PYTGI_TP_COLLECTIVE_TIMEOUT_S="4")
    (rank,) = server.rank_pids()
    body = {"inputs": "Hello world", "parameters": {"max_new_tokens": 4}}
    time.sleep(5)  # idle ranks wait for the next step without the collective timeout
    assert httpx.post(f"{server.url}/generate", json=body, timeout=60).status_code == 200
    os.kill(rank, signal.SIGSTOP)  # alive, but never joins another collective
    start = time.monotonic()
    resp = httpx.post(f"{server.url}/generate", json=body, timeout=60)
    assert resp.status_code == 424
    error = resp.json()["error"]
    assert "a tensor-parallel step failed on rank 0: RuntimeError: Timed out" in error
    assert "a rank did not answer within 4s, PYTGI_TP_COLLECTIVE_TIMEOUT_S" in error
    assert 4 <= time.monotonic() - start < 30
    assert server.wait_exit() != 0
    assert "Shard failed: a tensor-parallel step failed on rank 0" in server.last_line()
    server.assert_nothing_left()  # the stopped rank too


def test_ctrl_c_drains_in_flight_requests_and_ends_every_rank(tp_server):
    """A terminal's Ctrl-C reaches the whole process group: only the launcher may act on it."""
    server = tp_server()
    result = {}

    def generate() -> None:
        body = {"inputs": "Hello world", "parameters": {"max_new_tokens": 200}}
        result["resp"] = httpx.post(f"{server.url}/generate", json=body, timeout=60)

    thread = threading.Thread(target=generate)
    thread.start()
    time.sleep(1.0)
    for pid in [server.proc.pid, *server.watch()]:
        os.kill(pid, signal.SIGINT)
    thread.join(60)
    assert server.wait_exit() == 0, server.logs()
    assert result["resp"].status_code == 200, result["resp"].text
    assert "Traceback" not in server.logs() and "KeyboardInterrupt" not in server.logs()
    server.assert_nothing_left()


@pytest.mark.parametrize(
    "num_shard, env, reason",
    [
        (
            2,
            {"PYTGI_TEST_RANK_FAULT": "1:load"},
            "tensor-parallel rank 1 failed (exit code 1): "
            "RuntimeError: fault injected at load by PYTGI_TEST_RANK_FAULT",
        ),
        (
            2,
            {"PYTGI_TEST_RANK_FAULT": "1:warmup"},
            "tensor-parallel rank 1 failed (exit code 1): "
            "RuntimeError: fault injected at warmup by PYTGI_TEST_RANK_FAULT",
        ),
        # 4 heads over 3 shards: every rank fails alike, and clean-up must not hide why; a named
        # cause (a PytgiError) is the last line as it is, without its type or a traceback
        (3, {}, "launcher: number of attention heads (4) is not divisible by the number"),
    ],
    ids=["load", "warmup", "heads-not-divisible"],
)
def test_a_rank_that_fails_to_start_ends_start_up_with_its_reason(
    tp_server, num_shard, env, reason
):
    server = tp_server(num_shard=num_shard, wait=False, **env)
    assert server.wait_exit() == 1
    assert reason in server.last_line(), server.logs()
    assert "AttributeError" not in server.logs()
    server.assert_nothing_left()
