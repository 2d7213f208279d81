"""A 32k-token prompt on a tiny Llama with a 33k context, through chunked prefill on the CPU
defaults (1024-token steps, the compiled flash-style kernels): the peak resident memory stays
within the KV cache plus a per-chunk allowance (no [T, T] score matrix: one would be 16 GiB at
four heads), and the greedy tokens are transformers' (its SDPA path, itself linear in memory)."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from models.runner_utils import prompt

from pytgi.runtime.llm import LLM

PROMPT_TOKENS = 32 * 1024
NEW_TOKENS = 4
CONTEXT = PROMPT_TOKENS + 512


class PeakRss:
    """The largest resident set seen while the block runs (sampled every 5 ms) above the
    resident set at its start."""

    def __enter__(self):
        self.base = self.peak = _rss()
        self._stop = False
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop:
            self.peak = max(self.peak, _rss())
            time.sleep(0.005)

    def __exit__(self, *exc):
        self._stop = True
        self._thread.join()

    @property
    def growth(self) -> int:
        return self.peak - self.base


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@torch.no_grad()
def hf_greedy(model_dir, ids: list[int]) -> list[int]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa")
    out = hf.generate(
        torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=3
    )
    return out[0, len(ids) :].tolist()


@pytest.mark.slow  # 32 chunks over up to 33k keys, and transformers' forward: over 30 s on 2 cores
def test_a_32k_prompt_prefills_in_chunks_in_linear_memory(tiny_model_factory):
    torch.set_num_threads(1)
    model_dir = tiny_model_factory("llama", max_position_embeddings=CONTEXT)
    ids = prompt(PROMPT_TOKENS, 11)
    block_size = 16
    num_blocks = CONTEXT // block_size
    llm = LLM(
        str(model_dir), block_size=block_size, num_blocks=num_blocks, max_batch_prefill_tokens=1024
    )
    try:
        runner = llm.core.executor.worker.runner
        # the memory plan: 2 layers x (K, V) x 2 KV heads x 16 dims x 4 bytes per token
        assert runner.bytes_per_block == 2 * 2 * 2 * 16 * 4 * block_size
        assert llm.core.cache_info.max_total_tokens == CONTEXT
        with PeakRss() as memory:
            out = llm.generate([ids], max_new_tokens=NEW_TOKENS, ignore_eos=True)[0]
        assert out.token_ids == hf_greedy(model_dir, ids)
        # the cache is allocated already; a chunk's working set is O(chunk x context) at most
        # (a [1024, 33k] mask, gathered keys), far below one [T, T] score matrix
        assert memory.growth < 400 * 2**20, memory.growth / 2**20
    finally:
        llm.close()
