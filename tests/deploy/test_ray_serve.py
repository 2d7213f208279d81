"""pytgi on Ray Serve (`pytgi.deploy.ray_serve`), on a local Ray cluster with two replicas of the
bundled demo model, through Ray Serve's HTTP proxy: load goes to both replicas, streaming passes
through, and a replica killed mid-load costs only its in-flight requests (errors, never hangs),
its queued ones go to the other replica and Ray starts a replacement.

One cluster for the module (Ray and two servers take a while to start): marked `ray`, deselected
by default; run with `pytest -m ray tests/deploy/test_ray_serve.py` (needs the `ray` extra)."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

pytest.importorskip("ray.serve", reason="needs the ray extra: pip install .[ray]")

pytestmark = pytest.mark.ray

REPLICA_HEADER = "x-pytgi-replica"
MAX_ONGOING = 2  # per replica: the rest of a burst waits in Ray's queue
SERVE_ARGS = "--num-threads 1 --num-blocks 128 --block-size 16 --max-batch-prefill-tokens 256"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def proxy_url():
    import ray
    from ray import serve

    from pytgi.deploy.ray_serve import build_app

    port = _free_port()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = build_app(
            {"num_replicas": "2", "max_ongoing_requests": str(MAX_ONGOING), "num_cpus": "1",
             "serve_args": SERVE_ARGS}
        )  # fmt: skip
        serve.run(app, name="pytgi", route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def _generate(url: str, max_new_tokens: int, timeout_s: float = 120.0):
    """(status or the transport error's name, replica id, finish time)."""
    body = {"inputs": "In the beginning", "parameters": {"max_new_tokens": max_new_tokens}}
    try:
        response = httpx.post(f"{url}/generate", json=body, timeout=timeout_s)
    except httpx.TimeoutException:
        return "timeout", None, time.monotonic()
    except httpx.HTTPError as exc:
        return type(exc).__name__, None, time.monotonic()
    return response.status_code, response.headers.get(REPLICA_HEADER), time.monotonic()


def _burst(url: str, n: int, max_new_tokens: int) -> list:
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: _generate(url, max_new_tokens), range(n)))


def _request_count(replica_id: str) -> float:
    port = replica_id.split("@")[1]
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    [line] = [x for x in text.splitlines() if x.startswith("tgi_request_count ")]
    return float(line.split()[1])


def _server_answers(replica_id: str) -> bool:
    try:
        httpx.get(f"http://127.0.0.1:{replica_id.split('@')[1]}/health", timeout=2)
    except httpx.HTTPError:
        return False
    return True


def test_load_spreads_over_both_replicas_and_streams(proxy_url):
    results = _burst(proxy_url, 8, 8)
    assert [status for status, _, _ in results] == [200] * 8
    assert len({replica for _, replica, _ in results}) == 2

    body = {"inputs": "In the beginning", "parameters": {"max_new_tokens": 8}}
    whole = httpx.post(f"{proxy_url}/generate", json=body, timeout=60).json()["generated_text"]
    with httpx.stream("POST", f"{proxy_url}/generate_stream", json=body, timeout=60) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        events = [line for line in stream.iter_lines() if line.startswith("data:")]
    assert len(events) == 8  # one event per token, as they come
    assert json.loads(events[0][5:])["generated_text"] is None
    assert json.loads(events[-1][5:])["generated_text"] == whole  # greedy: the same text


def _stream_until_first_token(url: str):
    """A long stream, open: (its response, its line iterator, its replica) after one event."""
    body = {"inputs": "In the beginning", "parameters": {"max_new_tokens": 900}}
    stream = httpx.stream("POST", f"{url}/generate_stream", json=body, timeout=30)
    response = stream.__enter__()
    lines = response.iter_lines()
    assert next(line for line in lines if line.startswith("data:"))
    return stream, lines, response.headers[REPLICA_HEADER]


def _stream_outcome(lines) -> str:
    """How an open stream ends: its last event ("finished"), cut short ("cut"), with a transport
    error ("error") or not at all ("hang")."""
    try:
        events = [json.loads(line[5:]) for line in lines if line.startswith("data:")]
    except httpx.TimeoutException:
        return "hang"
    except httpx.HTTPError:
        return "error"
    return "finished" if events and events[-1].get("generated_text") is not None else "cut"


def test_killed_replica_costs_only_its_inflight_requests_and_is_replaced(proxy_url):
    before = {replica for _, replica, _ in _burst(proxy_url, 4, 4)}
    assert len(before) == 2
    n = 8
    with ThreadPoolExecutor(n) as pool:
        stream, lines, victim = _stream_until_first_token(proxy_url)  # in flight on the victim
        [survivor] = before - {victim}
        survivor_count = _request_count(survivor)
        futures = [pool.submit(_generate, proxy_url, 32) for _ in range(n)]
        time.sleep(0.5)  # the burst spreads: MAX_ONGOING on each replica, the rest queued in Ray
        os.kill(int(victim.split("@")[0]), signal.SIGKILL)
        killed_at = time.monotonic()
        assert _stream_outcome(lines) in ("error", "cut")  # an error, never a hang
        stream.__exit__(None, None, None)
        results = [future.result() for future in futures]

    assert "timeout" not in [status for status, _, _ in results]  # an error, never a hang
    failed = [r for r in results if r[0] != 200]
    assert len(failed) < MAX_ONGOING  # at most the victim's other in-flight request
    late = [replica for status, replica, done in results if status == 200 and done > killed_at]
    assert victim not in late  # queued ones went elsewhere
    served = [replica for status, replica, _ in results if status == 200]
    if set(served) <= {victim, survivor}:  # no request ran twice on the survivor
        assert _request_count(survivor) - survivor_count == served.count(survivor)

    deadline = time.monotonic() + 30
    while _server_answers(victim) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _server_answers(victim)  # its pytgi server died with it

    deadline = time.monotonic() + 120
    seen = set()
    while not seen - before and time.monotonic() < deadline:  # Ray starts a replacement
        seen |= {replica for status, replica, _ in _burst(proxy_url, 4, 1) if status == 200}
        time.sleep(0.5)
    assert seen - before, "no replacement replica answered"
    assert victim not in seen
