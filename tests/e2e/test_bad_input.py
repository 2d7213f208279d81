"""Bad input through the real server (the demo model): every error is TGI's status and JSON body,
never a 500, and the keep-alive connection survives it (issue 13, black-box probe findings).
"""

from __future__ import annotations

import os
import random
import string
import time
from pathlib import Path

import httpx
import pytest

JSON = {"content-type": "application/json"}
# raw bodies: `\ud800` is a JSON escape of a lone UTF-16 surrogate, which no UTF-8 string can
# hold: TGI's JSON reader (serde_json) refuses it while reading the body, a 400
SURROGATE_BODIES = {
    "chat_role": (
        "/v1/chat/completions",
        '{"messages":[{"role":"\\ud800","content":"hi"}],"max_tokens":3}',
    ),
    "chat_content_stream": (
        "/v1/chat/completions",
        '{"messages":[{"role":"user","content":"hi \\ud800"}],"max_tokens":3,"stream":true}',
    ),
    "tool_schema": (
        "/v1/chat/completions",
        '{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"tools":[{"type":"function",'
        '"function":{"name":"f","parameters":{"type":"object","properties":{"\\udfff":1}}}}]}',
    ),
    "response_format_schema": (
        "/v1/chat/completions",
        '{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"response_format":'
        '{"type":"json_object","value":{"type":"string","pattern":"a\\ud800"}}}',
    ),
    "grammar_regex_stream": (
        "/generate_stream",
        '{"inputs":"a","parameters":{"max_new_tokens":2,"grammar":{"type":"regex",'
        '"value":"\\udc00b"}}}',
    ),
    "grammar_json": (
        "/generate",
        '{"inputs":"a","parameters":{"max_new_tokens":2,"grammar":{"type":"json",'
        '"value":{"properties":{"\\ud83d":{"type":"string"}}}}}}',
    ),
    "chat_tokenize_role": ("/chat_tokenize", '{"messages":[{"role":"\\ud800","content":"hi"}]}'),
    "invocations_role": (
        "/invocations",
        '{"messages":[{"role":"\\ud800","content":"hi"}],"max_tokens":3}',
    ),
    "generate_inputs": ("/generate", '{"inputs":"a\\ud800","parameters":{"max_new_tokens":2}}'),
    "raw_utf8_surrogate": ("/generate", b'{"inputs":"a\xed\xa0\x80","parameters":{}}'),
}


@pytest.mark.parametrize("case", list(SURROGATE_BODIES))
def test_lone_surrogates_get_a_400_on_a_kept_connection(pytgi_server_url, case):
    path, body = SURROGATE_BODIES[case]
    body = body if isinstance(body, bytes) else body.encode()
    with httpx.Client(base_url=pytgi_server_url, timeout=30) as client:
        response = client.post(path, content=body, headers=JSON)
        assert response.status_code == 400, response.text
        assert response.json()["error_type"] == "json"
        assert response.json()["error"].startswith("Failed to parse the request body as JSON: ")
        assert response.headers.get("connection") != "close"
        assert client.get("/health").status_code == 200  # the same connection still serves


def test_a_paired_surrogate_escape_is_one_character(pytgi_server_url):
    body = '{"inputs":"a \\ud83d\\ude00","parameters":{"max_new_tokens":1}}'
    response = httpx.post(f"{pytgi_server_url}/generate", content=body, headers=JSON, timeout=30)
    assert response.status_code == 200, response.text


# TGI (serde) parses strictly: non-standard JSON literals are a 400, coercions a 422
STRICT_BODIES = [
    ('{"inputs":"a","parameters":{"temperature":Infinity}}', 400),
    ('{"inputs":"a","parameters":{"repetition_penalty":-Infinity}}', 400),
    ('{"inputs":"a","parameters":{"temperature":NaN}}', 400),
    ('{"inputs":"a","parameters":{"max_new_tokens":"10"}}', 422),
    ('{"inputs":"a","parameters":{"max_new_tokens":2.0}}', 422),
    ('{"inputs":"a","parameters":{"do_sample":"yes"}}', 422),
    ('{"inputs":"a","parameters":{"details":1}}', 422),
    ('{"inputs":"a","stream":"false","parameters":{"max_new_tokens":1}}', 422),  # on `/`
]


@pytest.mark.parametrize(("body", "status"), STRICT_BODIES)
def test_tgi_routes_parse_as_strictly_as_tgi(pytgi_server_url, body, status):
    for path in ("/generate", "/") if "stream" not in body else ("/",):
        response = httpx.post(f"{pytgi_server_url}{path}", content=body, headers=JSON, timeout=30)
        assert response.status_code == status, (path, response.text)
        assert response.json()["error_type"] == ("json" if status == 400 else "validation")


def test_empty_messages_are_a_422(pytgi_server_url):
    for path in ("/v1/chat/completions", "/chat_tokenize"):
        response = httpx.post(f"{pytgi_server_url}{path}", json={"messages": []}, timeout=30)
        assert response.status_code == 422, response.text
        assert response.json()["error"] == "Input validation error: `messages` cannot be empty"


def test_vertex_route_predicts_each_instance(pytgi_server_url):
    instances = [
        {"inputs": "And God said", "parameters": {"max_new_tokens": 3, "seed": 1}},
        {"messages": [{"role": "user", "content": "Who made the light?"}], "max_tokens": 3},
    ]
    url = f"{pytgi_server_url}/vertex"
    response = httpx.post(url, json={"instances": instances}, timeout=60)
    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    assert len(predictions) == 2 and all(isinstance(p, str) and p for p in predictions)
    empty = httpx.post(url, json={"instances": []}, timeout=30)
    assert empty.status_code == 422
    assert empty.json() == {
        "error": "Input validation error",
        "error_type": "Input validation error",
    }


def _rss_bytes(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _huge_text(num_chars: int = 1_800_000) -> str:
    """~1M tokens of short random words (under the 2 MB payload limit once in JSON)."""
    rng = random.Random(0)
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(1, 3))) for _ in range(999)]
    return " ".join(rng.choices(words, k=num_chars // 2))[:num_chars]


def test_huge_prompts_are_refused_with_bounded_work_and_memory(pytgi_server):
    url, pid = pytgi_server.url, pytgi_server.proc.pid
    text = _huge_text()
    before = _rss_bytes(pid)
    with httpx.Client(base_url=url, timeout=60) as client:
        for _ in range(4):
            start = time.monotonic()
            body = {"inputs": text, "parameters": {"max_new_tokens": 2}}
            response = client.post("/generate", json=body)
            assert response.status_code == 422, response.text[:300]
            assert "must be <= " in response.json()["error"]
            assert time.monotonic() - start < 3.0  # counting stopped past the limit
        tokenized = client.post("/tokenize", json={"inputs": text})
        assert tokenized.status_code == 422  # not a 47 MB list of tokens
        assert len(tokenized.content) < 1000
        truncated = client.post(
            "/generate", json={"inputs": text, "parameters": {"truncate": 8, "max_new_tokens": 1}}
        )
        assert truncated.status_code == 200, truncated.text[:300]
    assert _rss_bytes(pid) - before < 100 * 2**20
