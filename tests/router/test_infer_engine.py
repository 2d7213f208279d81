"""Infer over the in-process engine (model-free executor): stop-string abort, disconnect."""

from __future__ import annotations

import asyncio
import time

import pytest
from engine.fakes import FakeExecutor
from engine.test_scheduler import make_core

from pytgi.engine.inproc_client import InprocEngineClient
from pytgi.messages.outputs import ModelOutput, SampledToken, SchedulerOutput
from pytgi.messages.request import FinishReason
from pytgi.router.infer import Infer
from pytgi.router.params import GenerateParameters as P

pytestmark = pytest.mark.anyio
FIRST_TEXT_ID = 8  # ids below are the fixture tokenizer's special tokens


class TextExecutor(FakeExecutor):
    """FakeExecutor whose sampled ids are ordinary tokens of the fixture tokenizer."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size

    def execute(self, out: SchedulerOutput, grammar_masks=None) -> ModelOutput:
        time.sleep(0.002)  # a step takes time, so the router's abort lands mid-generation
        result = super().execute(out)
        span = self.vocab_size - FIRST_TEXT_ID
        for rid, tokens in result.sampled.items():
            result.sampled[rid] = [
                SampledToken(FIRST_TEXT_ID + t.token_id % span, t.logprob) for t in tokens
            ]
        return result


@pytest.fixture
async def engine(tokenizer):
    core, _ = make_core()
    core.executor = TextExecutor(tokenizer.vocab_size)
    client = InprocEngineClient(core)
    yield client
    await client.shutdown()


async def test_generate_and_stop_string_abort(engine, tokenizer, limits):
    infer = Infer(engine, tokenizer, limits, engine.cache_info)
    full = await infer.generate("Hello world", P(max_new_tokens=12, details=True))
    assert full.finish_reason is FinishReason.LENGTH and full.generated_tokens == 12
    text = full.generated_text
    stop = next(text[i : i + 2] for i in range(3, len(text) - 2) if text[i : i + 2].strip())
    stopped = await infer.generate("Hello world", P(max_new_tokens=50, stop=[stop]))
    assert stopped.finish_reason is FinishReason.STOP_SEQUENCE
    assert stop in stopped.generated_text and stopped.generated_tokens < 12
    assert full.generated_text.startswith(stopped.generated_text)
    await _wait_idle(engine)
    assert engine.stats().num_aborts == 1


async def test_stream_disconnect_frees_the_engine(engine, tokenizer, limits):
    infer = Infer(engine, tokenizer, limits, engine.cache_info)
    stream = infer.generate_stream("Hello world", P(max_new_tokens=50))
    await stream.__anext__()
    await stream.aclose()
    await _wait_idle(engine)
    stats = engine.stats()
    assert stats.num_aborts == 1 and stats.num_running == 0
    assert infer.num_in_flight == 0


async def _wait_idle(engine, timeout_s: float = 2.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        stats = engine.stats()
        if stats.num_running == 0 and stats.num_waiting == 0 and stats.num_aborts:
            return
        await asyncio.sleep(0.01)
