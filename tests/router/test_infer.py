"""Infer against a scripted engine: results, details, stop strings, best_of, limits, aborts."""

from __future__ import annotations

import asyncio
import math

import pytest
from fake_engine import FakeEngine, token_deltas

from pytgi.config import LimitsConfig
from pytgi.errors import (
    GenerationError,
    IncompleteGenerationError,
    OverloadedError,
    ValidationError,
)
from pytgi.messages.outputs import RequestOutput
from pytgi.messages.request import FinishReason
from pytgi.router.infer import Infer
from pytgi.router.params import GenerateParameters as P

pytestmark = pytest.mark.anyio
ANSWER = " world! 日本語 🙂"


def make_infer(tokenizer, limits, cache_info, script, **kwargs) -> tuple[Infer, FakeEngine]:
    engine = FakeEngine(script, delay_s=kwargs.pop("delay_s", 0.0))
    return Infer(engine, tokenizer, limits, cache_info, **kwargs), engine


def answer_ids(tokenizer, text=ANSWER) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


@pytest.fixture
def eos_script(tokenizer):
    ids = answer_ids(tokenizer) + [tokenizer.eos_token_id]
    return lambda req: token_deltas(req, ids, FinishReason.EOS_TOKEN)


async def test_generate_greedy(tokenizer, limits, cache_info, eos_script):
    infer, engine = make_infer(tokenizer, limits, cache_info, eos_script)
    gen = await infer.generate("Hello", P(max_new_tokens=30, details=True))
    assert gen.generated_text == ANSWER
    assert gen.finish_reason is FinishReason.EOS_TOKEN
    assert gen.generated_tokens == len(answer_ids(tokenizer)) + 1
    assert gen.seed is None and gen.prefill == [] and gen.top_tokens == []
    assert gen.tokens[-1].special and gen.tokens[-1].text == "</s>"
    assert "".join(t.text for t in gen.tokens[:-1]) == ANSWER
    assert gen.input_length == len(tokenizer.encode("Hello").ids)
    assert gen.timings.queue_s == pytest.approx(0.01)
    assert gen.timings.total_s >= gen.timings.validation_s
    assert engine.requests[0].stopping.max_new_tokens == 30
    assert engine.completed and not engine.aborted
    assert infer.num_in_flight == 0


async def test_split_multibyte_tokens_have_empty_text(tokenizer, limits, cache_info, eos_script):
    infer, _ = make_infer(tokenizer, limits, cache_info, eos_script)
    gen = await infer.generate("Hello", P(details=True))
    texts = [t.text for t in gen.tokens]
    assert "" in texts  # bytes of a CJK char / emoji that do not complete it yet
    assert not any("\ufffd" in t for t in texts)


async def test_top_n_tokens_and_full_text(tokenizer, limits, cache_info, eos_script):
    infer, _ = make_infer(tokenizer, limits, cache_info, eos_script)
    gen = await infer.generate(
        "Hello", P(top_n_tokens=3, return_full_text=True, do_sample=True, seed=9)
    )
    assert gen.generated_text == "Hello" + ANSWER
    assert len(gen.top_tokens) == gen.generated_tokens
    first = gen.top_tokens[0]
    assert [t.id for t in first][0] == gen.tokens[0].id and len(first) == 3
    assert first[1].text == tokenizer.decode([first[1].id])
    assert gen.seed == 9


async def test_stop_sequence_aborts_and_keeps_stop_text(tokenizer, limits, cache_info):
    ids = answer_ids(tokenizer, " one two three four five six")
    infer, engine = make_infer(
        tokenizer, limits, cache_info, lambda req: token_deltas(req, ids, FinishReason.LENGTH)
    )
    gen = await infer.generate("Hello", P(stop=["thr"], details=True))
    assert gen.finish_reason is FinishReason.STOP_SEQUENCE
    assert gen.generated_text.startswith(" one two thr")
    assert "four" not in gen.generated_text
    assert engine.aborted == [engine.requests[0].request_id]


async def test_prefill_tokens_only_when_enabled(tokenizer, limits, cache_info):
    def script(req):
        deltas = token_deltas(req, [70, 71])
        deltas[0].prefill_logprobs = [math.nan] + [-1.0] * (len(req.prompt_ids) - 1)
        return deltas

    infer, _ = make_infer(tokenizer, limits, cache_info, script, enable_prefill_logprobs=True)
    gen = await infer.generate("Hello world", P(decoder_input_details=True))
    prompt = tokenizer.encode("Hello world").ids
    assert [p.id for p in gen.prefill] == prompt
    assert gen.prefill[0].logprob is None and gen.prefill[1].logprob == -1.0
    assert gen.prefill[0].text == "<s>"
    plain, _ = make_infer(tokenizer, limits, cache_info, script)
    assert (await plain.generate("Hello world", P(decoder_input_details=True))).prefill == []


async def test_best_of_picks_highest_mean_logprob(tokenizer, limits, cache_info):
    seeds = []

    def script(req):
        seeds.append(req.sampling.seed)
        logprob = -0.1 if len(seeds) == 2 else -2.0
        return token_deltas(req, answer_ids(tokenizer, f" candidate {len(seeds)}"), logprob=logprob)

    infer, engine = make_infer(tokenizer, limits, cache_info, script)
    gen = await infer.generate("Hello", P(best_of=2, do_sample=True, details=True))
    assert gen.generated_text == " candidate 2"
    assert len(gen.best_of_sequences) == 1
    assert gen.best_of_sequences[0].generated_text == " candidate 1"
    assert len(set(seeds)) == 2 and gen.seed == seeds[1]
    assert gen.best_of_sequences[0].seed == seeds[0]
    assert len(engine.completed) == 2 and infer.num_in_flight == 0


async def test_engine_error_is_a_generation_error(tokenizer, limits, cache_info):
    def script(req):
        return [RequestOutput(req.request_id, finished=True, error="CUDA out of memory")]

    infer, _ = make_infer(tokenizer, limits, cache_info, script)
    with pytest.raises(GenerationError) as info:
        await infer.generate("Hello", P())
    assert info.value.message == "Request failed during generation: CUDA out of memory"
    assert info.value.status_code == 424


async def test_best_of_failure_cancels_the_other_candidate(tokenizer, limits, cache_info):
    calls = []

    def script(req):
        calls.append(req.request_id)
        if len(calls) == 1:
            return [RequestOutput(req.request_id, finished=True, error="boom")]
        return token_deltas(req, list(range(70, 90)))

    infer, engine = make_infer(tokenizer, limits, cache_info, script, delay_s=0.01)
    with pytest.raises(GenerationError):
        await infer.generate("Hello", P(best_of=2, do_sample=True))
    await asyncio.sleep(0.05)
    assert engine.aborted == [calls[1]]
    assert infer.num_in_flight == 0


async def test_stream_without_final_delta_is_incomplete(tokenizer, limits, cache_info):
    infer, _ = make_infer(
        tokenizer, limits, cache_info, lambda req: token_deltas(req, [70, 71], finish=None)
    )
    with pytest.raises(IncompleteGenerationError) as info:
        await infer.generate("Hello", P())
    assert info.value.message == "Incomplete generation"
    with pytest.raises(IncompleteGenerationError) as info:
        async for _ in infer.generate_stream("Hello", P()):
            pass
    assert info.value.error_type == "incomplete_generation_stream"


async def test_stream_events(tokenizer, limits, cache_info, eos_script):
    infer, _ = make_infer(tokenizer, limits, cache_info, eos_script)
    events = [e async for e in infer.generate_stream("Hello", P(details=True, top_n_tokens=2))]
    assert [e.index for e in events] == list(range(1, len(events) + 1))
    assert all(e.generated_text is None and e.details is None for e in events[:-1])
    last = events[-1]
    assert last.generated_text == ANSWER and last.token.special
    assert last.details.finish_reason is FinishReason.EOS_TOKEN
    assert last.details.generated_tokens == len(events) and last.details.seed is None
    assert last.details.input_length == len(tokenizer.encode("Hello").ids)
    assert "".join(e.text_delta for e in events) == ANSWER
    assert all(len(e.top_tokens) == 2 for e in events)


async def test_stream_text_delta_holds_back_stop_prefix(tokenizer, limits, cache_info):
    ids = answer_ids(tokenizer, " alpha beta gamma")
    infer, engine = make_infer(tokenizer, limits, cache_info, lambda r: token_deltas(r, ids))
    events = [e async for e in infer.generate_stream("Hello", P(stop=["beta!"]))]
    deltas = [e.text_delta for e in events]
    assert "".join(deltas) == " alpha beta gamma" == events[-1].generated_text
    assert events[-1].details.finish_reason is FinishReason.LENGTH
    assert any(d == "" for d in deltas)  # " beta" was held while it could become "beta!"
    assert not engine.aborted


async def test_stream_rejects_before_any_event(tokenizer, limits, cache_info, eos_script):
    infer, engine = make_infer(tokenizer, limits, cache_info, eos_script)
    stream = infer.generate_stream("Hello", P(best_of=2, do_sample=True))
    with pytest.raises(ValidationError, match="not supported when streaming tokens"):
        await stream.__anext__()
    with pytest.raises(ValidationError, match="`temperature` must be strictly positive"):
        await infer.generate_stream("Hello", P(temperature=0.0)).__anext__()
    assert engine.requests == [] and infer.num_in_flight == 0


async def test_disconnect_aborts_engine_request_and_frees_permit(tokenizer, limits, cache_info):
    ids = list(range(70, 100))
    infer, engine = make_infer(tokenizer, limits, cache_info, lambda r: token_deltas(r, ids))
    stream = infer.generate_stream("Hello", P())
    first = await stream.__anext__()
    assert first.index == 1 and infer.num_in_flight == 1
    await stream.aclose()
    assert engine.aborted == [engine.requests[0].request_id]
    assert infer.num_in_flight == 0


async def test_cancelled_generate_aborts(tokenizer, limits, cache_info):
    ids = list(range(70, 100))
    infer, engine = make_infer(
        tokenizer, limits, cache_info, lambda r: token_deltas(r, ids), delay_s=0.01
    )
    task = asyncio.ensure_future(infer.generate("Hello", P()))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert engine.aborted == [engine.requests[0].request_id]
    assert infer.num_in_flight == 0


async def test_overloaded_is_immediate(tokenizer, cache_info):
    limits = LimitsConfig(max_input_tokens=40, max_total_tokens=64, max_concurrent_requests=2)
    ids = list(range(70, 80))
    infer, _ = make_infer(tokenizer, limits, cache_info, lambda r: token_deltas(r, ids))
    streams = [infer.generate_stream("Hello", P()) for _ in range(2)]
    for s in streams:
        await s.__anext__()
    with pytest.raises(OverloadedError) as info:
        await infer.generate("Hello", P())
    assert info.value.status_code == 429 and info.value.message == "Model is overloaded"
    with pytest.raises(OverloadedError):
        await infer.generate("Hello", P(best_of=2, do_sample=True))
    for s in streams:
        await s.aclose()
    assert (await infer.generate("Hello", P())).generated_tokens == len(ids)


async def test_tokenize_spans(tokenizer, limits, cache_info, eos_script):
    infer, _ = make_infer(tokenizer, limits, cache_info, eos_script)
    spans = await infer.tokenize("Hello café")
    assert spans[0].id == tokenizer.bos_token_id and (spans[0].start, spans[0].stop) == (0, 0)
    assert [s.id for s in spans] == tokenizer.encode("Hello café").ids
    assert spans[1].text == "He" and (spans[1].start, spans[1].stop) == (0, 2)
    no_special = await infer.tokenize("Hello", add_special_tokens=False)
    assert no_special[0].id != tokenizer.bos_token_id


async def test_stream_finish_without_a_token_is_incomplete(tokenizer, limits, cache_info):
    def script(req):
        deltas = token_deltas(req, [70, 71], finish=None)
        return deltas + [
            RequestOutput(req.request_id, finished=True, finish_reason=FinishReason.LENGTH)
        ]

    infer, _ = make_infer(tokenizer, limits, cache_info, script)
    assert (await infer.generate("Hello", P())).generated_tokens == 2
    with pytest.raises(IncompleteGenerationError):
        _ = [e async for e in infer.generate_stream("Hello", P())]
