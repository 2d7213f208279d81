"""MultiprocExecutor with two gloo ranks gives the single-process results (tokens and logprobs,
including prefill logprobs), and a rank that dies turns the next step into EngineDeadError. Faults
through the real launcher: tests/e2e/test_tp_faults.py."""

from __future__ import annotations

import pytest
import torch
from e2e.server import free_port
from models.runner_utils import BlockAllocator, prompt, scheduled, step

from pytgi.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig
from pytgi.errors import EngineDeadError
from pytgi.worker.executor import MultiprocExecutor, UniprocExecutor, create_executor

pytestmark = pytest.mark.tp


def config(model_dir, num_shard: int) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(model_id=str(model_dir)),
        cache=CacheConfig(num_blocks=24),
        scheduler=SchedulerConfig(max_batch_prefill_tokens=64),
        parallel=ParallelConfig(num_shard=num_shard, master_port=free_port()),
        num_threads=1,
    )


def run_steps(executor) -> list:
    """A mixed prefill step, a chunk with prefill logprobs, then decodes of both requests."""
    blocks = BlockAllocator()
    a, b = prompt(20, seed=21), prompt(30, seed=22)
    a_blocks, b_blocks = blocks.take(20 + 4), blocks.take(30 + 4)
    outputs = [
        executor.execute(
            step(
                scheduled("a", a, 0, 20, a_blocks),
                scheduled("b", b, 0, 16, b_blocks, sample=False, prefill_logprobs=True),
            )
        )
    ]
    outputs.append(
        executor.execute(step(scheduled("b", b, 16, 30, b_blocks, prefill_logprobs=True)))
    )
    for _ in range(3):
        a = a + [outputs[-1].sampled["a"][0].token_id] if "a" in outputs[-1].sampled else a
        b = b + [outputs[-1].sampled["b"][0].token_id]
        outputs.append(
            executor.execute(
                step(
                    scheduled("a", a, len(a) - 1, len(a), a_blocks),
                    scheduled("b", b, len(b) - 1, len(b), b_blocks),
                )
            )
        )
    return outputs


def test_two_shards_match_one_and_detect_a_dead_rank(tiny_model_factory):
    torch.set_num_threads(1)
    model_dir = tiny_model_factory("qwen2", num_key_value_heads=1)  # q/k/v bias, replicated kv
    single = create_executor(config(model_dir, 1))
    assert isinstance(single, UniprocExecutor)
    single.initialize()
    expected = run_steps(single)
    single.shutdown()

    sharded = create_executor(config(model_dir, 2))
    assert isinstance(sharded, MultiprocExecutor)
    try:
        assert sharded.initialize().num_blocks == 24
        for want, got in zip(expected, run_steps(sharded), strict=True):
            assert {r: t[0].token_id for r, t in got.sampled.items()} == {
                r: t[0].token_id for r, t in want.sampled.items()
            }
            for rid, (token,) in got.sampled.items():
                assert token.logprob == pytest.approx(want.sampled[rid][0].logprob, abs=1e-4)
            for rid, values in want.prefill_logprobs.items():
                torch.testing.assert_close(
                    torch.tensor(got.prefill_logprobs[rid]),
                    torch.tensor(values),
                    atol=1e-4,
                    rtol=0,
                    equal_nan=True,
                )
        sharded.supervisor.procs[1].kill()
        with pytest.raises(EngineDeadError, match=r"tensor-parallel rank 1 died \(exit code -9"):
            sharded.execute(step(scheduled("c", [5, 6], 0, 2, [0])))
    finally:
        sharded.shutdown()
    assert not sharded.supervisor.procs


def failing_rank(config, rank, model_dir, reports, parent_pid) -> None:
    """A spawned rank that starts, reports why it fails, and exits with code 1."""
    import sys

    reports.put(("started", rank, ""))
    reports.put(("failed", rank, "ModelLoadError: the checkpoint is missing 1 tensor(s)"))
    sys.exit(1)


def test_a_rank_death_is_reported_once_with_the_rank_error():
    from pytgi.worker.supervisor import RankSupervisor

    deaths = []
    supervisor = RankSupervisor(config("unused", 2), on_death=deaths.append)
    supervisor.start("unused", target=failing_rank)
    try:
        with pytest.raises(EngineDeadError) as raised:
            supervisor.wait_started(timeout_s=60)
            supervisor.check(wait_s=60)
    finally:
        supervisor.stop_monitoring()
        supervisor.end_ranks(grace_s=0)
    expected = (
        "tensor-parallel rank 1 failed (exit code 1): "
        "ModelLoadError: the checkpoint is missing 1 tensor(s)"
    )
    assert raised.value.message == expected
    assert deaths == [expected]


def test_two_shards_send_each_kv_groups_table(tiny_model_factory):
    """The tiny Gemma 3 (a full and a window-24 KV group) on two ranks: rank 0 sends every
    group's block table and slots with the step (worker/step_transport.py), and the tokens past
    the window are transformers'."""
    import dataclasses

    from models.runner_utils import hf_greedy_logprobs, load_hf

    from pytgi.runtime.build import engine_config
    from pytgi.runtime.llm import LLM

    torch.set_num_threads(1)
    model_dir = tiny_model_factory("gemma3")
    ids = prompt(40, 31)
    tokens, logprobs = hf_greedy_logprobs(load_hf(model_dir), ids, 24)
    cfg = engine_config(  # one running request: a 12-block window group, whose ids are reused
        str(model_dir), num_blocks=64, block_size=4, max_batch_prefill_tokens=16,
        max_batch_size=1, num_threads=1,
    )  # fmt: skip
    parallel = ParallelConfig(num_shard=2, master_port=free_port())
    llm = LLM.from_config(dataclasses.replace(cfg, parallel=parallel))
    try:
        assert [g.pool.num_blocks for g in llm.core.scheduler.kv.groups] == [64, 12]
        out = llm.generate([ids], max_new_tokens=24, ignore_eos=True)[0]
    finally:
        llm.close()
    assert out.token_ids == tokens
    assert out.logprobs == pytest.approx(logprobs, abs=2e-3)
