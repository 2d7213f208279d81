"""`pytgi serve --lora-adapters` through HTTP: each adapter's greedy tokens are those of
transformers with PEFT's merged model; /info and /v1/models list the adapters; an unknown
`adapter_id` is a 422, an unknown chat `model` serves the base model (as TGI); the decode steps
mixing adapters run in the fused CPU decode stack."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch
from fixtures.lora_adapters import ADAPTERS, make_adapter, merged_model
from models.runner_utils import load_hf

from e2e.server import ServerProcess

NEW_TOKENS = 10
PROMPT = "The quick brown fox jumps over"


@pytest.fixture(scope="module")
def lora_server(tiny_model_factory, tmp_path_factory):
    base = tiny_model_factory("llama")
    root = tmp_path_factory.mktemp("lora-e2e")
    adapters = {
        k: make_adapter(base, root / k, seed=i, **o) for i, (k, o) in enumerate(ADAPTERS.items())
    }
    spec = ",".join(f"{k}={d}" for k, d in adapters.items())
    server = ServerProcess(base, "--lora-adapters", spec, log_path=root / "server.log")
    try:
        server.wait_healthy()
        yield server, base, adapters
    finally:
        server.stop()


@torch.no_grad()
def greedy(hf, ids: list[int]) -> list[int]:
    out = hf.generate(
        torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=3
    )
    return out[0, len(ids) :].tolist()


async def generate_all(url: str, adapter_ids: list[str | None]) -> list[list[int]]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        bodies = [
            {"inputs": PROMPT, "parameters": {"max_new_tokens": NEW_TOKENS, "details": True,
                                              "adapter_id": a}}
            for a in adapter_ids
        ]  # fmt: skip
        responses = await asyncio.gather(*(client.post("/generate", json=b) for b in bodies))
    return [[t["id"] for t in r.json()["details"]["tokens"]] for r in responses]


def test_adapters_in_one_batch_match_peft(lora_server):
    server, base, adapters = lora_server
    ids = [t["id"] for t in httpx.post(f"{server.url}/tokenize", json={"inputs": PROMPT}).json()]
    order = [None, *adapters, None, "all-r4"]
    served = asyncio.run(generate_all(server.url, order))
    refs = {None: load_hf(base), **{k: merged_model(base, d) for k, d in adapters.items()}}
    for adapter_id, tokens in zip(order, served, strict=True):
        assert tokens == greedy(refs[adapter_id], ids)[: len(tokens)], adapter_id
        assert len(tokens) == NEW_TOKENS or tokens[-1] == 2
    assert len({tuple(t) for t in served}) > 1
    # the decode steps mixing adapters ran in the fused CPU decode stack, none layer by layer
    logs = server.logs()
    assert f"LoRA rows of {len(adapters)} adapter(s)" in logs
    assert "adapter rows run layer by layer" not in logs


def test_adapters_are_listed(lora_server):
    server, _, adapters = lora_server
    info = httpx.get(f"{server.url}/info").json()
    assert info["lora_adapters"] == list(adapters)
    models = [m["id"] for m in httpx.get(f"{server.url}/v1/models").json()["data"]]
    assert models[1:] == list(adapters)


def test_unknown_adapter_id_is_a_422(lora_server):
    server, _, _ = lora_server
    body = {"inputs": PROMPT, "parameters": {"adapter_id": "nope"}}
    r = httpx.post(f"{server.url}/generate", json=body)
    assert r.status_code == 422
    assert r.json()["error_type"] == "validation"
    assert "nope" in r.json()["error"]


def test_chat_model_picks_the_adapter(lora_server):
    server, _, _ = lora_server

    def chat(model: str) -> str:
        body = {"model": model, "messages": [{"role": "user", "content": PROMPT}],
                "temperature": 0, "max_tokens": NEW_TOKENS}  # fmt: skip
        r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]

    base = chat("tgi")
    assert chat("some-client-name") == base  # unknown: the base model, as TGI
    assert chat("all-r4") != base
