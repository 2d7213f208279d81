"""A tiny PaliGemma 2 served by the real `pytgi serve`: no chat template, so images come as TGI's
markdown in `/generate` inputs; the server lays the prompt out as PaliGemmaProcessor does
(images, <bos>, text, newline) and its greedy tokens equal transformers' generate on the same
processor outputs, for an image prompt, a text-only prompt and both in one concurrent burst."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest
import torch
from fixtures.images import data_uri, png_bytes
from models.vlm_utils import VlmPrompts, hf_greedy

from e2e.server import running_server

NEW_TOKENS = 8
IMAGE = (40, 30, 11)


@pytest.fixture(scope="module")
def server(tiny_vlm_factory, tmp_path_factory):
    model_dir = tiny_vlm_factory("paligemma2")
    log = tmp_path_factory.mktemp("paligemma-server") / "server.log"
    # a 32-token step budget: the 27-token image prompt runs whole, never chunked
    with running_server(
        model_dir, "--max-input-tokens", "60", "--max-total-tokens", "80",
        "--max-batch-prefill-tokens", "32", log_path=log,
    ) as server:  # fmt: skip
        yield server, model_dir


@pytest.fixture(scope="module")
def reference(server):
    """(prompt text, prompt ids, transformers' greedy tokens up to <eos>) per case."""
    import transformers

    _, model_dir = server
    prompts = VlmPrompts(model_dir)
    hf = transformers.PaliGemmaForConditionalGeneration.from_pretrained(
        model_dir, attn_implementation="eager"
    ).eval()
    torch.set_num_threads(1)
    eos = prompts.tokenizer.backend.token_to_id("<eos>")
    cases = {}
    for name, text, images in [
        ("image", "{0}caption en", [IMAGE]),
        ("text", "The quick brown fox", []),
    ]:
        ids, placed = prompts.build(text, images)
        tokens, _ = hf_greedy(hf, ids, placed, NEW_TOKENS)
        if eos in tokens:
            tokens = tokens[: tokens.index(eos) + 1]
        uris = [f"![]({data_uri(png_bytes(*i))})" for i in images]
        cases[name] = (text.format(*uris), ids, tokens)
    return cases


def generate(url: str, inputs: str) -> tuple[dict, int]:
    body = {"inputs": inputs, "parameters": {"max_new_tokens": NEW_TOKENS, "details": True}}
    response = httpx.post(f"{url}/generate", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["details"], int(response.headers["x-prompt-tokens"])


@pytest.mark.parametrize("case", ["image", "text"])
def test_generate_equals_transformers(server, reference, case):
    url = server[0].url
    inputs, ids, tokens = reference[case]
    details, prompt_tokens = generate(url, inputs)
    assert [t["id"] for t in details["tokens"]] == tokens
    assert prompt_tokens == len(ids)  # the processor's layout: no second <bos>


def test_concurrent_image_and_text_prompts(server, reference):
    url = server[0].url
    cases = [reference["image"], reference["text"]] * 3
    with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
        results = list(pool.map(lambda c: generate(url, c[0]), cases))
    for (details, _), (_, _, tokens) in zip(results, cases, strict=True):
        assert [t["id"] for t in details["tokens"]] == tokens


def test_image_prompt_over_the_input_limit_is_422(server):
    url = server[0].url
    uri = f"![]({data_uri(png_bytes(*IMAGE))})"
    response = httpx.post(
        f"{url}/generate",
        json={"inputs": uri * 4 + "caption", "parameters": {"max_new_tokens": 2}},
        timeout=60,
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"].startswith(
        "Input validation error: `inputs` must have less than 60 tokens. Given: "
    )
