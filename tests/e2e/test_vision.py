"""A tiny Qwen2-VL served by the real `pytgi serve`, images sent as clients send them: TGI's
markdown in `/generate` inputs, OpenAI `image_url` parts (data URI, and a URL on a loopback
server, fetched because the server runs with --allow-private-image-urls), and
`huggingface_hub.InferenceClient.chat_completion`. Greedy tokens equal transformers' generate on
the same processor outputs; bad images and prompts over the limit are TGI's 422s."""

from __future__ import annotations

import httpx
import pytest
import torch
from fixtures.images import data_uri, image_server, png_bytes, png_route
from huggingface_hub import InferenceClient
from models.vlm_utils import VlmPrompts, hf_greedy
from openai import OpenAI

from e2e.server import running_server

IMAGE = png_bytes(84, 56, seed=11)  # 6 x 4 patches: 6 image tokens
QUESTION = "What is in the picture?"
NEW_TOKENS = 8


def chat_prompt(content: str) -> str:
    """The tiny model's chat template for one user turn, as rendered by the server."""
    return f"<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def vlm_server(tiny_vlm_factory, tmp_path_factory):
    model_dir = tiny_vlm_factory("qwen2_vl")
    log = tmp_path_factory.mktemp("vlm-server") / "server.log"
    with running_server(
        model_dir, "--allow-private-image-urls", "--max-input-tokens", "60",
        "--max-total-tokens", "80", log_path=log,
    ) as server:  # fmt: skip
        yield server, model_dir


@pytest.fixture(scope="module")
def reference(vlm_server):
    """transformers' greedy tokens for the chat prompt with IMAGE, up to EOS."""
    import transformers

    _, model_dir = vlm_server
    prompts = VlmPrompts(model_dir)
    hf = transformers.Qwen2VLForConditionalGeneration.from_pretrained(
        model_dir, attn_implementation="eager"
    ).eval()
    torch.set_num_threads(1)
    ids, images = prompts.build(chat_prompt("{0}" + QUESTION), [(84, 56, 11)])
    tokens, _ = hf_greedy(hf, ids, images, NEW_TOKENS)
    if 9 in tokens:  # <|im_end|>: the server stops there
        tokens = tokens[: tokens.index(9) + 1]
    text = prompts.tokenizer.decode([t for t in tokens if t != 9], skip_special_tokens=True)
    return ids, tokens, text


def test_generate_with_markdown_image(vlm_server, reference):
    server, _ = vlm_server
    ids, tokens, _ = reference
    inputs = chat_prompt(f"![]({data_uri(IMAGE)}){QUESTION}")
    body = {"inputs": inputs, "parameters": {"max_new_tokens": NEW_TOKENS, "details": True}}
    response = httpx.post(f"{server.url}/generate", json=body, timeout=60)
    assert response.status_code == 200, response.text
    details = response.json()["details"]
    assert [t["id"] for t in details["tokens"]] == tokens
    assert details["prefill"] == [] or len(details["prefill"]) == len(ids)


def test_generate_stream_with_two_images(vlm_server, reference):
    """Streaming with images: the events' tokens are the non-streamed response's."""
    import json

    server, _ = vlm_server
    other = data_uri(png_bytes(56, 56, seed=12))
    inputs = chat_prompt(f"![]({data_uri(IMAGE)}) and ![]({other}) {QUESTION}")
    body = {"inputs": inputs, "parameters": {"max_new_tokens": NEW_TOKENS, "details": True}}
    whole = httpx.post(f"{server.url}/generate", json=body, timeout=60).json()
    expected = [t["id"] for t in whole["details"]["tokens"]]
    streamed = []
    with httpx.stream("POST", f"{server.url}/generate_stream", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data:"):
                streamed.append(json.loads(line[5:])["token"]["id"])
    assert streamed == expected


def test_openai_image_url_data_uri_and_loopback_url(vlm_server, reference):
    server, _ = vlm_server
    _, _, text = reference
    client = OpenAI(base_url=f"{server.url}/v1", api_key="-")
    with image_server({"/pic.png": png_route(IMAGE)}) as base:
        for url in (data_uri(IMAGE), f"{base}/pic.png"):
            content = [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": QUESTION},
            ]
            out = client.chat.completions.create(
                model="tgi", messages=[{"role": "user", "content": content}],
                max_tokens=NEW_TOKENS, temperature=0,  # TGI's chat samples unless 0
            )  # fmt: skip
            assert out.choices[0].message.content == text
            assert out.usage.prompt_tokens == len(reference[0])


def test_huggingface_hub_chat_completion_with_image(vlm_server, reference, hub_online):
    server, _ = vlm_server
    client = InferenceClient(base_url=server.url)
    content = [
        {"type": "image_url", "image_url": {"url": data_uri(IMAGE)}},
        {"type": "text", "text": QUESTION},
    ]
    out = client.chat_completion(
        messages=[{"role": "user", "content": content}], max_tokens=NEW_TOKENS, temperature=0
    )
    assert out.choices[0].message.content == reference[2]


@pytest.mark.parametrize(
    "inputs, message",
    [
        ("![](data:image/png;base64,###) hi", "Input validation error: base64 encoding is invalid"),
        ("![](data:image/png;base64,aGVsbG8=) hi", "Input validation error: invalid image: "),
        ("![](http://127.0.0.1:9/none.png) hi", "Input validation error: Could not fetch image"),
        (
            f"![]({data_uri(png_bytes(112, 112))})" * 4,
            "Input validation error: `inputs` must have less than 60 tokens. Given: ",
        ),
    ],
    ids=["base64", "not-an-image", "unreachable", "too-many-tokens"],
)
def test_bad_images_are_422(vlm_server, inputs, message):
    server, _ = vlm_server
    body = {"inputs": inputs, "parameters": {"max_new_tokens": 2}}
    response = httpx.post(f"{server.url}/generate", json=body, timeout=60)
    assert response.status_code == 422, response.text
    assert response.json()["error_type"] == "validation"
    assert response.json()["error"].startswith(message)
    # the server still serves
    ok = httpx.post(f"{server.url}/generate", json={"inputs": "Hello", "parameters": {
        "max_new_tokens": 2}}, timeout=60)  # fmt: skip
    assert ok.status_code == 200
