"""A tiny Idefics 2 served by the real `pytgi serve`: an OpenAI chat with an `image_url` part and
`/generate` with markdown images equal transformers' greedy generate on the same processor
outputs, and generation stops at <end_of_utterance> (generation_config.json's EOS list, as
transformers and TGI stop there). The checkpoint's LM-head row of <end_of_utterance> is tilted
towards an early greedy token so that the stop happens within a few tokens."""

from __future__ import annotations

import shutil

import httpx
import pytest
import torch
from fixtures.images import data_uri, png_bytes
from models.vlm_utils import VlmPrompts, hf_greedy
from openai import OpenAI

from e2e.server import running_server

IMAGE = (40, 30, 11)
QUESTION = "What is in the picture?"
NEW_TOKENS = 12


def chat_prompt(content: str) -> str:
    """The tiny model's chat template for one user turn, as rendered by the server."""
    return f"User:{content}<end_of_utterance>\nAssistant:"


@pytest.fixture(scope="module")
def checkpoint(tiny_vlm_factory, tmp_path_factory):
    """The tiny Idefics 2, its <end_of_utterance> row tilted; with the reference (prompt ids,
    transformers' greedy tokens ending in <end_of_utterance>, their text)."""
    import transformers

    torch.set_num_threads(1)
    model_dir = tmp_path_factory.mktemp("idefics2-eou")
    shutil.copytree(tiny_vlm_factory("idefics2"), model_dir, dirs_exist_ok=True)
    cls = transformers.Idefics2ForConditionalGeneration
    hf = cls.from_pretrained(model_dir, attn_implementation="eager").eval()
    prompts = VlmPrompts(model_dir)
    eou = prompts.tokenizer.backend.token_to_id("<end_of_utterance>")
    ids, placed = prompts.build(chat_prompt("{0}" + QUESTION), [IMAGE])
    tokens, _ = hf_greedy(hf, ids, placed, 3)
    with torch.no_grad():  # <end_of_utterance> now outscores the third token where it wins
        hf.lm_head.weight[eou] = hf.lm_head.weight[tokens[2]] * 1.05
    hf.save_pretrained(model_dir, safe_serialization=True)
    tokens, _ = hf_greedy(hf, ids, placed, NEW_TOKENS)
    assert tokens[-1] == eou and len(tokens) < NEW_TOKENS  # transformers stops there
    text = prompts.tokenizer.decode(tokens[:-1], skip_special_tokens=True)
    return model_dir, ids, tokens, text


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    log = tmp_path_factory.mktemp("idefics2-server") / "server.log"
    with running_server(
        checkpoint[0], "--max-input-tokens", "80", "--max-total-tokens", "100", log_path=log
    ) as server:
        yield server


def test_openai_chat_with_image_stops_at_end_of_utterance(server, checkpoint):
    _, ids, _, text = checkpoint
    client = OpenAI(base_url=f"{server.url}/v1", api_key="-")
    content = [
        {"type": "image_url", "image_url": {"url": data_uri(png_bytes(*IMAGE))}},
        {"type": "text", "text": QUESTION},
    ]
    out = client.chat.completions.create(
        model="tgi", messages=[{"role": "user", "content": content}],
        max_tokens=NEW_TOKENS, temperature=0,
    )  # fmt: skip
    assert out.choices[0].message.content == text
    assert out.choices[0].finish_reason == "stop"
    assert out.usage.prompt_tokens == len(ids)


def test_generate_with_markdown_images(server, checkpoint):
    _, ids, tokens, _ = checkpoint
    inputs = chat_prompt(f"![]({data_uri(png_bytes(*IMAGE))}){QUESTION}")
    body = {"inputs": inputs, "parameters": {"max_new_tokens": NEW_TOKENS, "details": True}}
    response = httpx.post(f"{server.url}/generate", json=body, timeout=120)
    assert response.status_code == 200, response.text
    details = response.json()["details"]
    assert [t["id"] for t in details["tokens"]] == tokens
    assert details["finish_reason"] == "eos_token"
