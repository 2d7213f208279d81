"""`pytgi serve --speculate 4` through HTTP: greedy and seeded outputs are exactly those of the
server without speculation (the session's shared demo server), streamed and not, several requests
at once, with the default (adaptive) speculation policy and with TGI's (`always`); accepted drafts
show up in TGI's `tgi_request_skipped_tokens`."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from e2e.server import ServerProcess

PROMPTS = ["And God said unto Moses, ", "In the beginning God created", "The LORD is my shepherd"]


@pytest.fixture(scope="module")
def speculating_server(demo_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("speculate") / "server.log"
    server = ServerProcess(demo_model_dir, "--speculate", "4", log_path=log)
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


async def generate_all(url: str, parameters: dict) -> list[list[int]]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        bodies = [{"inputs": p, "parameters": {**parameters, "details": True}} for p in PROMPTS]
        responses = await asyncio.gather(*(client.post("/generate", json=b) for b in bodies))
    return [[t["id"] for t in r.json()["details"]["tokens"]] for r in responses]


@pytest.mark.parametrize(
    "parameters",
    [
        {"max_new_tokens": 48},
        {"max_new_tokens": 48, "do_sample": True, "temperature": 0.7, "seed": 3},
    ],
)
def test_outputs_equal_the_server_without_speculation(
    speculating_server, pytgi_server_url, parameters
):
    plain = asyncio.run(generate_all(pytgi_server_url, parameters))
    speculated = asyncio.run(generate_all(speculating_server.url, parameters))
    assert speculated == plain


def test_stream_equals(speculating_server, pytgi_server_url):
    body = {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 48}}
    with httpx.Client(timeout=120) as client:
        final = client.post(f"{pytgi_server_url}/generate", json=body).json()["generated_text"]
        with client.stream("POST", f"{speculating_server.url}/generate_stream", json=body) as r:
            events = [line for line in r.iter_lines() if line.startswith("data:")]
        metrics = client.get(f"{speculating_server.url}/metrics").text
    assert json.loads(events[-1].removeprefix("data:"))["generated_text"] == final
    skipped = [
        line for line in metrics.splitlines() if line.startswith("tgi_request_skipped_tokens_sum")
    ]
    assert skipped  # accepted drafts: test_a_quantized_model_speculates_... (TGI's policy)


def speculation_steps(metrics: str, decision: str) -> float | None:
    prefix = f'pytgi_speculation_steps{{decision="{decision}"}} '
    lines = [line for line in metrics.splitlines() if line.startswith(prefix)]
    return float(lines[0].split()[-1]) if lines else None


def test_the_adaptive_policy_reports_its_decisions(speculating_server):
    """The server runs the default policy (drafts only in steps it measures to pay; the tests
    above show the outputs unchanged): /metrics counts the steps that verified drafts and those
    that had drafts and decoded without them."""
    metrics = httpx.get(f"{speculating_server.url}/metrics").text
    assert speculation_steps(metrics, "drafted") > 0
    assert speculation_steps(metrics, "skipped") is not None


async def generate_details(url: str, parameters: dict) -> list[list[tuple[int, float]]]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        bodies = [{"inputs": p, "parameters": {**parameters, "details": True}} for p in PROMPTS]
        responses = await asyncio.gather(*(client.post("/generate", json=b) for b in bodies))
    return [[(t["id"], t["logprob"]) for t in r.json()["details"]["tokens"]] for r in responses]


def test_a_quantized_model_speculates_without_changing_its_outputs(
    demo_model_dir, tmp_path_factory
):
    """LLM.int8 (int8 activations with per-row outliers) with and without --speculate 4, greedy
    and seeded, several requests at once: the same tokens and log-probabilities."""
    flags = ("--quantize", "bitsandbytes", "--dtype", "float32")
    outputs = []
    for extra in ((), ("--speculate", "4", "--speculation-policy", "always")):
        log = tmp_path_factory.mktemp("quantized-speculate") / "server.log"
        server = ServerProcess(demo_model_dir, *flags, *extra, log_path=log)
        try:
            server.wait_healthy(timeout_s=300)
            outputs.append([
                asyncio.run(generate_details(server.url, parameters))
                for parameters in (
                    {"max_new_tokens": 40},
                    {"max_new_tokens": 40, "do_sample": True, "temperature": 0.8, "seed": 5},
                )
            ])  # fmt: skip
            if extra:
                metrics = httpx.get(f"{server.url}/metrics").text
        finally:
            server.stop()
    assert outputs[1] == outputs[0]
    skipped = [
        line for line in metrics.splitlines() if line.startswith("tgi_request_skipped_tokens_sum")
    ]
    assert skipped and float(skipped[0].split()[-1]) > 0  # drafts were accepted
    # TGI's behaviour: no step that had drafts decoded without them
    assert speculation_steps(metrics, "skipped") == 0
