"""A scripted EngineClient: each request gets the deltas a script returns; records aborts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from pytgi.engine.client import EngineStats
from pytgi.messages.outputs import RequestOutput, SampledToken
from pytgi.messages.request import EngineRequest, FinishReason

Script = Callable[[EngineRequest], list[RequestOutput]]


def token_deltas(
    request: EngineRequest,
    ids: list[int],
    finish: FinishReason | None = FinishReason.LENGTH,
    logprob: float = -0.5,
) -> list[RequestOutput]:
    """One delta per token; the last one finished with `finish` (None: the stream just ends)."""
    n = request.sampling.top_n_tokens
    deltas = []
    for k, token_id in enumerate(ids):
        top_ids = [token_id] + [t for t in (65, 66, 67, 68, 69) if t != token_id][: max(n - 1, 0)]
        token = SampledToken(token_id, logprob, top_ids[:n], [logprob - i for i in range(n)])
        last = k == len(ids) - 1 and finish is not None
        deltas.append(
            RequestOutput(
                request.request_id,
                new_tokens=[token],
                finished=last,
                finish_reason=finish if last else None,
                num_prompt_tokens=len(request.prompt_ids),
                queue_time_s=0.01 if k == 0 else 0.0,
            )
        )
    return deltas


class FakeEngine:
    def __init__(self, script: Script, *, delay_s: float = 0.0):
        self.script = script
        self.delay_s = delay_s
        self.requests: list[EngineRequest] = []
        self.aborted: list[str] = []
        self.completed: list[str] = []
        self.cache_info = None

    def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        self.requests.append(request)
        return self._stream(request)

    async def _stream(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        finished = False
        try:
            for delta in self.script(request):
                await asyncio.sleep(self.delay_s)
                finished = delta.finished
                yield delta
        finally:
            (self.completed if finished else self.aborted).append(request.request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def stats(self) -> EngineStats:
        return EngineStats()

    @property
    def is_alive(self) -> bool:
        return True

    async def shutdown(self) -> None:
        return None


def constrained_script(tokenizer, free_ids: list[int]) -> Script:
    """A random-weight model behind the real grammar engine: a request without a grammar gets
    `free_ids` (then EOS); one with a grammar is decoded greedily over random logits seeded by
    its sampling seed, under `pytgi.grammar`'s token masks, until EOS or `max_new_tokens`. A
    grammar that fails to compile ends the request with the engine's error."""
    import numpy as np

    from pytgi.grammar import BitmaskFiller, GrammarCompiler, GrammarError, GrammarVocab

    vocab = GrammarVocab.from_tokenizer(tokenizer)
    compiler = GrammarCompiler(vocab)
    filler = BitmaskFiller(vocab.vocab_size, vocab.eos_token_ids)
    eos = list(vocab.eos_token_ids)

    def script(request: EngineRequest) -> list[RequestOutput]:
        limit = request.stopping.max_new_tokens
        spec = request.sampling.grammar
        if spec is None:
            ids = (free_ids + eos)[:limit]
            return token_deltas(request, ids, _finish(ids, eos))
        try:
            matcher = compiler.compile(spec).matcher()
        except GrammarError as exc:
            return [RequestOutput(request.request_id, finished=True, error=str(exc))]
        rng = np.random.default_rng(request.sampling.seed or 0)
        bitmask, ids = filler.allocate(1), []
        while len(ids) < limit and not (ids and ids[-1] in eos):
            filler.fill([(matcher, 0)], bitmask)
            bits = np.unpackbits(bitmask.view(np.uint8), bitorder="little")[: vocab.vocab_size]
            logits = np.where(bits == 1, rng.standard_normal(vocab.vocab_size), -np.inf)
            token_id = int(logits.argmax())
            assert matcher.accept_token(token_id), matcher.error
            ids.append(token_id)
        return token_deltas(request, ids, _finish(ids, eos))

    return script


def _finish(ids: list[int], eos: list[int]) -> FinishReason:
    return FinishReason.EOS_TOKEN if ids and ids[-1] in eos else FinishReason.LENGTH
