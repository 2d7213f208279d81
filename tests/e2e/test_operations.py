"""Operations through the real server: limits, auth, abort on disconnect, drain, engine crash."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import httpx
import pytest

from e2e.server import ServerProcess, pid_alive


def metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


@pytest.fixture(scope="module")
def guarded_server(tiny_model_factory, tmp_path_factory):
    """A server with an API key, one concurrent request, a small payload limit and grammars
    off."""
    log = tmp_path_factory.mktemp("guarded") / "server.log"
    server = ServerProcess(
        tiny_model_factory("llama"),
        "--api-key", "s3cret",
        "--max-concurrent-requests", "1",
        "--payload-limit", "2000",
        "--disable-grammar-support",
        "--request-header-timeout", "1",
        "--request-body-timeout", "1.5",
        "--max-connections", "40",
        log_path=log,
    )  # fmt: skip
    server.wait_healthy()
    yield server
    server.stop()


AUTH = {"Authorization": "Bearer s3cret"}


def test_metrics_are_registered_before_any_request(guarded_server):
    text = httpx.get(f"{guarded_server.url}/metrics").text
    names = ["tgi_request_count", "tgi_request_success", "tgi_queue_size"]
    names += ["tgi_batch_current_size", "pytgi_kv_blocks_free", "pytgi_preemptions"]
    for name in names:
        assert name in text
    assert metric(guarded_server.url, "tgi_request_count") == 0
    # a fresh server's KV cache is empty, not full (autoscalers and alerts read these)
    total = metric(guarded_server.url, "pytgi_kv_blocks_total")
    assert total > 0
    assert metric(guarded_server.url, "pytgi_kv_blocks_free") == total
    assert metric(guarded_server.url, "pytgi_kv_cache_usage_ratio") == 0.0


def test_api_key_is_enforced(guarded_server):
    body = {"inputs": "hi", "parameters": {"max_new_tokens": 2}}
    assert httpx.post(f"{guarded_server.url}/generate", json=body).status_code == 401
    wrong = {"Authorization": "Bearer s3cret-not"}
    assert httpx.post(f"{guarded_server.url}/generate", json=body, headers=wrong).status_code == 401
    ok = httpx.post(f"{guarded_server.url}/generate", json=body, headers=AUTH, timeout=60)
    assert ok.status_code == 200
    assert metric(guarded_server.url, "tgi_request_success") >= 1
    assert metric(guarded_server.url, "tgi_request_generated_tokens_count") >= 1
    assert httpx.get(f"{guarded_server.url}/health").status_code == 200  # not protected


def test_disable_grammar_support_keeps_tgi_refusal(guarded_server):
    grammar = {"type": "regex", "value": "[a-z]+"}
    body = {"inputs": "hi", "parameters": {"max_new_tokens": 2, "grammar": grammar}}
    resp = httpx.post(f"{guarded_server.url}/generate", json=body, headers=AUTH, timeout=60)
    assert resp.status_code == 422
    assert resp.json()["error"] == "Input validation error: grammar is not supported"
    assert "constrained decoding on" not in guarded_server.logs()  # no vocabulary was built


def test_payload_limit_is_413(guarded_server):
    body = {"inputs": "x" * 5000, "parameters": {"max_new_tokens": 2}}
    resp = httpx.post(f"{guarded_server.url}/generate", json=body, headers=AUTH)
    assert resp.status_code == 413


def test_concurrency_limit_is_an_immediate_429(guarded_server):
    url = guarded_server.url
    # greedy from this prompt loops without EOS on the tiny model, so the stream stays busy
    body = {"inputs": "Hello world", "parameters": {"max_new_tokens": 300}}
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", f"{url}/generate_stream", json=body, headers=AUTH) as stream:
            lines = stream.iter_lines()
            next(lines)
            start = time.monotonic()
            resp = httpx.post(f"{url}/generate", json=body, headers=AUTH, timeout=10)
            assert resp.status_code == 429
            assert time.monotonic() - start < 5
            assert resp.json()["error_type"] == "overloaded"
            assert "retry-after" in resp.headers
            final = [line for line in lines if '"generated_text":"' in line]
    assert final and '"index":300' in final[0]


def test_disconnect_aborts_and_frees_blocks(guarded_server):
    url = guarded_server.url
    aborted = metric(url, "pytgi_aborted_requests")
    body = {"inputs": "Hello world", "parameters": {"max_new_tokens": 400}}  # no EOS on this model
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", f"{url}/generate_stream", json=body, headers=AUTH) as stream:
            lines = stream.iter_lines()
            next(lines)
            next(lines)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        done = metric(url, "pytgi_aborted_requests") > aborted
        if done and metric(url, "pytgi_kv_blocks_free") == metric(url, "pytgi_kv_blocks_total"):
            break
        time.sleep(0.2)
    assert metric(url, "pytgi_aborted_requests") == aborted + 1
    assert metric(url, "pytgi_kv_blocks_free") == metric(url, "pytgi_kv_blocks_total")


def test_sigterm_drains_in_flight_requests(tiny_model_factory, tmp_path):
    # a longer context than the other tests' model: the stream must outlast the checks below
    model_dir = tiny_model_factory("llama", max_position_embeddings=2048)
    server = ServerProcess(model_dir, "--max-total-tokens", "2000", log_path=tmp_path / "drain.log")
    server.wait_healthy()
    result, streaming = {}, threading.Event()
    num_tokens = 1500

    def stream_one():
        body = {"inputs": "Hello world", "parameters": {"max_new_tokens": num_tokens}}
        body["parameters"]["details"] = True
        with httpx.stream("POST", f"{server.url}/generate_stream", json=body, timeout=60) as r:
            events = []
            for line in r.iter_lines():
                if line.startswith("data:"):
                    events.append(json.loads(line[5:]))
                    streaming.set()
        result["final"] = events[-1]

    thread = threading.Thread(target=stream_one)
    thread.start()
    assert streaming.wait(30)
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    # still listening while it drains: new connections are answered, not refused
    health = httpx.get(f"{server.url}/health", timeout=10)
    assert health.status_code == 503
    assert health.json() == {"error": "draining", "error_type": "healthcheck"}
    body = {"inputs": "Hello", "parameters": {"max_new_tokens": 2}}
    refused = httpx.post(f"{server.url}/generate", json=body, timeout=10)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert thread.is_alive()  # the checks ran during the drain
    thread.join(60)
    code = server.proc.wait(60)
    server.stop()
    assert code == 0, server.logs()
    assert result["final"]["details"]["generated_tokens"] == num_tokens
    assert "ERROR" not in server.logs()  # a clean shutdown logs no engine failure


def test_engine_crash_ends_the_launcher(tiny_model_factory, tmp_path):
    server = ServerProcess(tiny_model_factory("llama"), log_path=tmp_path / "crash.log")
    server.wait_healthy()
    children = server.child_pids()
    assert children
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    code = server.proc.wait(30)
    server.stop()
    assert code != 0
    assert "engine" in server.logs().lower()
    time.sleep(0.5)
    assert not any(pid_alive(pid) for pid in children)


def test_slow_clients_are_cut_off(guarded_server):
    """30 clients trickle headers, 5 more a body, a byte per 0.2 s: all are closed within their
    deadlines (1 s for headers, 1.5 s for the body), while others are served normally."""
    host, port = "127.0.0.1", guarded_server.port
    head = b"POST /generate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    trickling_headers = [socket.create_connection((host, port)) for _ in range(30)]
    trickling_bodies = [socket.create_connection((host, port)) for _ in range(5)]
    for sock in trickling_bodies:
        sock.sendall(head + b"authorization: Bearer s3cret\r\ncontent-length: 100\r\n\r\n{")
    start = time.monotonic()
    open_socks = trickling_headers + trickling_bodies
    while open_socks and time.monotonic() - start < 6:
        for sock in list(open_socks):
            try:
                sock.sendall(b"x" if sock in trickling_bodies else head[:1])
            except OSError:  # closed by the server
                open_socks.remove(sock)
        assert httpx.get(f"{guarded_server.url}/health", timeout=5).status_code == 200
        time.sleep(0.2)
    elapsed = time.monotonic() - start
    for sock in trickling_headers + trickling_bodies:
        sock.close()
    assert not open_socks, f"{len(open_socks)} slow connections still open after {elapsed:.1f}s"
    assert elapsed < 4


def test_connections_past_the_limit_get_503(guarded_server):
    host, port = "127.0.0.1", guarded_server.port
    idle = [socket.create_connection((host, port)) for _ in range(40)]
    try:
        time.sleep(0.2)
        assert httpx.get(f"{guarded_server.url}/health", timeout=5).status_code == 503
    finally:
        for sock in idle:
            sock.close()
    time.sleep(0.3)
    assert httpx.get(f"{guarded_server.url}/health", timeout=5).status_code == 200
