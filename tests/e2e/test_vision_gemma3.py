"""A tiny Gemma 3 (multimodal) served by the real `pytgi serve` with an 8-token step budget (text
chunked around images, each image whole): an OpenAI chat with an `image_url` data URI and
`/generate` with a markdown image equal transformers' greedy generate on the real Gemma3Processor's
outputs (its chat template, ids, pixels and token_type_ids); image tokens count against
--max-input-tokens."""

from __future__ import annotations

import io

import httpx
import pytest
import torch
from fixtures.images import data_uri, png_bytes
from models.vlm_utils import hf_greedy
from openai import OpenAI

from e2e.server import running_server

IMAGE = (40, 30, 11)
QUESTION = "What is in the picture?"
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def server(tiny_vlm_factory, tmp_path_factory):
    model_dir = tiny_vlm_factory("gemma3")
    log = tmp_path_factory.mktemp("gemma3-server") / "server.log"
    with running_server(
        model_dir, "--max-input-tokens", "60", "--max-total-tokens", "80",
        "--max-batch-prefill-tokens", "8", log_path=log,
    ) as server:  # fmt: skip
        yield server, model_dir


@pytest.fixture(scope="module")
def reference(server):
    """transformers on Gemma3Processor's outputs -> {case: (prompt ids, greedy tokens to <eos>)}."""
    import transformers
    from PIL import Image

    _, model_dir = server
    torch.set_num_threads(1)
    hf = transformers.Gemma3ForConditionalGeneration.from_pretrained(
        model_dir, attn_implementation="eager"
    ).eval()
    processor = transformers.AutoProcessor.from_pretrained(model_dir, use_fast=False)
    image = Image.open(io.BytesIO(png_bytes(*IMAGE)))
    content = [{"type": "image"}, {"type": "text", "text": QUESTION}]
    chat = processor.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True
    )
    images = [[image]]
    texts = {  # the chat template holds <bos>; /generate's tokenizer adds it
        "chat": processor(text=chat, images=images, add_special_tokens=False, return_tensors="pt"),
        "generate": processor(text="<start_of_image>caption en", images=images,
                              return_tensors="pt"),
        "text": processor(text="The quick brown fox", return_tensors="pt"),
    }  # fmt: skip
    eos = processor.tokenizer.convert_tokens_to_ids("<eos>")
    cases = {}
    for name, out in texts.items():
        ids = out["input_ids"][0].tolist()
        kept = {k: out[k] for k in ("pixel_values", "token_type_ids") if k in out}
        tokens, _ = hf_greedy(hf, ids, (), NEW_TOKENS, inputs=kept)
        cases[name] = ids, tokens[: tokens.index(eos) + 1] if eos in tokens else tokens
    cases["decode"] = processor.tokenizer.decode
    return cases


def test_openai_chat_with_an_image_url(server, reference):
    ids, tokens = reference["chat"]
    client = OpenAI(base_url=f"{server[0].url}/v1", api_key="-")
    content = [
        {"type": "image_url", "image_url": {"url": data_uri(png_bytes(*IMAGE))}},
        {"type": "text", "text": QUESTION},
    ]
    out = client.chat.completions.create(
        model="tgi", messages=[{"role": "user", "content": content}],
        max_tokens=NEW_TOKENS, temperature=0,
    )  # fmt: skip
    assert out.choices[0].message.content == reference["decode"](tokens, skip_special_tokens=True)
    assert out.usage.prompt_tokens == len(ids)


@pytest.mark.parametrize("case", ["generate", "text"])
def test_generate_with_a_markdown_image(server, reference, case):
    ids, tokens = reference[case]
    inputs = {"generate": f"![]({data_uri(png_bytes(*IMAGE))})caption en",
              "text": "The quick brown fox"}[case]  # fmt: skip
    body = {"inputs": inputs, "parameters": {"max_new_tokens": NEW_TOKENS, "details": True}}
    response = httpx.post(f"{server[0].url}/generate", json=body, timeout=120)
    assert response.status_code == 200, response.text
    assert [t["id"] for t in response.json()["details"]["tokens"]] == tokens
    assert int(response.headers["x-prompt-tokens"]) == len(ids)


def test_image_tokens_count_against_the_input_limit(server):
    uri = f"![]({data_uri(png_bytes(*IMAGE))})"
    body = {"inputs": uri * 6 + "caption", "parameters": {"max_new_tokens": 2}}
    response = httpx.post(f"{server[0].url}/generate", json=body, timeout=60)
    assert response.status_code == 422, response.text
    assert response.json()["error"].startswith(
        "Input validation error: `inputs` must have less than 60 tokens. Given: "
    )
