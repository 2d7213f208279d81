"""A tiny Mllama (Llama 3.2 Vision) served by the real `pytgi serve`: TGI's markdown image in
`/generate` and an OpenAI `image_url` part through `/v1/chat/completions` (the chat template
puts <|image|> where the image goes). Greedy tokens equal transformers' generate on the real
MllamaProcessor's outputs (its cross-attention mask included); a text-only request beside them
skips the cross-attention layers."""

from __future__ import annotations

import httpx
import pytest
import torch
from fixtures.images import data_uri, png_bytes
from models.vlm_utils import hf_greedy, processor_inputs
from openai import OpenAI

from e2e.server import running_server

IMAGE = (56, 28, 11)  # 2 tiles of 28 px
QUESTION = "What is in the picture?"
NEW_TOKENS = 8
EOS = 9  # <|im_end|> in the fixture's tokenizer
INPUTS = ("pixel_values", "aspect_ratio_ids", "aspect_ratio_mask", "cross_attention_mask")


def chat_prompt(content: str) -> str:
    """The tiny model's chat template for one user turn, as rendered by the server."""
    return f"<s><|user|>\n{content}<|im_end|>\n<|assistant|>\n"


@pytest.fixture(scope="module")
def server(tiny_vlm_factory, tmp_path_factory):
    model_dir = tiny_vlm_factory("mllama")
    log = tmp_path_factory.mktemp("mllama-server") / "server.log"
    with running_server(model_dir, log_path=log) as server:
        yield server, model_dir


def reference(model_dir, text: str, images) -> tuple[list[int], str]:
    """transformers' greedy tokens (up to EOS) and their text, on MllamaProcessor's inputs."""
    from transformers import (
        AutoTokenizer,
        MllamaForConditionalGeneration,
        MllamaImageProcessor,
        MllamaProcessor,
    )

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    processor = MllamaProcessor(MllamaImageProcessor.from_pretrained(model_dir), tokenizer)
    hf = MllamaForConditionalGeneration.from_pretrained(model_dir, attn_implementation="eager")
    ids, inputs = processor_inputs(processor, text, images, INPUTS)
    tokens, _ = hf_greedy(hf.eval(), ids, [], NEW_TOKENS, inputs=inputs)
    if EOS in tokens:  # the server stops there
        tokens = tokens[: tokens.index(EOS) + 1]
    return tokens, tokenizer.decode([t for t in tokens if t != EOS], skip_special_tokens=True)


def test_generate_and_chat_with_an_image(server):
    server, model_dir = server
    tokens, text = reference(model_dir, chat_prompt("<|image|>" + QUESTION), [IMAGE])
    uri = data_uri(png_bytes(*IMAGE))
    body = {
        "inputs": chat_prompt(f"![]({uri}){QUESTION}"),
        "parameters": {"max_new_tokens": NEW_TOKENS, "details": True},
    }
    response = httpx.post(f"{server.url}/generate", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert [t["id"] for t in response.json()["details"]["tokens"]] == tokens

    client = OpenAI(base_url=f"{server.url}/v1", api_key="-")
    content = [
        {"type": "image_url", "image_url": {"url": uri}},
        {"type": "text", "text": QUESTION},
    ]
    out = client.chat.completions.create(
        model="tgi", messages=[{"role": "user", "content": content}],
        max_tokens=NEW_TOKENS, temperature=0,
    )  # fmt: skip
    assert out.choices[0].message.content == text


def test_text_only_request(server):
    server, model_dir = server
    tokens, _ = reference(model_dir, chat_prompt(QUESTION), [])
    body = {"inputs": chat_prompt(QUESTION), "parameters": {"max_new_tokens": NEW_TOKENS,
                                                            "details": True}}  # fmt: skip
    response = httpx.post(f"{server.url}/generate", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert [t["id"] for t in response.json()["details"]["tokens"]] == tokens
