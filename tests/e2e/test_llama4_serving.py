"""A tiny Llama 4 (vision tower, MoE text model with chunked attention) served by the real
`pytgi serve`: a markdown image in `/generate` (several tiles plus the global tile), an OpenAI
chat request with an `image_url` part, and a text-only prompt, in one continuous batch; greedy
tokens equal transformers' generate on the same processor outputs."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
from fixtures.images import data_uri, png_bytes
from models.vlm_utils import VlmPrompts, hf_greedy
from openai import OpenAI

from e2e.server import ServerProcess

NEW_TOKENS = 8
WIDE = (112, 56, 21)  # a 1 x 2 canvas of 56 px tiles and the global tile: 12 image tokens
SMALL = (40, 40, 22)  # one tile, no global tile: 4 image tokens


def chat_prompt(content: str) -> str:
    """The tiny model's chat template for one user turn, as the server renders it."""
    user = f"<|header_start|>user<|header_end|>\n\n{content}<|eot|>"
    return user + "<|header_start|>assistant<|header_end|>\n\n"


@pytest.fixture(scope="module")
def served(tiny_vlm_factory, tmp_path_factory):
    import transformers

    model_dir = tiny_vlm_factory("llama4")
    log = tmp_path_factory.mktemp("llama4-server") / "server.log"
    server = ServerProcess(model_dir, log_path=log)
    try:
        server.wait_healthy(timeout_s=300)
        hf = transformers.Llama4ForConditionalGeneration.from_pretrained(
            model_dir, attn_implementation="eager"
        ).eval()
        yield server, VlmPrompts(model_dir), hf
    finally:
        server.stop()


def expected(prompts, hf, text: str, images) -> list[int]:
    torch.set_num_threads(1)
    ids, inputs = prompts.build(text, images)
    return hf_greedy(hf, ids, inputs, NEW_TOKENS)[0]


def test_images_and_text_in_one_batch(served):
    server, prompts, hf = served
    eot = prompts.tokenizer.backend.token_to_id("<|eot|>")
    cases = [
        ("Describe {0} briefly.", [WIDE]),
        ("{0} and {1}: which is larger?", [SMALL, WIDE]),
        ("The quick brown fox jumps over the lazy dog.", []),
    ]

    def generate(case):
        text, images = case
        uris = [f"![]({data_uri(png_bytes(*image))})" for image in images]
        body = {
            "inputs": text.format(*uris),
            "parameters": {"max_new_tokens": NEW_TOKENS, "details": True},
        }
        response = httpx.post(f"{server.url}/generate", json=body, timeout=120)
        assert response.status_code == 200, response.text
        return [t["id"] for t in response.json()["details"]["tokens"]]

    with ThreadPoolExecutor(len(cases)) as pool:
        served_ids = list(pool.map(generate, cases))
    for (text, images), ids in zip(cases, served_ids, strict=True):
        reference = expected(prompts, hf, text, images)
        assert ids == reference[: len(ids)], text
        assert len(ids) == NEW_TOKENS or ids[-1] == eot


def test_openai_chat_with_image_url(served):
    server, prompts, hf = served
    eot = prompts.tokenizer.backend.token_to_id("<|eot|>")
    reference = expected(prompts, hf, chat_prompt("{0}What is it?"), [WIDE])
    if eot in reference:
        reference = reference[: reference.index(eot)]
    client = OpenAI(base_url=f"{server.url}/v1", api_key="-")
    content = [
        {"type": "image_url", "image_url": {"url": data_uri(png_bytes(*WIDE))}},
        {"type": "text", "text": "What is it?"},
    ]
    out = client.chat.completions.create(
        model="tgi", messages=[{"role": "user", "content": content}],
        max_tokens=NEW_TOKENS, temperature=0,
    )  # fmt: skip
    text = prompts.tokenizer.decode(reference, skip_special_tokens=True)
    assert out.choices[0].message.content == text
