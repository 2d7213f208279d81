"""The real server on an architecture with no native file (OLMo 2): served by the transformers
fallback, which `/info` and the logs name; greedy output through TGI's client and the OpenAI
API matches transformers' own generate, alone and in a concurrent batch.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from models.runner_utils import hf_greedy_texts
from openai import OpenAI
from text_generation import Client

from e2e.server import ServerProcess

PROMPTS = ["The quick brown fox", "Hello world! How are you", "def main():"]
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def olmo2_dir(tiny_model_factory):
    return tiny_model_factory("olmo2")


@pytest.fixture(scope="module")
def server(olmo2_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("fallback-server") / "server.log"
    server = ServerProcess(olmo2_dir, log_path=log)
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def reference(olmo2_dir):
    """prompt -> transformers' greedy token ids (fp32, eager, EOS ignored)."""
    return hf_greedy_texts(olmo2_dir, PROMPTS, NEW_TOKENS)


def test_info_and_logs_name_the_fallback(server):
    info = httpx.get(f"{server.url}/info").json()
    assert info["model_architecture"] == "Olmo2ForCausalLM"
    assert info["model_implementation"] == "transformers"
    logs = server.logs()
    assert "Serving Olmo2ForCausalLM (transformers fallback implementation)" in logs
    assert "loaded Olmo2ForCausalLM (transformers implementation" in logs


def test_greedy_batch_matches_transformers(server, reference):
    client = Client(server.url, timeout=120)

    def generate(prompt: str):
        return client.generate(prompt, max_new_tokens=NEW_TOKENS, decoder_input_details=True)

    with ThreadPoolExecutor(len(PROMPTS)) as pool:  # one continuous batch
        responses = list(pool.map(generate, PROMPTS))
    for prompt, resp in zip(PROMPTS, responses, strict=True):
        ids = [t.id for t in resp.details.tokens]
        assert ids == reference[prompt][: len(ids)], prompt
        assert len(ids) == NEW_TOKENS or ids[-1] == 2  # length, or the tiny model's EOS


def test_stream_and_openai_chat(server, reference):
    client = Client(server.url, timeout=120)
    events = list(client.generate_stream(PROMPTS[0], max_new_tokens=8))
    ids = [e.token.id for e in events]
    assert ids == reference[PROMPTS[0]][: len(ids)] and events[-1].generated_text is not None
    chat = OpenAI(base_url=f"{server.url}/v1", api_key="-").chat.completions.create(
        model="tgi", messages=[{"role": "user", "content": "Hello"}], max_tokens=6, temperature=0
    )
    assert 1 <= chat.usage.completion_tokens <= 6
