"""The server on the real in-process engine and a tiny random-weight Llama (`slow`: it builds the
checkpoint). Assertions hold for any model: they compare the routes with each other."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
import text_generation
from server.harness import MODEL_ID, serve, server_config

from pytgi.server.app import create_app

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def live(tiny_model_factory):
    from pytgi.engine.inproc_client import InprocEngineClient
    from pytgi.router.infer import Infer
    from pytgi.runtime.build import build_engine_core, engine_config
    from pytgi.tokenizer.tokenizer import Tokenizer

    model_dir = tiny_model_factory("llama")
    engine = InprocEngineClient(build_engine_core(engine_config(str(model_dir), num_blocks=64)))
    config = server_config()
    infer = Infer(engine, Tokenizer.from_dir(model_dir), config.limits, engine.cache_info)
    app = create_app(infer, engine, config, engine.cache_info, model_info={"model_id": MODEL_ID})
    with serve(app) as url:
        yield url, engine, infer
    engine.core.shutdown()


def test_generate_stream_and_chat_agree(live):
    url, _, _ = live
    client = text_generation.Client(url)
    greedy = client.generate("The quick", max_new_tokens=8)
    streamed = list(client.generate_stream("The quick", max_new_tokens=8))
    assert [e.token.id for e in streamed] == [t.id for t in greedy.details.tokens]
    assert streamed[-1].generated_text == greedy.generated_text
    chat = openai.OpenAI(base_url=f"{url}/v1", api_key="-")
    full = chat.chat.completions.create(model="tgi", messages=MESSAGES, max_tokens=6, temperature=0)
    chunks = list(
        chat.chat.completions.create(
            model="tgi",
            messages=MESSAGES,
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_disconnect_frees_the_engine(live):
    url, engine, infer = live
    body = {"inputs": "The quick", "parameters": {"max_new_tokens": 400}}
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", f"{url}/generate_stream", json=body) as response:
            assert next(line for line in response.iter_lines() if line.startswith("data: "))
    deadline = time.monotonic() + 10
    while infer.num_in_flight or engine.stats().num_running:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    metrics = httpx.get(f"{url}/metrics").text
    assert "tgi_batch_current_size 0.0" in metrics.splitlines()
