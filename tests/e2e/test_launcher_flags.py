"""TGI launcher flags, each with an observable effect through the real server: rope scaling,
--weights-cache-override, --disable-custom-kernels, the watermark's gamma and delta, the
Prometheus port (busy = a warning), --validation-workers, --speculate, TGI 3's warning for the
non-chunking batching flags, and OpenTelemetry spans received by a real OTLP/gRPC collector.

Two servers start side by side (one fixture) so the module pays one start-up.
"""

from __future__ import annotations

import json
import shutil
import socket

import httpx
import pytest
import torch
from fixtures.otlp_collector import OtlpCollector

from e2e.server import ServerProcess, free_port

PROMPT = "The quick brown fox jumps over the lazy dog"
GAMMA, DELTA = 0.25, 10.0
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"


@pytest.fixture(scope="module")
def collector():
    receiver = OtlpCollector()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="module")
def split_model(tiny_model_factory, tmp_path_factory):
    """(model_dir, weights_dir): config and tokenizer in one directory, the weights in another."""
    source = tiny_model_factory("llama")
    root = tmp_path_factory.mktemp("split")
    model_dir, weights_dir = root / "model", root / "weights"
    model_dir.mkdir()
    weights_dir.mkdir()
    for path in source.iterdir():
        target = weights_dir if path.name.endswith(".safetensors") else model_dir
        shutil.copy(path, target / path.name)
    return model_dir, weights_dir


@pytest.fixture(scope="module")
def servers(split_model, tiny_model_factory, collector, tmp_path_factory):
    """(flagged, busy): most flags on one server; the other's Prometheus port is taken."""
    logs = tmp_path_factory.mktemp("flags")
    model_dir, weights_dir = split_model
    prometheus_port = free_port()
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    flagged = ServerProcess(
        model_dir,
        "--weights-cache-override", str(weights_dir),
        "--rope-scaling", "linear", "--rope-factor", "2",
        "--disable-custom-kernels",
        "--watermark-gamma", str(GAMMA), "--watermark-delta", str(DELTA),
        "--prometheus-port", str(prometheus_port),
        "--validation-workers", "3",
        "--otlp-endpoint", collector.endpoint, "--otlp-service-name", "pytgi-flags",
        "--enable-prefill-logprobs",
        "--speculate", "2",
        "--max-waiting-tokens", "5",
        log_path=logs / "flagged.log",
    )  # fmt: skip
    busy = ServerProcess(
        tiny_model_factory("llama"),
        "--prometheus-port", str(taken.getsockname()[1]),
        "--rope-factor", "2",
        log_path=logs / "busy.log",
    )  # fmt: skip
    try:
        flagged.wait_healthy()
        busy.wait_healthy()
        flagged.prometheus_port = prometheus_port
        yield flagged, busy
    finally:
        flagged.stop()
        busy.stop()
        taken.close()


@pytest.fixture(scope="module")
def flagged(servers):
    return servers[0]


def prompt_logprobs(model_dir, rope_scaling):
    """transformers' eager logprobs of PROMPT's tokens 1.. (the correctness reference)."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    config = transformers.AutoConfig.from_pretrained(model_dir)
    config.rope_scaling = rope_scaling
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, config=config, attn_implementation="eager"
    )
    ids = tok(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    logprobs = torch.log_softmax(logits[:-1], dim=-1)
    return logprobs.gather(1, ids[0, 1:, None])[:, 0]


def test_rope_override_matches_transformers_with_that_scaling(flagged, tiny_model_factory):
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 1, "decoder_input_details": True}}
    prefill = httpx.post(f"{flagged.url}/generate", json=body, timeout=60).json()["details"]
    served = torch.tensor([t["logprob"] for t in prefill["prefill"][1:]])
    source = tiny_model_factory("llama")
    scaled = prompt_logprobs(source, {"type": "linear", "factor": 2.0})
    unscaled = prompt_logprobs(source, None)
    # the tiny model's logprobs move by up to ~1e-2 with the scaling: far above the fp32 noise
    torch.testing.assert_close(served, scaled, atol=5e-4, rtol=0)
    assert (served - unscaled).abs().max() > 5e-3  # the override changed the model


def test_rope_factor_alone_is_linear_scaling(servers):
    assert "rope scaling overridden: linear x2" in servers[1].logs()


def test_weights_come_from_the_override_directory(flagged, split_model):
    model_dir, weights_dir = split_model
    assert not list(model_dir.glob("*.safetensors"))  # the server could only read them there
    assert f"from {weights_dir}" in flagged.logs()


def test_disable_custom_kernels_runs_plain_torch(flagged, servers):
    assert "platform: cpu (torch only" in flagged.logs()
    assert "platform: cpu (compiled kernels" in servers[1].logs()


def test_watermark_uses_gamma_and_delta(flagged, split_model):
    from pytgi.sampling.watermark import Watermark

    body = {
        "inputs": PROMPT,
        "parameters": {"max_new_tokens": 8, "watermark": True, "decoder_input_details": True},
    }
    details = httpx.post(f"{flagged.url}/generate", json=body, timeout=60).json()["details"]
    tokens = [t["id"] for t in details["prefill"][-1:] + details["tokens"]]
    vocab = json.loads((split_model[0] / "config.json").read_text())["vocab_size"]
    watermark = Watermark(vocab, GAMMA, DELTA)
    # a bias of 10 puts every greedy token in the gamma=0.25 green list of the one before it
    # (by chance: 0.25 ** 8)
    for prev, token in zip(tokens, tokens[1:], strict=False):
        assert token in watermark.greenlist_ids(prev).tolist()


def test_prometheus_port_serves_the_metrics(flagged):
    text = httpx.get(f"http://127.0.0.1:{flagged.prometheus_port}/any/path").text
    assert "tgi_request_count" in text


def test_busy_prometheus_port_is_a_warning(servers):
    busy = servers[1]
    assert "no Prometheus port (/metrics is still on the main port)" in busy.logs()
    assert "tgi_request_count" in httpx.get(f"{busy.url}/metrics").text


def test_validation_workers_and_speculate_are_visible(flagged):
    info = httpx.get(f"{flagged.url}/info").json()
    assert info["validation_workers"] == 3
    assert info["speculate"] == 2
    assert "Speculative decoding on: 2 draft tokens" in flagged.logs()


def test_waiting_flags_get_tgi_warning(flagged, servers):
    warning = "`waiting_served_ratio` and `max_waiting_tokens` are not supported"
    assert warning in flagged.logs()
    assert warning not in servers[1].logs()


def test_otlp_spans_reach_the_collector(flagged, collector):
    traceparent = f"00-{TRACE_ID}-{PARENT_ID}-01"
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 3}}
    resp = httpx.post(
        f"{flagged.url}/generate", json=body, headers={"traceparent": traceparent}, timeout=60
    )
    assert resp.status_code == 200

    def arrived(spans):
        ours = [s for s in spans if s.trace_id == TRACE_ID]
        return {"generate", "validate", "queued", "infer"} <= {s.name for s in ours}

    spans = [s for s in collector.wait_for(arrived) if s.trace_id == TRACE_ID]
    root = next(s for s in spans if s.name == "generate")
    assert root.parent_span_id == PARENT_ID  # continues the client's trace
    assert root.service_name == "pytgi-flags"
    assert root.attributes["http.response.status_code"] == 200
    assert root.attributes["generated_tokens"] == 3
    phases = sorted(
        (s for s in spans if s.parent_span_id == root.span_id), key=lambda s: s.start_ns
    )
    assert [s.name for s in phases] == ["validate", "queued", "infer"]
    assert root.start_ns <= phases[0].start_ns <= phases[-1].end_ns <= root.end_ns


def test_otlp_stream_span_has_its_phases(flagged, collector):
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 2}}
    with httpx.stream("POST", f"{flagged.url}/generate_stream", json=body, timeout=60) as resp:
        resp.read()

    def arrived(spans):
        roots = [s for s in spans if s.name == "generate_stream"]
        return any(
            s.parent_span_id == r.span_id and s.name == "infer" for r in roots for s in spans
        )

    spans = collector.wait_for(arrived)
    root = next(s for s in spans if s.name == "generate_stream")
    assert root.parent_span_id == ""  # no traceparent: a new trace
