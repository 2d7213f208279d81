"""`pytgi serve` on a model mixing windowed and full layers (the tiny Gemma 3, window 24): `/info`
reports each KV group's blocks and the tokens that fit (the full group's), the start-up log says
the same, and a generation well past the window gives the offline engine's tokens."""

from __future__ import annotations

import httpx
from text_generation import Client

from e2e.server import running_server
from pytgi.runtime.llm import LLM

PROMPT = "The quick brown fox jumps over the lazy dog and keeps on running far away"
NEW_TOKENS = 80


def test_window_groups_are_served_and_reported(tiny_model_factory, tmp_path):
    model_dir = tiny_model_factory("gemma3")
    options = dict(num_blocks=256, block_size=16, max_batch_prefill_tokens=512, max_batch_size=2)
    llm = LLM(str(model_dir), **options)
    try:
        offline = llm.generate([PROMPT], max_new_tokens=NEW_TOKENS, ignore_eos=True)[0].token_ids
    finally:
        llm.close()
    with running_server(
        model_dir, "--max-batch-size", "2", log_path=tmp_path / "server.log"
    ) as server:
        info = httpx.get(f"{server.url}/info").json()
        # the window group: 2 requests x (cdiv(23, 16) + 2) + cdiv(512, 16) blocks
        groups = [
            {"sliding_window": None, "num_blocks": 256},
            {"sliding_window": 24, "num_blocks": 40},
        ]
        assert info["kv_cache"]["groups"] == groups
        assert info["max_batch_total_tokens"] == 256 * 16
        assert "KV cache groups: full attention: 256 blocks" in server.logs()
        assert "window 24: 40 blocks" in server.logs() and "holds 4096 tokens" in server.logs()
        client = Client(server.url, timeout=60)
        details = client.generate(
            PROMPT, max_new_tokens=NEW_TOKENS, decoder_input_details=False, stop_sequences=[]
        ).details
        served = [t.id for t in details.tokens]
        assert served == offline[: len(served)] and len(served) > 24
