"""Real client libraries against a uvicorn server (real router, scripted engine): the
`text-generation` client, `huggingface_hub.InferenceClient` and `openai`, streams included."""

from __future__ import annotations

import json

import openai
import pytest
import text_generation
from huggingface_hub import InferenceClient
from server.fakes import CACHE_INFO, FakeEngine
from server.harness import MODEL_ID, SCRIPT, serve, server_config

from pytgi.router.infer import Infer
from pytgi.server.app import create_app

MESSAGES = [{"role": "user", "content": "Hi"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"location": {"type": "string"}}},
    },
}
TOOL_TEXT = '{"function": {"_name": "get_weather", "location": "Paris"}}'


def _app(tokenizer, text: str):
    ids = tokenizer.encode(text, add_special_tokens=False).ids + list(tokenizer.eos_token_ids)
    engine = FakeEngine(ids)
    config = server_config()
    infer = Infer(engine, tokenizer, config.limits, CACHE_INFO)
    return create_app(infer, engine, config, CACHE_INFO, model_info={"model_id": MODEL_ID})


@pytest.fixture(scope="module")
def url(tokenizer):
    with serve(_app(tokenizer, SCRIPT)) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def tool_url(tokenizer):
    with serve(_app(tokenizer, TOOL_TEXT)) as base_url:
        yield base_url


def test_text_generation_client(url):
    client = text_generation.Client(url)
    response = client.generate("Hello", max_new_tokens=20, stop_sequences=["brown"])
    assert response.generated_text == " The quick brown"
    assert response.details.finish_reason == text_generation.types.FinishReason.StopSequence
    assert response.details.generated_tokens == len(response.details.tokens)
    full = client.generate("Hello", max_new_tokens=100)
    assert full.generated_text == SCRIPT
    assert full.details.finish_reason == text_generation.types.FinishReason.EndOfSequenceToken
    events = list(client.generate_stream("Hello", max_new_tokens=3))
    assert [e.token.id for e in events] == [t.id for t in full.details.tokens[:3]]
    assert events[-1].details.generated_tokens == 3


def test_text_generation_client_errors(url):
    client = text_generation.Client(url)
    with pytest.raises(text_generation.errors.ValidationError, match="max_new_tokens"):
        client.generate("Hello", max_new_tokens=10_000)
    with pytest.raises(text_generation.errors.ValidationError, match="max_new_tokens"):
        list(client.generate_stream("Hello", max_new_tokens=10_000))


def test_huggingface_hub_text_generation(url, hub_online):
    client = InferenceClient(base_url=url)
    # TGI's `POST /` returns the prompt too unless asked not to (local model: no pipeline tag)
    assert client.text_generation("Hello", max_new_tokens=100) == "Hello" + SCRIPT
    text = client.text_generation("Hello", max_new_tokens=100, return_full_text=False)
    assert text == SCRIPT
    details = client.text_generation("Hello", max_new_tokens=2, details=True)
    assert details.details.generated_tokens == 2
    chunks = list(client.text_generation("Hello", max_new_tokens=100, stream=True))
    assert "".join(chunks) == SCRIPT + "</s>"  # token texts keep special tokens (TGI)


def test_huggingface_hub_chat(url, hub_online):
    client = InferenceClient(base_url=url)
    output = client.chat_completion(MESSAGES, max_tokens=100, temperature=0)
    assert output.choices[0].message.content == SCRIPT
    assert output.choices[0].finish_reason == "stop"
    assert output.usage.completion_tokens == output.usage.total_tokens - output.usage.prompt_tokens
    stream = client.chat_completion(MESSAGES, max_tokens=100, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream) == SCRIPT


def test_openai_chat_and_usage(url):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    assert [m.id for m in client.models.list()] == [MODEL_ID]
    completion = client.chat.completions.create(model="tgi", messages=MESSAGES, max_tokens=100)
    assert completion.choices[0].message.content == SCRIPT
    stream = client.chat.completions.create(
        model="tgi",
        messages=MESSAGES,
        max_tokens=100,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content for c in chunks if c.choices) == SCRIPT
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == completion.usage.completion_tokens


def test_openai_completions(url, tokenizer):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    completion = client.completions.create(model="tgi", prompt=["a", "b"], max_tokens=100)
    assert [c.text for c in completion.choices] == [SCRIPT, SCRIPT]
    stream = client.completions.create(model="tgi", prompt="a", max_tokens=3, stream=True)
    ids = tokenizer.encode(SCRIPT, add_special_tokens=False).ids[:3]
    assert "".join(c.choices[0].text for c in stream) == tokenizer.decode(ids)


def test_openai_errors(url):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(model="tgi", messages=MESSAGES, top_p=1.5)
    with pytest.raises(openai.APIError, match="top_p"):
        list(client.chat.completions.create(model="tgi", messages=MESSAGES, top_p=1.5, stream=True))


def test_openai_tool_calls(tool_url):
    client = openai.OpenAI(base_url=f"{tool_url}/v1", api_key="unused")
    completion = client.chat.completions.create(
        model="tgi", messages=MESSAGES, tools=[WEATHER_TOOL], tool_choice="required"
    )
    call = completion.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"location": "Paris"}
    stream = client.chat.completions.create(
        model="tgi", messages=MESSAGES, tools=[WEATHER_TOOL], tool_choice="required", stream=True
    )
    deltas = [c.choices[0].delta.tool_calls[0] for c in stream if c.choices]
    assert deltas[0].function.name == "get_weather"
    arguments = "".join(d.function.arguments for d in deltas)
    assert json.loads(arguments) == {"location": "Paris"}
