"""What a first-time user meets on the real server (the demo model): Swagger UI that renders
offline, a log line per request with its timings and token counts (and the reason of a refusal),
and OpenAI clients' default `top_p: 1` accepted on the OpenAI routes (issue 13, items 9-10).
"""

from __future__ import annotations

import re
import time

import httpx
from openai import OpenAI


def test_docs_render_from_bundled_assets(pytgi_server_url):
    html = httpx.get(f"{pytgi_server_url}/docs", timeout=30).text
    assert "SwaggerUIBundle" in html
    assert not re.findall(r"https?://", html)  # nothing fetched from a CDN
    assets = re.findall(r"(?:src|href)=['\"]([^'\"]+)['\"]", html)
    assert any(a.endswith("swagger-ui-bundle.js") for a in assets)
    for asset in assets:
        response = httpx.get(f"{pytgi_server_url}{asset}", timeout=30)
        assert response.status_code == 200, asset
        assert len(response.content) > 100


def _wait_for_log(server, needle: str, timeout_s: float = 10.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        logs = server.logs()
        if needle in logs:
            return logs
        time.sleep(0.1)
    raise AssertionError(f"{needle!r} not in the server log")


def test_each_request_logs_its_timings_or_its_refusal(pytgi_server):
    url = pytgi_server.url
    body = {"inputs": "And God said", "parameters": {"max_new_tokens": 7}}
    assert httpx.post(f"{url}/generate", json=body, timeout=60).status_code == 200
    logs = _wait_for_log(pytgi_server, " + 7 generated tokens in ")
    line = next(x for x in logs.splitlines() if " + 7 generated tokens in " in x)
    assert re.search(r"Success: \d+ prompt \+ 7 generated tokens in [\d.]+s \(validation", line)
    assert "queue" in line and "inference" in line and "ms/token" in line
    bad = {"inputs": "And God said", "parameters": {"temperature": 0}}
    assert httpx.post(f"{url}/generate", json=bad, timeout=30).status_code == 422
    _wait_for_log(pytgi_server, "/generate: 422 validation: Input validation error: `temperature`")


def test_openai_clients_default_top_p_of_one_is_accepted(pytgi_server_url):
    client = OpenAI(base_url=f"{pytgi_server_url}/v1", api_key="-", max_retries=0)
    chat = client.chat.completions.create(
        model="tgi", messages=[{"role": "user", "content": "Hi"}], max_tokens=3, top_p=1
    )
    assert chat.choices[0].finish_reason in ("length", "stop")
    completion = client.completions.create(model="tgi", prompt="And", max_tokens=3, top_p=1.0)
    assert completion.choices[0].text
    # TGI's own routes keep TGI's rule
    body = {"inputs": "And", "parameters": {"top_p": 1.0, "max_new_tokens": 2}}
    refused = httpx.post(f"{pytgi_server_url}/generate", json=body, timeout=30)
    assert refused.status_code == 422
    assert "`top_p` must be > 0.0 and < 1.0" in refused.json()["error"]
