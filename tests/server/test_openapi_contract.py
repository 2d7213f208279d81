"""Our responses against the schemas of TGI's OpenAPI document, and our own document's routes.

TGI's document is read from the shared reference folder when it is there (it is not part of the
repository), else these tests are skipped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from server.fakes import ScriptedInfer
from server.harness import asgi_client, scripted_app

_REFERENCE = Path("shared") / "reference" / "tgi-openapi.json"
TGI_OPENAPI = next(  # beside the clone (CI) or above a worktree
    (p / _REFERENCE for p in Path(__file__).resolve().parents if (p / _REFERENCE).exists()),
    Path(__file__).resolve().parents[3] / _REFERENCE,
)

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not TGI_OPENAPI.exists(), reason="TGI's OpenAPI document not available"),
]

MESSAGES = [{"role": "user", "content": "Hi"}]


def _nullable_to_json_schema(node: Any) -> Any:
    """OpenAPI 3.0 `nullable: true` → JSON Schema `anyOf [..., null]`."""
    if isinstance(node, list):
        return [_nullable_to_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    converted = {k: _nullable_to_json_schema(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable"):
        return {"anyOf": [converted, {"type": "null"}]}
    return converted


@pytest.fixture(scope="module")
def tgi_document() -> dict:
    return json.loads(TGI_OPENAPI.read_text())


@pytest.fixture(scope="module")
def validate(tgi_document):
    document = _nullable_to_json_schema(tgi_document)

    def check(instance: Any, schema_name: str) -> None:
        schema = {"$ref": f"#/components/schemas/{schema_name}", **document}
        jsonschema.validate(instance, schema)

    return check


def sse_json(text: str) -> list:
    frames = [f.removeprefix("data: ") for f in text.split("\n\n") if f]
    return [json.loads(f) for f in frames if f != "[DONE]"]


async def test_generate_responses_match(validate):
    body = {"inputs": "Hi", "parameters": {"details": True, "top_n_tokens": 2, "seed": 1}}
    async with asgi_client(scripted_app()) as client:
        validate((await client.post("/generate", json=body)).json(), "GenerateResponse")
        for item in (await client.post("/", json=body)).json():
            validate(item, "GenerateResponse")
        for event in sse_json((await client.post("/generate_stream", json=body)).text):
            validate(event, "StreamResponse")
        validate((await client.post("/tokenize", json=body)).json(), "TokenizeResponse")
        validate((await client.get("/info")).json(), "Info")


async def test_chat_responses_match(validate):
    body = {"messages": MESSAGES, "logprobs": True, "top_logprobs": 2}
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async with asgi_client(scripted_app()) as client:
        validate((await client.post("/v1/chat/completions", json=body)).json(), "ChatCompletion")
        for chunk in sse_json((await client.post("/v1/chat/completions", json=stream)).text):
            validate(chunk, "ChatCompletionChunk")
        tokenized = (await client.post("/chat_tokenize", json=body)).json()
        validate(tokenized, "ChatTokenizeResponse")


async def test_tool_call_responses_match(validate):
    words = ['{"function": {"_name": "f", ', '"a": 1}}']
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    body = {"messages": MESSAGES, "tools": tools}
    async with asgi_client(scripted_app(ScriptedInfer(words))) as client:
        validate((await client.post("/v1/chat/completions", json=body)).json(), "ChatCompletion")
        response = await client.post("/v1/chat/completions", json={**body, "stream": True})
        for chunk in sse_json(response.text):
            validate(chunk, "ChatCompletionChunk")


async def test_completion_responses_match(validate):
    async with asgi_client(scripted_app()) as client:
        final = (await client.post("/v1/completions", json={"prompt": ["a", "b"]})).json()
        validate(final, "CompletionFinal")
        response = await client.post("/v1/completions", json={"prompt": "a", "stream": True})
        for chunk in sse_json(response.text):
            validate(chunk, "CompletionFinal" if "usage" in chunk else "Chunk")


async def test_error_bodies_match(validate):
    async with asgi_client(scripted_app()) as client:
        for response in (
            await client.post("/generate", json={"inputs": 1}),
            await client.post("/v1/completions", json={"prompt": "a", "suffix": "b"}),
        ):
            validate(response.json(), "ErrorResponse")


async def test_our_document_has_tgi_paths_operations_and_title(tgi_document):
    async with asgi_client(scripted_app()) as client:
        ours = (await client.get("/api-doc/openapi.json")).json()
        assert (await client.get("/docs")).status_code == 200
    assert ours["info"]["title"] == tgi_document["info"]["title"]
    assert ours["info"]["version"] == tgi_document["info"]["version"]
    for path, operations in tgi_document["paths"].items():
        for method, operation in operations.items():
            assert method in ours["paths"].get(path, {}), f"{method.upper()} {path}"
            assert ours["paths"][path][method]["operationId"] == operation["operationId"]
    for name in (
        "GenerateRequest",
        "CompatGenerateRequest",
        "ChatRequest",
        "CompletionRequest",
        "GenerateParameters",
        "GenerateResponse",
        "Info",
        "Token",
        "Details",
    ):
        assert name in ours["components"]["schemas"], name
