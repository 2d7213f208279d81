"""`pytgi serve --model-id <medusa checkpoint>`: the base model is served with the Medusa heads
drafting (`--speculate` defaulting to the heads); outputs equal the base model served without
speculation, and /metrics counts the verified drafts."""

from __future__ import annotations

import httpx
import pytest
from fixtures.speculators import make_medusa

from e2e.server import ServerProcess

PROMPT = "The quick brown fox jumps over"


@pytest.fixture(scope="module")
def servers(tiny_model_factory, tmp_path_factory):
    base = tiny_model_factory("llama")
    root = tmp_path_factory.mktemp("medusa-e2e")
    medusa = make_medusa(base, root / "medusa", heads=3)
    plain = ServerProcess(base, log_path=root / "plain.log")
    speculating = ServerProcess(
        medusa, "--speculation-policy", "always", log_path=root / "medusa.log"
    )
    try:
        plain.wait_healthy()
        speculating.wait_healthy()
        yield plain, speculating
    finally:
        plain.stop()
        speculating.stop()


@pytest.mark.parametrize(
    "parameters",
    [{"max_new_tokens": 24}, {"max_new_tokens": 24, "do_sample": True, "seed": 5, "top_k": 10}],
)
def test_medusa_outputs_equal_the_base_model(servers, parameters):
    plain, speculating = servers
    body = {"inputs": PROMPT, "parameters": {**parameters, "details": True}}
    expected = httpx.post(f"{plain.url}/generate", json=body, timeout=60).json()
    got = httpx.post(f"{speculating.url}/generate", json=body, timeout=60).json()
    assert [t["id"] for t in got["details"]["tokens"]] == [
        t["id"] for t in expected["details"]["tokens"]
    ]
    metrics = httpx.get(f"{speculating.url}/metrics").text
    drafts = [
        line for line in metrics.splitlines() if line.startswith("pytgi_speculative_draft_tokens ")
    ]
    assert float(drafts[0].split()[1]) > 0
    assert "Using speculation medusa with 3" in speculating.logs()


def test_speculate_above_the_heads_fails_at_start(tiny_model_factory, tmp_path):
    base = tiny_model_factory("llama")
    medusa = make_medusa(base, tmp_path / "medusa", heads=2)
    server = ServerProcess(medusa, "--speculate", "3", log_path=tmp_path / "server.log")
    try:
        assert server.proc.wait(120) != 0
    finally:
        server.stop()
    assert "only has `2` heads" in server.logs().strip().splitlines()[-1]
