"""Bad input through the real server (the demo model): every error is TGI's status and JSON body,
never a 500, and the keep-alive connection survives it (issue 13, black-box probe findings).
"""

from __future__ import annotations

import json

import httpx
import pytest

JSON = {"content-type": "application/json"}
# raw bodies: `\ud800` is a JSON escape of a lone UTF-16 surrogate, which Python decodes into a
# str that UTF-8 cannot encode
SURROGATE_BODIES = {
    "chat_role": (
        "/v1/chat/completions",
        '{"messages":[{"role":"\\ud800","content":"hi"}],"max_tokens":3}',
        "template_error",
    ),
    "tool_choice": (
        "/v1/chat/completions",
        '{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"tool_choice":"\\ud800",'
        '"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object",'
        '"properties":{}}}}]}',
        "tool_error",
    ),
    "function_name": (
        "/v1/chat/completions",
        '{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"tools":[{"type":"function",'
        '"function":{"name":"\\ud800","parameters":{"type":"object","properties":{"\\udfff":1}}}}]}',
        "tool_error",
    ),
    "chat_tokenize_role": (
        "/chat_tokenize",
        '{"messages":[{"role":"\\ud800","content":"hi"}]}',
        "template_error",
    ),
    "invocations_role": (
        "/invocations",
        '{"messages":[{"role":"\\ud800","content":"hi"}],"max_tokens":3}',
        "template_error",
    ),
    "generate_inputs": (
        "/generate",
        '{"inputs":"a\\ud800","parameters":{"max_new_tokens":2}}',
        "validation",
    ),
}


@pytest.mark.parametrize("case", list(SURROGATE_BODIES))
def test_lone_surrogates_get_a_422_on_a_kept_connection(pytgi_server_url, case):
    path, body, error_type = SURROGATE_BODIES[case]
    with httpx.Client(base_url=pytgi_server_url, timeout=30) as client:
        response = client.post(path, content=body.encode(), headers=JSON)
        assert response.status_code == 422, response.text
        assert response.json()["error_type"] == error_type
        assert response.headers.get("connection") != "close"
        assert client.get("/health").status_code == 200  # the same connection still serves


def test_lone_surrogate_in_a_chat_stream_is_an_sse_error_event(pytgi_server_url):
    body = '{"messages":[{"role":"user","content":"hi \\ud800"}],"max_tokens":3,"stream":true}'
    response = httpx.post(
        f"{pytgi_server_url}/v1/chat/completions", content=body.encode(), headers=JSON, timeout=30
    )
    assert response.status_code == 200
    frames = [line[len("data: ") :] for line in response.text.splitlines() if line]
    assert json.loads(frames[0])["error"]["http_status_code"] == 422
    assert frames[-1] == "[DONE]"
