"""The server on the real router and tokenizer, over `FakeEngine` (swap `engine_factory` to run
the same checks on the real engine): text, details, stops, limits, overload, chat template."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from server.harness import SCRIPT, asgi_client

from pytgi.config import LimitsConfig

pytestmark = pytest.mark.anyio


def sse_payloads(text: str) -> list[str]:
    return [f.removeprefix("data: ") for f in text.split("\n\n") if f]


async def test_generate_details_from_engine_tokens(real_app, tokenizer):
    app, engine = real_app()
    body = {"inputs": "Hello", "parameters": {"max_new_tokens": 4, "details": True}}
    async with asgi_client(app) as client:
        response = await client.post("/generate", json=body)
    data = response.json()
    ids = tokenizer.encode(SCRIPT, add_special_tokens=False).ids[:4]
    assert data["generated_text"] == tokenizer.decode(ids, skip_special_tokens=True)
    assert [t["id"] for t in data["details"]["tokens"]] == ids
    assert data["details"]["finish_reason"] == "length"
    assert data["details"]["generated_tokens"] == 4
    assert response.headers["x-prompt-tokens"] == str(len(engine.requests[0].prompt_ids))


async def test_generation_ends_at_eos_and_at_stop_sequences(real_app):
    app, engine = real_app()
    async with asgi_client(app) as client:
        eos = await client.post("/generate", json={"inputs": "a", "parameters": {"details": True}})
        stop = await client.post(
            "/generate",
            json={"inputs": "a", "parameters": {"stop": ["fox"], "details": True}},
        )
    assert eos.json()["generated_text"] == SCRIPT
    assert eos.json()["details"]["finish_reason"] == "eos_token"
    assert stop.json()["generated_text"] == " The quick brown fox"
    assert stop.json()["details"]["finish_reason"] == "stop_sequence"
    assert engine.aborted  # the stop string aborted the engine request


async def test_stream_text_matches_non_stream(real_app):
    app, _ = real_app()
    async with asgi_client(app) as client:
        response = await client.post("/generate_stream", json={"inputs": "a", "parameters": {}})
    events = [json.loads(p) for p in sse_payloads(response.text)]
    assert "".join(e["token"]["text"] for e in events if not e["token"]["special"]) == SCRIPT
    assert events[-1]["generated_text"] == SCRIPT


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"temperature": 0}, "`temperature` must be strictly positive"),
        ({"top_p": 1.0}, "`top_p` must be > 0.0 and < 1.0"),
        ({"max_new_tokens": 0}, "`max_new_tokens` must be strictly positive"),
    ],
)
async def test_validation_messages(real_app, parameters, message):
    app, _ = real_app()
    body = {"inputs": "a", "parameters": parameters}
    async with asgi_client(app) as client:
        response = await client.post("/generate", json=body)
        stream = await client.post("/generate_stream", json=body)
    expected = {"error": f"Input validation error: {message}", "error_type": "validation"}
    assert (response.status_code, response.json()) == (422, expected)
    assert stream.status_code == 200
    assert [json.loads(p) for p in sse_payloads(stream.text)] == [expected]


async def test_best_of_is_refused_in_streams(real_app):
    app, _ = real_app()
    body = {"inputs": "a", "parameters": {"best_of": 2, "do_sample": True}}
    async with asgi_client(app) as client:
        stream = await client.post("/generate_stream", json=body)
    assert "`best_of` != 1 is not supported when streaming tokens" in stream.text


async def test_overload_is_429_with_retry_after(real_app, engine_factory):
    limits = LimitsConfig(max_concurrent_requests=1)
    app, _ = real_app(engine_factory(delay_s=0.05), limits=limits)
    body = {"inputs": "a", "parameters": {"max_new_tokens": 5}}
    async with asgi_client(app) as client:
        first = asyncio.create_task(client.post("/generate", json=body))
        await asyncio.sleep(0.03)
        second = await client.post("/generate", json=body)
        assert (await first).status_code == 200
    assert second.status_code == 429
    assert second.json() == {"error": "Model is overloaded", "error_type": "overloaded"}
    assert second.headers["retry-after"] == "1"


async def test_chat_uses_the_model_template(real_app, tokenizer):
    app, engine = real_app()
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0}
    async with asgi_client(app) as client:
        chat = await client.post("/v1/chat/completions", json=body)
        tokenized = await client.post("/chat_tokenize", json=body)
    assert tokenized.json()["templated_text"] == "<|user|>\nHi</s>\n<|assistant|>\n"
    ids = [t["id"] for t in tokenized.json()["tokenize_response"]]
    assert engine.requests[0].prompt_ids == ids
    data = chat.json()
    assert data["usage"]["prompt_tokens"] == len(ids)
    assert data["choices"][0]["finish_reason"] == "length"


async def test_tokenize_offsets(real_app, tokenizer):
    app, _ = real_app()
    async with asgi_client(app) as client:
        spans = (await client.post("/tokenize", json={"inputs": "Hello world"})).json()
    assert spans[0]["id"] == tokenizer.bos_token_id
    assert "".join(s["text"] for s in spans) == "Hello world"
    assert spans[-1]["stop"] == len("Hello world")


async def test_generation_config_eos_also_ends_generation(tokenizer, tokenizer_dir, tmp_path):
    """A chat model's generation_config.json names its end-of-turn token, not the tokenizer's EOS:
    generation stops there too (issue 13)."""
    import shutil

    from server.fakes import CACHE_INFO, FakeEngine
    from server.harness import server_config

    from pytgi.router.infer import Infer
    from pytgi.server.app import create_app
    from pytgi.tokenizer.tokenizer import Tokenizer

    script_ids = tokenizer.encode(SCRIPT, add_special_tokens=False).ids
    end_of_turn = script_ids[3]
    model_dir = Path(shutil.copytree(tokenizer_dir, tmp_path / "model"))
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": end_of_turn}))
    chat_tokenizer = Tokenizer.from_dir(model_dir)
    engine = FakeEngine(script_ids)  # never emits the tokenizer's own EOS
    config = server_config()
    infer = Infer(engine, chat_tokenizer, config.limits, CACHE_INFO)
    app = create_app(infer, engine, config, CACHE_INFO, model_info={"model_id": "m"})
    body = {"inputs": "a", "parameters": {"details": True, "max_new_tokens": 20}}
    async with asgi_client(app) as client:
        data = (await client.post("/generate", json=body)).json()
    assert data["details"]["finish_reason"] == "eos_token"
    assert data["details"]["generated_tokens"] == 4
