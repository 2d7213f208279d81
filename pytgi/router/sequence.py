"""`SequenceBuilder`: turns one request's `RequestOutput` deltas into TGI tokens and text.

Per generated token it decodes the token text (incremental, special tokens kept, as TGI's
`Token.text`), the top-n alternatives, and a text delta for OpenAI-style consumers (special tokens
skipped, held back while it could be the start of a stop string). It notices a stop string and then
marks the sequence finished with `stop_sequence`; the caller aborts the engine request. Used by
both `Infer.generate` and `Infer.generate_stream`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pytgi.messages.outputs import RequestOutput, SampledToken
from pytgi.messages.request import FinishReason
from pytgi.router import request_metrics
from pytgi.router.outputs import BestOfSequence, PrefillToken, Token
from pytgi.router.stop import StopSequenceMatcher
from pytgi.router.validation import ValidRequest
from pytgi.tokenizer.detokenizer import IncrementalDetokenizer
from pytgi.tokenizer.tokenizer import Tokenizer


@dataclass
class TokenStep:
    """One generated token as the client sees it."""

    token: Token
    top_tokens: list[Token]
    text_delta: str


class SequenceBuilder:
    def __init__(self, tokenizer: Tokenizer, request: ValidRequest, seed: int | None):
        self.tokenizer = tokenizer
        self.request = request
        self.seed = seed
        self._detok = IncrementalDetokenizer(tokenizer, request.prompt_ids)
        self._stops = StopSequenceMatcher(request.stop_sequences)
        self.token_ids: list[int] = []
        self.tokens: list[Token] = []
        self.top_tokens: list[list[Token]] = []
        self.prefill: list[PrefillToken] = []
        self.finish_reason: FinishReason | None = None
        self.queue_s = 0.0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def add(self, delta: RequestOutput) -> list[TokenStep]:
        """Consume a delta; returns its tokens (those after a matched stop string are dropped)."""
        if delta.prefill_logprobs is not None and self.request.sampling.prefill_logprobs:
            self.prefill = self._prefill_tokens(delta.prefill_logprobs)
        if delta.queue_time_s:
            self.queue_s = delta.queue_time_s
        if len(delta.new_tokens) > 1:
            request_metrics.record_extra_tokens(len(delta.new_tokens))
        steps = []
        for out in delta.new_tokens:
            steps.append(self._add_token(out))
            if self.finished:
                return steps
        if delta.finished:
            self.finish_reason = delta.finish_reason
        return steps

    def tail_text(self) -> str:
        """Text still held back when the sequence ends (incomplete char, possible stop prefix)."""
        return self._stops.flush() + self._detok.flush()

    def generated_text(self) -> str:
        """TGI's final text: all generated ids decoded with special tokens skipped."""
        return self.tokenizer.decode(self.token_ids, skip_special_tokens=True)

    def mean_logprob(self) -> float:
        """TGI's best_of criterion: mean logprob of the generated tokens."""
        if not self.tokens:
            return -math.inf
        return sum(t.logprob for t in self.tokens) / len(self.tokens)

    def best_of_sequence(self, generated_text: str) -> BestOfSequence:
        assert self.finish_reason is not None
        return BestOfSequence(
            generated_text=generated_text,
            finish_reason=self.finish_reason,
            generated_tokens=len(self.tokens),
            seed=self.seed,
            prefill=self.prefill,
            tokens=self.tokens,
            top_tokens=self.top_tokens,
        )

    def _add_token(self, out: SampledToken) -> TokenStep:
        special = self.tokenizer.is_special(out.token_id)
        text = self._detok.add(out.token_id)
        token = Token(out.token_id, text, out.logprob, special)
        top = [self._token(i, lp) for i, lp in zip(out.top_ids, out.top_logprobs, strict=False)]
        self.token_ids.append(out.token_id)
        self.tokens.append(token)
        if self.request.sampling.top_n_tokens:
            self.top_tokens.append(top)
        delta, matched = self._match_stop(text, special)
        if matched:
            self.finish_reason = FinishReason.STOP_SEQUENCE
        return TokenStep(token, top, delta)

    def _match_stop(self, text: str, special: bool) -> tuple[str, bool]:
        if special:
            # a special token's text joins no stop string across tokens, but may be one itself
            return "", any(stop in text for stop in self._stops.stop_sequences)
        released, match = self._stops.feed(text)
        if match is not None:
            return released + match.trailing, True
        return released, False

    def _token(self, token_id: int, logprob: float) -> Token:
        text = self.tokenizer.decode([token_id])
        return Token(token_id, text, logprob, self.tokenizer.is_special(token_id))

    def _prefill_tokens(self, logprobs: list[float]) -> list[PrefillToken]:
        ids = self.request.prompt_ids
        return [
            PrefillToken(i, self.tokenizer.decode([i]), None if math.isnan(lp) else lp)
            for i, lp in zip(ids, logprobs, strict=False)
        ]
