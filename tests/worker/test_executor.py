"""UniprocExecutor: initialize (load, warm-up, KV sizing rules -> CacheInfo) and execute (sampled
tokens, prefill logprobs across chunks) against transformers."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from models.runner_utils import BlockAllocator, hf_logits, load_hf, prompt, scheduled, step

from pytgi.backends.cpu.platform import CpuPlatform
from pytgi.config import CacheConfig, EngineConfig, GrammarConfig, ModelConfig, SchedulerConfig
from pytgi.worker.executor import UniprocExecutor, create_executor


def make_executor(model_dir, dtype=None, scheduler=None, grammar=None, **cache) -> UniprocExecutor:
    config = EngineConfig(
        model=ModelConfig(model_id=str(model_dir), dtype=dtype),
        cache=CacheConfig(**cache),
        scheduler=scheduler or SchedulerConfig(max_batch_prefill_tokens=256),
        grammar=grammar,
    )
    executor = create_executor(config)
    assert isinstance(executor, UniprocExecutor)
    return executor


@pytest.fixture(scope="module")
def llama_dir(tiny_model_factory):
    torch.set_num_threads(1)
    return tiny_model_factory("llama")


def test_initialize_with_fixed_blocks(llama_dir, caplog):
    caplog.set_level(logging.INFO)
    executor = make_executor(llama_dir, num_blocks=40)
    info = executor.initialize()
    assert (info.num_blocks, info.block_size, info.max_batch_total_tokens) == (40, 16, 640)
    assert (info.max_total_tokens, info.max_input_tokens) == (512, 511)  # max_position_embeddings
    assert (info.dtype, info.device, info.max_position_embeddings) == ("float32", "cpu", 512)
    assert info.warmup_s > 0
    assert "warm-up (256 prefill tokens)" in caplog.text
    executor.shutdown()


def test_blocks_from_max_batch_total_tokens(llama_dir):
    scheduler = SchedulerConfig(max_batch_prefill_tokens=64, max_batch_total_tokens=200)
    executor = make_executor(llama_dir, scheduler=scheduler)
    info = executor.initialize()
    assert (info.num_blocks, info.max_total_tokens, info.max_input_tokens) == (12, 192, 191)
    executor.shutdown()


@pytest.mark.parametrize("cap,expected_blocks", [(None, 4096), (1 << 20, 128)])
def test_blocks_from_memory(llama_dir, monkeypatch, cap, expected_blocks):
    monkeypatch.setattr(CpuPlatform, "available_memory_bytes", lambda self: 64 << 20)
    executor = make_executor(llama_dir, memory_fraction=0.5, max_kv_cache_bytes=cap)
    # 2 layers x (K + V) x 2 kv heads x 16 head_dim x 16 tokens x 4 bytes = 8 KiB per block
    assert executor.initialize().num_blocks == expected_blocks
    executor.shutdown()


def test_the_grammar_cache_is_counted_in_the_memory_plan(llama_dir, monkeypatch):
    """On CPU the compiled-grammar cache lives in the same memory as the KV cache: its byte bound
    comes off the budget before the fraction is applied."""
    monkeypatch.setattr(CpuPlatform, "available_memory_bytes", lambda self: 64 << 20)
    grammar = GrammarConfig(cache_bytes=32 << 20)
    executor = make_executor(llama_dir, memory_fraction=0.5, grammar=grammar)
    assert executor.initialize().num_blocks == 2048  # (64 - 32) MiB x 0.5 / 8 KiB
    executor.shutdown()


def test_execute_samples_and_reports_prefill_logprobs_across_chunks(llama_dir):
    executor = make_executor(llama_dir, num_blocks=16)
    executor.initialize()
    hf = load_hf(llama_dir)
    blocks = BlockAllocator()
    a, b = prompt(40, seed=11), prompt(9, seed=12)
    a_blocks, b_blocks = blocks.take(41), blocks.take(9)
    chunks = []
    for start, end in ((0, 16), (16, 32), (32, 40)):
        rows = [scheduled("a", a, start, end, a_blocks, sample=end == 40, prefill_logprobs=True)]
        if start == 0:
            rows.append(scheduled("b", b, 0, 9, b_blocks))
        out = executor.execute(step(*rows))
        chunks += out.prefill_logprobs["a"]
        assert set(out.sampled) == ({"b"} if start == 0 else {"a"} if end == 40 else set())
        if start == 0:
            assert out.sampled["b"][0].token_id == int(hf_logits(hf, b)[-1].argmax())
    ref = torch.log_softmax(hf_logits(hf, a), dim=-1)  # [40, V]
    expected = ref[:-1].gather(1, torch.tensor(a[1:]).unsqueeze(1)).squeeze(1)  # [39]
    assert len(chunks) == 40 and math.isnan(chunks[0])
    torch.testing.assert_close(torch.tensor(chunks[1:]), expected, atol=1e-4, rtol=0)
    (last,) = out.sampled["a"]
    assert last.token_id == int(ref[-1].argmax())
    assert last.logprob == pytest.approx(ref[-1].max().item(), abs=1e-4)
    executor.shutdown()


def test_bfloat16_runs_close_to_float32(llama_dir):
    executor = make_executor(llama_dir, dtype="bfloat16", num_blocks=8)
    assert executor.initialize().dtype == "bfloat16"
    ids = prompt(20, seed=13)
    runner = executor.worker.runner
    logits = runner.forward(step(scheduled("x", ids, 0, 20, list(range(2)))))
    expected = hf_logits(load_hf(llama_dir), ids)[-1]
    assert (logits[0].float() - expected).abs().max().item() < 0.1
    executor.shutdown()
