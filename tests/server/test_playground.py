"""The /playground page and live dashboard, through the real `pytgi serve` (demo model): page and
bundled assets served, the API it calls guarded by --api-key, --disable-playground and its env twin.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest
from e2e.server import ServerProcess

from pytgi.demo_model import demo_model_path

KEY = "play-key"
# the page does not depend on the compiled CPU kernels: the pure-torch path starts without waiting
# on a kernel build another process may hold the lock of
NO_KERNELS = "PYTGI_CPU_KERNELS"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    log = tmp_path_factory.mktemp("playground") / "server.log"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(NO_KERNELS, "0")
        server = ServerProcess(demo_model_path(), "--api-key", KEY, log_path=log)
    server.wait_healthy(timeout_s=300)
    yield server
    server.stop()


def test_page_is_served_with_its_bundled_assets(keyed_server):
    page = httpx.get(f"{keyed_server.url}/playground")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sorted(assets) == [
        "/playground/assets/metrics.js",
        "/playground/assets/playground.css",
        "/playground/assets/playground.js",
    ]  # all local: nothing from a CDN
    for asset in assets:
        response = httpx.get(f"{keyed_server.url}{asset}")
        assert response.status_code == 200, asset
        assert "http://" not in response.text and "https://" not in response.text
    script = httpx.get(f"{keyed_server.url}/playground/assets/playground.js").text
    assert "/v1/chat/completions" in script and "/metrics" in script
    assert httpx.get(f"{keyed_server.url}/playground/assets/missing.js").status_code == 404
    redirect = httpx.get(f"{keyed_server.url}/playground/")
    assert redirect.status_code in (307, 308) and redirect.headers["location"] == "/playground"


def _chat(url: str, headers: dict, **extra) -> httpx.Response:
    body = {
        "model": "tgi",
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 8,
        "stream": True,
        **extra,
    }
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60)


def test_api_calls_of_the_page_need_the_key(keyed_server):
    # the page is public; what it calls is not: without the key the chat is refused
    assert httpx.get(f"{keyed_server.url}/playground").status_code == 200
    assert _chat(keyed_server.url, {}).status_code == 401
    assert _chat(keyed_server.url, {"Authorization": "Bearer wrong"}).status_code == 401


def test_chat_streams_as_the_page_reads_it(keyed_server):
    response = _chat(keyed_server.url, AUTH, temperature=0.7, top_p=0.9, seed=1)
    assert response.status_code == 200
    data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert len(chunks) > 1
    assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop", "eos_token")


def test_json_mode_as_the_page_sends_it(keyed_server):
    response = _chat(
        keyed_server.url, AUTH, stream=False, max_tokens=24, response_format={"type": "json_object"}
    )
    assert response.status_code == 200, response.text
    text = response.json()["choices"][0]["message"]["content"]
    assert text.lstrip().startswith("{")


def test_dashboard_metrics_are_there(keyed_server):
    text = httpx.get(f"{keyed_server.url}/metrics").text
    script = httpx.get(f"{keyed_server.url}/playground/assets/playground.js").text
    for name in re.findall(r"m\.((?:tgi|pytgi)_[a-z_]+)", script):
        assert re.search(rf"^{name}(\{{| )", text, re.M), name


def test_disable_playground_env_twin(tmp_path, monkeypatch):
    monkeypatch.setenv("DISABLE_PLAYGROUND", "true")
    monkeypatch.setenv(NO_KERNELS, "0")
    server = ServerProcess(demo_model_path(), log_path=tmp_path / "server.log")
    try:
        server.wait_healthy(timeout_s=300)
        assert httpx.get(f"{server.url}/playground").status_code == 404
        assert httpx.get(f"{server.url}/playground/assets/playground.js").status_code == 404
        assert httpx.get(f"{server.url}/health").status_code == 200
    finally:
        server.stop()
