"""Issue 12's surface, route by route, through the real server (`pytgi serve`, the demo model):
`grammar` on `/` (TGI's compat route, plain and streaming) and TGI's `json_schema` grammar type;
`response_format` as `json_object`, `json_schema` (strict) and TGI's form on chat AND
completions, streaming and not; tools with `tool_choice` none / auto / a bare function name,
`tool_prompt` reaching the prompt, `auto` streamed (a valid call or plain text, never a broken
one), a template that shows the tools itself with a tool result round trip. test_grammar.py holds
the clients' basics, mixed batches and the bad-grammar list.

The demo model has random weights: a grammar with an unbounded language (`json_object`) may run
out of tokens. Such an output must then be a prefix of a JSON object (finish_reason `length`);
every output that ends does so because the grammar completed (`stop`) and parses.
"""

from __future__ import annotations

import json
import re
import shutil
import time

import httpx
import jsonschema
import pytest
from grammar.grammar_test_cases import deep_schema
from huggingface_hub import InferenceClient

from e2e.server import ServerProcess
from e2e.test_grammar import (
    BOUNDED_S,
    CLOCK,
    DATE,
    MESSAGES,
    PERSON,
    WEATHER,
    openai_client,
    valid_call,
)

JSON_OBJECT = {"type": "json_object"}
PERSON_STRICT = {
    "type": "json_schema",
    "json_schema": {"name": "p", "strict": True, "schema": PERSON},
}
PERSON_TGI = {"type": "json", "value": PERSON}
CUSTOM_TOOL_PROMPT = "\nPick exactly one function from the list above and call it.\n"


def sse_events(text: str) -> list:
    """The JSON payloads of an SSE body (`data: [DONE]` left out)."""
    lines = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def check_json_object(text: str, finish_reason: str) -> None:
    """A complete JSON object when the grammar ended the output, else a prefix of one."""
    if finish_reason == "stop":
        assert isinstance(json.loads(text), dict), text
    else:
        assert finish_reason == "length" and text.lstrip().startswith("{"), (finish_reason, text)


def test_grammar_on_the_compat_route_plain_and_streaming(pytgi_server_url):
    person = {"type": "json", "value": PERSON}
    date = {"type": "regex", "value": DATE}
    with httpx.Client(base_url=pytgi_server_url, timeout=120) as http:
        plain = http.post("/", json={"inputs": "Someone", "parameters": {
            "grammar": person, "max_new_tokens": 120, "details": True}})  # fmt: skip
        assert plain.status_code == 200, plain.text
        (out,) = plain.json()
        text = out["generated_text"].removeprefix("Someone")  # TGI: full text on `/` by default
        jsonschema.validate(json.loads(text), PERSON)
        assert out["details"]["finish_reason"] == "eos_token"
        body = {"inputs": "Today is", "stream": True,
                "parameters": {"grammar": date, "max_new_tokens": 20}}  # fmt: skip
        stream = http.post("/", json=body)
        events = sse_events(stream.text)
        text = "".join(e["token"]["text"] for e in events)
        assert stream.status_code == 200 and re.fullmatch(DATE, text, flags=re.ASCII), text
        assert events[-1]["generated_text"] == "Today is" + text


def test_tgi_json_schema_grammar_type(pytgi_server_url):
    grammar = {"type": "json_schema", "value": {"name": "person", "schema": PERSON}}
    for route in ("/generate", "/generate_stream"):
        body = {"inputs": "Someone", "parameters": {"grammar": grammar, "max_new_tokens": 120}}
        response = httpx.post(f"{pytgi_server_url}{route}", json=body, timeout=120)
        assert response.status_code == 200, response.text
        if route == "/generate":
            text = response.json()["generated_text"]
        else:
            text = sse_events(response.text)[-1]["generated_text"]
        jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_json_object_mode(pytgi_server_url, stream):
    client = openai_client(pytgi_server_url)
    for seed in range(3):
        kwargs = dict(model="tgi", messages=MESSAGES, response_format=JSON_OBJECT,
                      max_tokens=80, seed=seed)  # fmt: skip
        if stream:
            chunks = list(client.chat.completions.create(stream=True, **kwargs))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            reason = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        else:
            choice = client.chat.completions.create(**kwargs).choices[0]
            text, reason = choice.message.content, choice.finish_reason
        check_json_object(text, reason)


@pytest.mark.parametrize("stream", [False, True])
def test_completions_response_format_every_form(pytgi_server_url, stream):
    client = openai_client(pytgi_server_url)
    for fmt in (PERSON_STRICT, PERSON_TGI, JSON_OBJECT):
        kwargs = dict(model="tgi", prompt="Someone", max_tokens=120, seed=4,
                      extra_body={"response_format": fmt})  # fmt: skip
        if stream:
            chunks = list(client.completions.create(stream=True, **kwargs))
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            reason = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        else:
            choice = client.completions.create(**kwargs).choices[0]
            text, reason = choice.text, choice.finish_reason
        if fmt is JSON_OBJECT:
            check_json_object(text, reason)
        else:
            assert reason == "stop"
            jsonschema.validate(json.loads(text), PERSON)


def test_tool_choice_none_answers_in_text(pytgi_server_url):
    client = openai_client(pytgi_server_url)
    message = client.chat.completions.create(
        model="tgi", messages=MESSAGES, tools=[WEATHER, CLOCK], tool_choice="none",
        max_tokens=12, temperature=0,
    ).choices[0].message  # fmt: skip
    assert message.tool_calls is None and message.content
    plain = (
        client.chat.completions.create(model="tgi", messages=MESSAGES, max_tokens=12, temperature=0)
        .choices[0]
        .message
    )
    assert message.content == plain.content  # tools ignored entirely, as TGI


def test_tool_choice_as_a_bare_function_name(pytgi_server_url):
    body = {"model": "tgi", "messages": MESSAGES, "tools": [WEATHER, CLOCK],
            "tool_choice": "get_weather", "max_tokens": 120}  # fmt: skip
    response = httpx.post(f"{pytgi_server_url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    (call,) = response.json()["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    valid_call("get_weather", call["function"]["arguments"])
    unknown = httpx.post(f"{pytgi_server_url}/v1/chat/completions",
                         json={**body, "tool_choice": "nope"}, timeout=60)  # fmt: skip
    assert unknown.status_code == 422
    assert unknown.json()["error"] == "Tool error: Tool with name nope not found"


def test_tool_prompt_reaches_the_prompt_and_the_call_stays_valid(pytgi_server_url):
    body = {"model": "tgi", "messages": MESSAGES, "tools": [WEATHER], "tool_choice": "required",
            "tool_prompt": CUSTOM_TOOL_PROMPT, "max_tokens": 120}  # fmt: skip
    with httpx.Client(base_url=pytgi_server_url, timeout=120) as http:
        templated = http.post("/chat_tokenize", json=body).json()["templated_text"]
        assert CUSTOM_TOOL_PROMPT in templated and '"get_weather"' in templated
        default = http.post("/chat_tokenize", json={**body, "tool_prompt": None}).json()
        assert "Given the functions available" in default["templated_text"]
        message = http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        (call,) = message["tool_calls"]
        valid_call(call["function"]["name"], call["function"]["arguments"])


def test_streamed_auto_gives_a_valid_call_or_plain_text(pytgi_server_url):
    client = openai_client(pytgi_server_url)
    for seed in range(4):
        name, arguments, content = None, "", ""
        chunks = client.chat.completions.create(
            model="tgi", messages=MESSAGES, tools=[WEATHER, CLOCK], tool_choice="auto",
            max_tokens=60, seed=seed, stream=True,
        )  # fmt: skip
        for chunk in chunks:
            delta = chunk.choices[0].delta
            content += delta.content or ""
            for call in delta.tool_calls or []:
                name = call.function.name or name
                arguments += call.function.arguments or ""
        if name is not None:
            assert not content and name in ("get_weather", "get_time")
            valid_call(name, arguments)
        else:
            assert content and "no_tool" not in content  # re-run without tools, as TGI


def test_json_schema_strict_refuses_what_it_cannot_enforce_and_lenient_accepts(pytgi_server_url):
    unique = {"type": "object", "properties": {"tags": {"type": "array", "maxItems": 3,
              "uniqueItems": True, "items": {"enum": ["a", "b", "c"]}}},
              "required": ["tags"], "additionalProperties": False}  # fmt: skip
    enforced = {k: v for k, v in unique.items()}
    enforced["properties"] = {"tags": {k: v for k, v in unique["properties"]["tags"].items()
                                       if k != "uniqueItems"}}  # fmt: skip
    body = {"model": "tgi", "messages": MESSAGES, "max_tokens": 60, "seed": 5}
    url = f"{pytgi_server_url}/v1/chat/completions"
    for strict in (True, False):
        fmt = {"type": "json_schema",
               "json_schema": {"name": "t", "strict": strict, "schema": unique}}  # fmt: skip
        response = httpx.post(url, json={**body, "response_format": fmt}, timeout=120)
        if strict:
            assert response.status_code == 422
            assert "Unimplemented keys" in response.json()["error"]
        else:
            assert response.status_code == 200, response.text
            text = response.json()["choices"][0]["message"]["content"]
            jsonschema.validate(json.loads(text), enforced)  # uniqueItems ignored, the rest held


def test_inference_client_chat_response_format(pytgi_server_url, hub_online):
    client = InferenceClient(pytgi_server_url, timeout=120)
    out = client.chat_completion(MESSAGES, response_format=PERSON_TGI, max_tokens=120, seed=6)
    jsonschema.validate(json.loads(out.choices[0].message.content), PERSON)
    text = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in client.chat_completion(
            MESSAGES, response_format=PERSON_TGI, max_tokens=120, seed=6, stream=True
        )
    )
    assert json.loads(text) == json.loads(out.choices[0].message.content)


# a chat template that shows the tools itself and renders tool calls and tool results (as Llama
# 3.1's or Qwen 2.5's do); the demo model's own template refuses the `tool` role
TOOL_TEMPLATE = (
    "{{ bos_token }}{% if tools %}<|system|>\nFunctions:\n{% for tool in tools %}"
    "{{ tool | tojson }}\n{% endfor %}{{ eos_token }}\n{% endif %}"
    "{% for message in messages %}{% if message['role'] == 'tool' %}<|tool|>\n"
    "{{ message['content'] }}{{ eos_token }}\n{% elif message.get('tool_calls') %}<|assistant|>\n"
    "{% for call in message['tool_calls'] %}{{ call['function'] | tojson }}{% endfor %}"
    "{{ eos_token }}\n{% else %}<|{{ message['role'] }}|>\n{{ message['content'] }}"
    "{{ eos_token }}\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>\n"
    "{% endif %}"
)


@pytest.fixture(scope="module")
def tool_template_server(demo_model_dir, tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("tool-template") / "model"
    shutil.copytree(demo_model_dir, model_dir)
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = TOOL_TEMPLATE
    config_path.write_text(json.dumps(config))
    server = ServerProcess(model_dir, log_path=model_dir.parent / "server.log")
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


def test_a_template_that_shows_tools_and_the_tool_result_round_trip(tool_template_server):
    """The agent loop on a tool-aware template: tools go to the template (the prompt gets only
    TGI's `---` + tool prompt suffix), the model's call, the tool's result (`role: tool`), and
    the model again: a valid call or text."""
    url = tool_template_server.url
    client = openai_client(url)
    body = {"model": "tgi", "messages": MESSAGES, "tools": [WEATHER], "tool_choice": "required"}
    templated = httpx.post(f"{url}/chat_tokenize", json=body, timeout=60).json()["templated_text"]
    assert templated.count('"get_weather"') == 1  # listed once, by the template
    assert "\n---\n\nGiven the functions available" in templated
    first = client.chat.completions.create(
        model="tgi", messages=MESSAGES, tools=[WEATHER], tool_choice="required", max_tokens=120,
        seed=8,
    ).choices[0].message  # fmt: skip
    (call,) = first.tool_calls
    valid_call(call.function.name, call.function.arguments)
    history = [
        *MESSAGES,
        {"role": "assistant", "tool_calls": [call.model_dump(exclude_none=True)]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'},
    ]
    for seed in range(2):
        message = (
            client.chat.completions.create(
                model="tgi", messages=history, tools=[WEATHER], max_tokens=60, seed=seed
            )
            .choices[0]
            .message
        )
        if message.tool_calls:
            valid_call(
                message.tool_calls[0].function.name, message.tool_calls[0].function.arguments
            )
        else:
            assert message.content


def test_response_format_text_is_no_grammar(pytgi_server_url):
    client = openai_client(pytgi_server_url)
    kwargs = dict(model="tgi", messages=MESSAGES, max_tokens=8, temperature=0)
    plain = client.chat.completions.create(response_format={"type": "text"}, **kwargs).choices[0]
    free = client.chat.completions.create(**kwargs).choices[0]
    assert plain.finish_reason == "length" and plain.message.content == free.message.content


def _tool(parameters) -> dict:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


BAD_TOOLS = [
    ("invalid_type", [_tool({"type": "object", "properties": {"a": {"type": "stsring"}}})]),
    (
        "unsupported_keyword",
        [_tool({"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}})],
    ),  # fmt: skip
    ("parameters_not_a_schema", [_tool(["a"])]),
    ("no_name", [{"type": "function", "function": {"parameters": {}}}]),
    ("deep_nesting", [_tool(deep_schema(200))]),
    (
        "conflicting_defs",
        [
            {
                "type": "function",
                "function": {
                    "name": n,
                    "parameters": {
                        "type": "object",
                        "$defs": {"x": {"type": kind}},
                        "properties": {"v": {"$ref": "#/$defs/x"}},
                    },
                },
            }
            for n, kind in (("f", "string"), ("g", "integer"))
        ],
    ),  # fmt: skip
]


@pytest.mark.parametrize("tools", [t for _, t in BAD_TOOLS], ids=[n for n, _ in BAD_TOOLS])
def test_bad_tools_are_a_clear_4xx_in_bounded_time(pytgi_server_url, tools):
    body = {"model": "tgi", "messages": MESSAGES, "tools": tools, "tool_choice": "required"}
    with httpx.Client(base_url=pytgi_server_url, timeout=60) as http:
        for stream in (False, True):
            start = time.monotonic()
            response = http.post("/v1/chat/completions", json={**body, "stream": stream})
            assert time.monotonic() - start < BOUNDED_S
            if stream and response.status_code == 200:  # TGI: a validation error as the event
                (event,) = sse_events(response.text)
                assert event["error"]["http_status_code"] == 422
                continue
            assert response.status_code == 422, response.text
            assert response.json()["error_type"] in ("tool_error", "validation")
        assert http.post("/generate", json={"inputs": "Hi"}).status_code == 200
