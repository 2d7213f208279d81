"""Constrained decoding through the real server (`pytgi serve`, the demo model, the session's shared
server) with the clients people use: TGI's `text-generation`, `huggingface_hub.InferenceClient`
and `openai`. Every constrained output validates against its schema (jsonschema) or fully matches
its regex; constrained and free requests share batches; a server tight on KV blocks and
speculating gives the same constrained outputs (preemption, drafts, seeded sampling); every bad
grammar of issue 12 is a clear 4xx in bounded time and the server keeps serving.

Streams keep TGI's contract: HTTP 200 with the error as the first and only event (a `validation`
event; `http_status_code: 422` on the OpenAI routes), never a token before it.
"""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import jsonschema
import openai
import pytest
import text_generation
from fixtures.tools import CLOCK, WEATHER
from grammar.grammar_test_cases import INVALID, deep_schema
from huggingface_hub import InferenceClient

from e2e.server import ServerProcess

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["red", "blue"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
PHONE = r"\(\d{3}\) \d{3}-\d{4}"
DATE = r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
PROMPTS = ["And God said unto Moses, ", "In the beginning God created", "The LORD is my shepherd"]
BOUNDED_S = 10.0  # a bad grammar's answer comes within this (compile limits are milliseconds)


def openai_client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="-", timeout=120)


def valid_call(name: str, arguments, tools=(WEATHER, CLOCK)) -> None:
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    (tool,) = [t for t in tools if t["function"]["name"] == name]
    jsonschema.validate(args, tool["function"]["parameters"] or {"type": "object"})


def test_text_generation_client_json_and_regex(pytgi_server_url):
    client = text_generation.Client(pytgi_server_url, timeout=120)
    types = text_generation.types
    person = types.Grammar(type=types.GrammarType.Json, value=PERSON)
    response = client.generate("Someone", max_new_tokens=120, grammar=person, seed=1)
    jsonschema.validate(json.loads(response.generated_text), PERSON)
    assert response.details.finish_reason.value == "eos_token"
    phone = types.Grammar(type=types.GrammarType.Regex, value=PHONE)
    events = list(client.generate_stream("Call me at", max_new_tokens=40, grammar=phone))
    assert re.fullmatch(PHONE, events[-1].generated_text, flags=re.ASCII)
    assert "".join(e.token.text for e in events) == events[-1].generated_text


def test_inference_client_grammar_and_tools(pytgi_server_url, hub_online):
    client = InferenceClient(pytgi_server_url, timeout=120)
    text = client.text_generation(
        "Someone", max_new_tokens=120, grammar={"type": "json", "value": PERSON},
        return_full_text=False, do_sample=True, seed=7,
    )  # fmt: skip
    jsonschema.validate(json.loads(text), PERSON)
    out = client.chat_completion(MESSAGES, tools=[WEATHER, CLOCK], tool_choice="required",
                                 max_tokens=120, seed=2)  # fmt: skip
    call = out.choices[0].message.tool_calls[0].function
    valid_call(call.name, call.arguments)
    name, arguments = None, ""
    for chunk in client.chat_completion(
        MESSAGES, tools=[WEATHER], tool_choice="required", max_tokens=120, stream=True
    ):
        for delta in chunk.choices[0].delta.tool_calls or []:
            name = delta.function.name or name
            arguments += delta.function.arguments or ""
    assert name == "get_weather"
    valid_call(name, arguments)


@pytest.mark.parametrize("stream", [False, True])
def test_openai_response_format(pytgi_server_url, stream):
    client = openai_client(pytgi_server_url)
    formats = [
        {"type": "json_schema", "json_schema": {"name": "p", "strict": True, "schema": PERSON}},
        {"type": "json", "value": PERSON},  # TGI's own form
    ]
    for fmt in formats:
        kwargs = dict(model="tgi", messages=MESSAGES, response_format=fmt, max_tokens=120, seed=3)
        if stream:
            chunks = client.chat.completions.create(stream=True, **kwargs)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            text = client.chat.completions.create(**kwargs).choices[0].message.content
        jsonschema.validate(json.loads(text), PERSON)
    regex = {"type": "regex", "value": DATE}
    out = client.completions.create(model="tgi", prompt="Today is", max_tokens=20,
                                    extra_body={"response_format": regex})  # fmt: skip
    assert re.fullmatch(DATE, out.choices[0].text, flags=re.ASCII)


@pytest.mark.parametrize("stream", [False, True])
def test_openai_tool_calls_are_valid_calls(pytgi_server_url, stream):
    client = openai_client(pytgi_server_url)
    named = {"type": "function", "function": {"name": "get_weather"}}
    for seed, choice in enumerate(["required", named]):
        kwargs = dict(model="tgi", messages=MESSAGES, tools=[WEATHER, CLOCK], max_tokens=120,
                      tool_choice=choice, seed=seed, temperature=0.9)  # fmt: skip
        if stream:
            name, arguments = None, ""
            for chunk in client.chat.completions.create(stream=True, **kwargs):
                for delta in chunk.choices[0].delta.tool_calls or []:
                    name = delta.function.name or name
                    arguments += delta.function.arguments or ""
        else:
            message = client.chat.completions.create(**kwargs).choices[0].message
            name, arguments = (
                message.tool_calls[0].function.name,
                message.tool_calls[0].function.arguments,
            )
        assert choice == "required" or name == "get_weather"
        valid_call(name, arguments)


def test_openai_tool_choice_auto_gives_a_valid_call_or_text(pytgi_server_url):
    client = openai_client(pytgi_server_url)
    for seed in range(3):
        response = client.chat.completions.create(
            model="tgi", messages=MESSAGES, tools=[WEATHER, CLOCK], max_tokens=60, seed=seed
        )
        message = response.choices[0].message
        if message.tool_calls:
            valid_call(
                message.tool_calls[0].function.name, message.tool_calls[0].function.arguments
            )
        else:
            assert message.content  # the model chose no_tool: answered in text (TGI re-runs)


def mixed_bodies() -> list[dict]:
    """Constrained (greedy and seeded sampling) and free requests, for one concurrent batch."""
    bodies = []
    for i, prompt in enumerate(PROMPTS):
        seeded = {"do_sample": True, "temperature": 0.8, "seed": 10 + i}
        for grammar in ({"type": "json", "value": PERSON}, {"type": "regex", "value": DATE}, None):
            for sampling in ({}, seeded) if grammar else ({},):
                params = {"max_new_tokens": 60, "details": True, **sampling}
                if grammar is not None:
                    params["grammar"] = grammar
                bodies.append({"inputs": prompt, "parameters": params})
    return bodies  # 15: within the shared server's --max-concurrent-requests


async def post_all(url: str, bodies: list[dict]) -> list[dict]:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        responses = await asyncio.gather(*(client.post("/generate", json=b) for b in bodies))
    assert [r.status_code for r in responses] == [200] * len(bodies), responses[0].text
    return [r.json() for r in responses]


def check_constrained(bodies: list[dict], results: list[dict]) -> None:
    for body, result in zip(bodies, results, strict=True):
        grammar, text = body["parameters"].get("grammar"), result["generated_text"]
        if grammar is None:
            assert result["details"]["finish_reason"] == "length"
        elif grammar["type"] == "json":
            jsonschema.validate(json.loads(text), PERSON)
        else:
            assert re.fullmatch(DATE, text, flags=re.ASCII), text


def test_mixed_batch_of_constrained_and_free_requests(pytgi_server_url):
    bodies = mixed_bodies()
    together = asyncio.run(post_all(pytgi_server_url, bodies))
    check_constrained(bodies, together)
    alone = [asyncio.run(post_all(pytgi_server_url, [b]))[0] for b in bodies[:6]]
    assert [r["generated_text"] for r in alone] == [r["generated_text"] for r in together[:6]]


@pytest.fixture(scope="module")
def tight_server(demo_model_dir, tmp_path_factory):
    """KV for ~2 of the mixed batch's requests at a time (preemption), and n-gram speculation."""
    log = tmp_path_factory.mktemp("grammar-tight") / "server.log"
    server = ServerProcess(
        demo_model_dir, "--num-blocks", "12", "--speculate", "3",
        "--speculation-policy", "always", log_path=log,
    )  # fmt: skip
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


def test_preemption_and_speculation_keep_constrained_outputs(tight_server, pytgi_server_url):
    bodies = mixed_bodies()
    tight = asyncio.run(post_all(tight_server.url, bodies))
    reference = asyncio.run(post_all(pytgi_server_url, bodies))
    check_constrained(bodies, tight)
    assert [r["generated_text"] for r in tight] == [r["generated_text"] for r in reference]
    metrics = httpx.get(f"{tight_server.url}/metrics").text
    assert metric(metrics, "pytgi_preemptions") > 0
    assert metric(metrics, "tgi_request_skipped_tokens_sum") > 0


def metric(exposition: str, name: str) -> float:
    lines = [line for line in exposition.splitlines() if line.startswith(name + " ")]
    return float(lines[0].split()[-1]) if lines else 0.0


BAD_GRAMMARS = [
    *[(name, {"type": kind, "value": value}) for name, kind, value, _ in INVALID],
    ("unsatisfiable_regex", {"type": "regex", "value": r"[^\s\S]"}),  # fails in the engine
    ("huge_repetition", {"type": "regex", "value": "a{1000000}"}),  # lexer limit, in the engine
    ("huge_nested_repetition", {"type": "regex", "value": "(a{1000}){1000}"}),
    ("deep_nesting", {"type": "json", "value": deep_schema(200)}),
    ("enormous_schema", {"type": "json", "value": {"properties": {
        f"p{i}": {"type": "string", "description": "x" * 100} for i in range(6000)}}}),
    ("not_json", {"type": "json", "value": "{not json"}),
    ("regex_syntax", {"type": "regex", "value": "(unclosed"}),
]  # fmt: skip


@pytest.mark.parametrize("grammar", [g for _, g in BAD_GRAMMARS], ids=[n for n, _ in BAD_GRAMMARS])
def test_bad_grammars_are_a_clear_4xx_in_bounded_time(pytgi_server_url, grammar):
    body = {"inputs": "Hi", "parameters": {"grammar": grammar, "max_new_tokens": 200}}
    with httpx.Client(base_url=pytgi_server_url, timeout=60) as http:
        start = time.monotonic()
        response = http.post("/generate", json=body)
        assert time.monotonic() - start < BOUNDED_S
        assert response.status_code == 422, response.text
        error = response.json()
        assert error["error_type"] == "validation"
        assert error["error"].startswith("Input validation error: ")
        start = time.monotonic()
        stream = http.post("/generate_stream", json=body)
        assert time.monotonic() - start < BOUNDED_S
        (event,) = [json.loads(line[5:]) for line in stream.text.splitlines() if line]
        assert stream.status_code == 200 and event["error_type"] == "validation"


def test_grammar_errors_on_the_openai_routes_and_the_server_keeps_serving(pytgi_server_url):
    bad = {"type": "regex", "value": r"[^\s\S]"}  # passes the router's check, fails in the engine
    expected = "Input validation error: grammar is not valid: no output can satisfy the grammar"
    body = {"model": "tgi", "messages": MESSAGES, "response_format": bad, "max_tokens": 20}
    with httpx.Client(base_url=pytgi_server_url, timeout=60) as http:
        chat = http.post("/v1/chat/completions", json=body)
        assert chat.status_code == 422 and chat.json()["error"] == expected
        stream = http.post("/v1/chat/completions", json={**body, "stream": True})
        events = [line for line in stream.text.splitlines() if line]
        assert stream.status_code == 200 and events[-1] == "data: [DONE]"
        assert json.loads(events[0][5:]) == {
            "error": {"message": expected, "http_status_code": 422}
        }
        # catastrophic backtracking for a backtracking engine (Python's `re` too: never match the
        # output with it), linear for llguidance's lexer: served, not refused
        pathological = {"type": "regex", "value": r"(a|aa)*c|(a+)+b"}
        params = {"grammar": pathological, "max_new_tokens": 40, "details": True}
        start = time.monotonic()
        out = http.post("/generate", json={"inputs": "Hi", "parameters": params}).json()
        assert time.monotonic() - start < BOUNDED_S
        text = out["generated_text"]
        if out["details"]["finish_reason"] == "length":  # a prefix of the language
            assert re.fullmatch(r"a*", text), text
        else:
            assert re.fullmatch(r"a*c|a+b", text), text
        free = {"inputs": "Hi", "parameters": {"max_new_tokens": 5}}
        assert http.post("/generate", json=free).status_code == 200
