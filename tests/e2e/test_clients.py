"""The real server (subprocess, the demo model) driven by the clients people use: TGI's
`text-generation`, `huggingface_hub.InferenceClient` and `openai`. Greedy output is checked
against transformers.
"""

from __future__ import annotations

import json

import huggingface_hub
import pytest
import torch
import transformers
from huggingface_hub import InferenceClient
from openai import OpenAI
from text_generation import Client
from text_generation.errors import ValidationError

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def reference(demo_model_dir):
    """transformers' greedy continuation of PROMPT (fp32, eager) — the correctness reference."""
    model_dir = demo_model_dir
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, attn_implementation="eager"
    )
    ids = tok(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None)
    return out[0, ids.shape[1] :].tolist(), tok


def test_tgi_client_generate_matches_transformers(pytgi_server_url, reference):
    ref_ids, tok = reference
    client = Client(pytgi_server_url, timeout=60)
    resp = client.generate(PROMPT, max_new_tokens=12, decoder_input_details=True)
    ids = [t.id for t in resp.details.tokens]
    n = next((i + 1 for i, t in enumerate(ids) if t == tok.eos_token_id), len(ids))
    assert ids == ref_ids[:n]
    assert resp.details.seed is None
    assert resp.details.generated_tokens == len(ids)
    assert resp.generated_text == tok.decode(ids, skip_special_tokens=True)
    prompt_ids = tok(PROMPT).input_ids
    assert [t.id for t in resp.details.prefill] == prompt_ids
    assert resp.details.prefill[0].logprob is None


def test_tgi_client_one_token(pytgi_server_url):
    resp = Client(pytgi_server_url).generate(PROMPT, max_new_tokens=1)
    assert resp.details.generated_tokens == 1
    assert resp.details.finish_reason.value == "length"


def test_tgi_client_stream_concatenates_to_final_text(pytgi_server_url):
    client = Client(pytgi_server_url, timeout=60)
    events = list(client.generate_stream(PROMPT, max_new_tokens=10, top_n_tokens=2))
    final = events[-1]
    assert final.generated_text is not None and final.details is not None
    assert "".join(e.token.text for e in events if not e.token.special) == final.generated_text
    assert all(len(e.top_tokens) >= 2 for e in events)


def test_tgi_client_best_of_samples(pytgi_server_url):
    client = Client(pytgi_server_url, timeout=60)
    resp = client.generate(PROMPT, max_new_tokens=5, best_of=2, do_sample=True)
    assert resp.details.seed is not None
    assert len(resp.details.best_of_sequences) == 1


def test_tgi_client_seeded_sampling_is_reproducible(pytgi_server_url):
    client = Client(pytgi_server_url, timeout=60)
    kwargs = dict(max_new_tokens=8, do_sample=True, temperature=0.9, seed=7)
    a = client.generate(PROMPT, **kwargs)
    b = client.generate(PROMPT, **kwargs)
    assert a.generated_text == b.generated_text and a.details.seed == 7


def test_tgi_client_validation_error(pytgi_server_url):
    with pytest.raises(ValidationError):
        Client(pytgi_server_url).generate(PROMPT, max_new_tokens=10, top_n_tokens=100)


def test_openai_chat_and_stream_usage(pytgi_server_url):
    client = OpenAI(base_url=f"{pytgi_server_url}/v1", api_key="-")
    messages = [{"role": "user", "content": "Hello world"}]
    resp = client.chat.completions.create(
        model="tgi", messages=messages, max_tokens=8, temperature=0
    )
    usage = resp.usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert 1 <= usage.completion_tokens <= 8
    text = resp.choices[0].message.content
    chunks = list(
        client.chat.completions.create(
            model="tgi",
            messages=messages,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    assert chunks[-1].usage.completion_tokens == usage.completion_tokens


def test_openai_completions_several_prompts(pytgi_server_url):
    client = OpenAI(base_url=f"{pytgi_server_url}/v1", api_key="-")
    resp = client.completions.create(
        model="tgi", prompt=["Hello", "The server"], max_tokens=5, temperature=0
    )
    assert sorted(c.index for c in resp.choices) == [0, 1]
    stream = client.completions.create(
        model="tgi", prompt=["Hello", "The server"], max_tokens=5, temperature=0, stream=True
    )
    texts = {0: "", 1: ""}
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == {c.index: c.text for c in resp.choices}


def test_huggingface_hub_client(pytgi_server_url, monkeypatch):
    # the suite runs with HF_HUB_OFFLINE=1 (nothing may reach a hub); this client talks to loopback
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    huggingface_hub.utils.reset_sessions()  # a cached session keeps its offline adapter
    client = InferenceClient(base_url=pytgi_server_url)
    text = client.text_generation(PROMPT, max_new_tokens=6, return_full_text=False)
    streamed = "".join(client.text_generation(PROMPT, max_new_tokens=6, stream=True))
    assert streamed == text
    # TGI: `POST /` returns the full text by default for models without a hub pipeline tag
    assert client.text_generation(PROMPT, max_new_tokens=6) == PROMPT + text
    chat = client.chat_completion([{"role": "user", "content": "hi"}], max_tokens=6, temperature=0)
    assert chat.choices[0].message.role == "assistant"
    parts = client.chat_completion(
        [{"role": "user", "content": "hi"}], max_tokens=6, temperature=0, stream=True
    )
    assert (
        "".join(p.choices[0].delta.content or "" for p in parts) == chat.choices[0].message.content
    )


def test_tgi_client_streams_chat(pytgi_server_url):
    """text_generation 0.7.0's chat stream requires `tool_calls` in every delta (null in text)."""
    from text_generation.types import Message

    client = Client(pytgi_server_url, timeout=60)
    messages = [Message(role="user", content="Say hi")]
    chunks = []
    # the client ends on the stream's closing `data: [DONE]` (not JSON), as against TGI
    with pytest.raises(json.JSONDecodeError, match="line 1 column 3"):
        chunks.extend(client.chat(messages, stream=True, max_tokens=6, temperature=0.0))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    whole = client.chat(messages, max_tokens=6, temperature=0.0)
    assert text == whole.choices[0].message.content
    assert all(c.choices[0].delta.tool_calls is None for c in chunks if c.choices)


def test_tool_call_cut_off_by_max_tokens_is_openai_partial(pytgi_server_url):
    """OpenAI's answer (TGI's is a 422): the call so far, finish_reason "length"."""
    from fixtures.tools import WEATHER

    client = OpenAI(base_url=f"{pytgi_server_url}/v1", api_key="-")
    resp = client.chat.completions.create(
        model="tgi",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=30,
        temperature=0,
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "length"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert call.function.arguments.startswith("{")
    with pytest.raises(ValueError):
        json.loads(call.function.arguments)  # cut off: not yet a whole JSON object
