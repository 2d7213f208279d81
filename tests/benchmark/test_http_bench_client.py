"""The streaming clients against a real local server: token counts, timings, errors, payloads."""

from __future__ import annotations

import asyncio

import pytest

from pytgi.benchmark.http.apis import ApiOptions, make_api
from pytgi.benchmark.http.client import HttpSender, discover_model_name, normalize_base_url
from pytgi.benchmark.http.records import RequestResult, RequestSpec
from pytgi.benchmark.http.sse import SSEDecoder

APIS = ["tgi", "chat", "completions"]
SPEC = RequestSpec("the server streams tokens", num_prompt_tokens=4, max_new_tokens=6)


def send(url: str, api: str, spec: RequestSpec = SPEC, timeout_s: float = 10, **options):
    async def go() -> RequestResult:
        sender = HttpSender(url, make_api(api, ApiOptions(**options)), timeout_s, 4)
        try:
            return await sender.send(spec)
        finally:
            await sender.aclose()

    return asyncio.run(go())


def test_sse_decoder_handles_both_data_spellings_comments_and_multiline():
    decoder = SSEDecoder()
    lines = ['data:{"a":1}', "", ":keep-alive", "", "event: x", "data: [DONE]", "", "data: p1"]
    events = [e for e in (decoder.feed_line(line) for line in lines + ["data: p2"]) if e]
    assert events == ['{"a":1}', "[DONE]"]
    assert decoder.flush() == "p1\np2"
    assert decoder.flush() is None


def test_base_url_is_normalized():
    assert normalize_base_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"
    assert normalize_base_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000"


@pytest.mark.parametrize("api", APIS)
def test_stream_counts_match_server_and_timings_are_consistent(fake_server, api):
    fake_server.reset(first_token_delay_s=0.03, token_delay_s=0.005)
    result = send(fake_server.url, api)
    assert result.ok, result.error
    assert result.output_tokens_source == "server"
    assert result.num_output_tokens == result.num_token_events == 6
    assert fake_server.stats.num_generated_tokens == 6
    assert len(result.itl_s) == 5 and all(gap >= 0 for gap in result.itl_s)
    assert sum(result.itl_s) >= 0.01  # 5 gaps of 5 ms each, less scheduling jitter
    assert 0.035 <= result.ttft_s <= result.e2e_s
    assert result.e2e_s >= 0.03 + 6 * 0.005
    assert result.ttft_s + sum(result.itl_s) <= result.e2e_s
    assert result.tpot_s == pytest.approx((result.e2e_s - result.ttft_s) / 5)
    assert result.server_prompt_tokens is not None


@pytest.mark.parametrize("api", APIS)
def test_without_server_usage_tokens_are_counted_from_events(fake_server, api):
    fake_server.reset(report_usage=False, max_tokens_cap=4)  # stops early, like EOS
    result = send(fake_server.url, api)
    assert result.ok, result.error
    assert result.output_tokens_source == "events"
    assert result.num_output_tokens == result.num_token_events == 4


@pytest.mark.parametrize(
    "style", [{"role_preamble": True}, {"empty_first_token": True}, {"role_preamble": True,
              "empty_first_token": True, "report_usage": False}]
)  # fmt: skip
def test_vllm_role_preamble_is_no_token_but_an_empty_tgi_token_is(fake_server, style):
    fake_server.reset(first_token_delay_s=0.02, token_delay_s=0.005, **style)
    result = send(fake_server.url, "chat")
    assert result.ok, result.error
    assert result.num_token_events == result.num_output_tokens == 6
    assert len(result.itl_s) == 5


@pytest.mark.parametrize(
    "api, mode, message",
    [
        ("tgi", "http", "HTTP 503: Model is overloaded"),
        ("chat", "http", "HTTP 503: Model is overloaded"),
        ("tgi", "event", "generation: Request failed during generation: boom"),
        ("chat", "event", "422: Input validation error: boom"),
        ("completions", "event", "422: Input validation error: boom"),
        ("tgi", "truncate", "stream ended before generated_text"),
        ("chat", "truncate", "stream ended before finish_reason or [DONE]"),
        ("completions", "truncate", "stream ended before finish_reason or [DONE]"),
    ],
)
def test_server_errors_become_readable_messages(fake_server, api, mode, message):
    fake_server.reset(error_mode=mode, error_after_tokens=2)
    result = send(fake_server.url, api)
    assert not result.ok
    assert result.error == message or result.error.startswith(message)
    assert result.num_token_events == (0 if mode == "http" else 2)


def test_slow_request_times_out(fake_server):
    fake_server.reset(first_token_delay_s=2.0)
    result = send(fake_server.url, "tgi", timeout_s=0.2)
    assert result.error == "timed out after 0.2 s"
    assert result.e2e_s < 1.5


@pytest.mark.parametrize("api", APIS)
def test_unreachable_server_is_a_failed_request(closed_port_url, api):
    result = send(closed_port_url, api)
    assert not result.ok
    assert result.error.startswith(f"cannot connect to {closed_port_url}")
    assert result.ttft_s is None and result.num_output_tokens == 0


def test_payloads_follow_each_api(fake_server):
    send(fake_server.url, "tgi")
    send(fake_server.url, "chat", model="m", ignore_eos=True)
    send(fake_server.url, "completions", temperature=0.7)
    tgi, chat, completions = fake_server.stats.payloads
    assert tgi == {
        "inputs": SPEC.prompt,
        "parameters": {"max_new_tokens": 6, "details": True, "do_sample": False},
    }
    assert chat["messages"] == [{"role": "user", "content": SPEC.prompt}]
    assert chat["model"] == "m" and chat["max_tokens"] == 6 and chat["ignore_eos"] is True
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    assert chat["temperature"] == 0
    assert completions["prompt"] == SPEC.prompt and completions["temperature"] == 0.7
    assert "ignore_eos" not in completions


@pytest.mark.parametrize("api", APIS)
def test_model_name_is_discovered_from_info_or_v1_models(fake_server, closed_port_url, api):
    assert asyncio.run(discover_model_name(fake_server.url, api=api)) == "fake/model"
    assert asyncio.run(discover_model_name(closed_port_url, api=api)) is None
