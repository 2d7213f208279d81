"""Sampler: one step's logits → one `SampledToken` per row, as TGI chooses tokens
(TGI_COMPATIBILITY.md §13).

Order: watermark → repetition penalty → frequency penalty → grammar → temperature → top-k →
top-p → typical-p → greedy argmax or seeded sampling. Each stage is a field of `SamplingMetadata`
(None when no row needs it) and a step of `Sampler.process` at its place in that order: a new
processor adds both. The reported logprob is log_softmax of the processed scores (as TGI), and
top-n alternatives come from the same logprobs. Only the processors some row needs run; an
all-greedy batch without penalties, watermark or grammar takes a fast path (argmax + one
log_softmax). The grammar stage sets the tokens a row's grammar forbids to -inf (its mask comes
from the engine, rank 0 only), so greedy, seeded sampling and the logprobs all see the
constrained distribution.

Seeded sampling is batch-invariant and survives preemption: the request's k-th generated token is
drawn by inverse CDF with one uniform number `u(seed, k)` (the k-th output of a splitmix64 stream
seeded with `seed`), so the draw depends on nothing else; the random number does not even depend
on the device. TGI's exponential race needs an Exp(1) draw per vocabulary entry, which on CPU costs
tens of ns per entry and row (milliseconds per row at a 128k vocabulary); one uniform plus a
float64 cumsum samples the same distribution several times faster.
"""

from __future__ import annotations

import torch

from pytgi.grammar.bitmask import apply_token_bitmask_
from pytgi.messages.outputs import SampledToken
from pytgi.sampling.logprobs import compute_top_n
from pytgi.sampling.metadata import GrammarMasks, PenaltyInputs, SampleRow, SamplingMetadata
from pytgi.sampling.processors import (
    apply_frequency_penalty,
    apply_repetition_penalty,
    apply_temperature,
    apply_top_k,
    apply_top_p,
    apply_typical_p,
)
from pytgi.sampling.watermark import Watermark

MASK64 = (1 << 64) - 1


class Sampler:
    """Rank 0's token chooser. Stateless across steps except the watermark's green-list cache."""

    def __init__(self, vocab_size: int, watermark_gamma: float = 0.5, watermark_delta: float = 2.0):
        self.vocab_size = vocab_size
        self.watermark = Watermark(vocab_size, watermark_gamma, watermark_delta)

    def __call__(self, logits: torch.Tensor, rows: list[SampleRow]) -> list[SampledToken]:
        """Choose a token for every row.

        logits: [num_rows, vocab] float32, row i belongs to rows[i]. Returns one SampledToken per
        row: token_id, logprob of the chosen token, and the top `top_n_tokens` alternatives (ids +
        logprobs, best first; ties at the n-th value all returned as TGI does). The input logits
        are not modified.
        """
        if logits.dim() != 2 or logits.shape != (len(rows), self.vocab_size):
            raise ValueError(
                f"logits {tuple(logits.shape)} do not match "
                f"[{len(rows)} rows, vocab {self.vocab_size}]"
            )
        if not rows:
            return []
        logits = logits.float()  # [B, V]
        md = SamplingMetadata.from_rows(rows, self.vocab_size, logits.device)
        if md.all_greedy and not (md.any_penalty or md.any_watermark or md.any_grammar):
            token_ids = logits.argmax(dim=-1)  # [B]
            logprobs = torch.log_softmax(logits, dim=-1)  # [B, V]
        else:
            scores = self.process(logits, md)  # [B, V]
            logprobs = torch.log_softmax(scores, dim=-1)  # [B, V]
            token_ids = choose_tokens(scores, logprobs, md)  # [B]
        return build_outputs(token_ids, logprobs, md)

    def process(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        """Apply this batch's logits processors and warpers, in TGI's order: [B, V] → [B, V]."""
        # rows are rewritten in place below; the caller's logits are kept
        scores = logits.clone(memory_format=torch.contiguous_format)  # [B, V]
        if md.any_watermark:
            scores = self.apply_watermark(scores, md)
        if md.penalties is not None:
            scores = apply_penalties(scores, md.penalties)
        if md.grammar is not None:
            scores = apply_grammar(scores, md.grammar)
        if md.temperature is not None:
            scores = apply_temperature(scores, md.temperature)
        for params, warp in (
            (md.top_k, apply_top_k),
            (md.top_p, apply_top_p),
            (md.typical_p, apply_typical_p),
        ):
            if params is not None:
                scores = params.apply(scores, warp)
        return scores

    def apply_watermark(self, scores: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        rows, prev_tokens = md.watermark_rows, md.watermark_prev_tokens
        if len(rows) == md.num_rows:
            return self.watermark(scores, prev_tokens)  # [B, V]
        scores[rows] = self.watermark(scores[rows], prev_tokens)  # [W, V]
        return scores


def apply_penalties(scores: torch.Tensor, penalties: PenaltyInputs) -> torch.Tensor:
    """Repetition then frequency penalty, in place at the (row, token) pairs of the histories."""
    flat_scores = scores.view(-1)  # [B * V], a view: scores is the Sampler's own contiguous copy
    logits = flat_scores[penalties.token_index]  # [U]
    if penalties.repetition_penalty is not None:
        logits = apply_repetition_penalty(logits, penalties.repetition_penalty)
    if penalties.frequency_penalty is not None:
        logits = apply_frequency_penalty(
            logits, penalties.counts, penalties.frequency_penalty, penalties.seq_lens
        )
    flat_scores[penalties.token_index] = logits  # pairs are distinct: a plain scatter
    return scores


def apply_grammar(scores: torch.Tensor, grammar: GrammarMasks) -> torch.Tensor:
    """-inf at the tokens each grammar row's mask forbids, in place: [B, V] → [B, V]."""
    return apply_token_bitmask_(scores, grammar.bitmask, grammar.rows)


def choose_tokens(
    scores: torch.Tensor, logprobs: torch.Tensor, md: SamplingMetadata
) -> torch.Tensor:
    """Greedy argmax, or for sampling rows an inverse-CDF draw from exp(logprobs): [B] int64."""
    if not md.sample_rows:
        return scores.argmax(dim=-1)  # [B]
    all_sample = len(md.sample_rows) == md.num_rows
    probs = logprobs.exp() if all_sample else logprobs[md.sample_rows].exp()  # [S, V]
    uniforms = list(map(uniform, md.sample_seeds, md.sample_steps))  # one draw per sample row
    sampled = sample_from_probs(probs, torch.tensor(uniforms, dtype=torch.float64))  # [S]
    if all_sample:
        return sampled
    token_ids = scores.argmax(dim=-1)  # [B]
    token_ids[md.sample_rows] = sampled
    return token_ids


def sample_from_probs(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse CDF: row i picks the first token whose cumulative probability exceeds u_i * total.

    probs [S, V] (rows need not sum exactly to 1), uniforms [S] float64 in [0, 1) → [S] int64. A
    zero-probability token is never picked (its cumulative value equals its predecessor's). The
    cumsum runs in float64 so that tail tokens keep their probability even at large vocabularies.
    """
    cdf = probs.double().cumsum(dim=-1)  # [S, V]
    total = cdf[:, -1:]  # [S, 1]
    target = uniforms.to(cdf.device).unsqueeze(1) * total  # [S, 1]
    target = torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))  # < total
    return torch.searchsorted(cdf, target, right=True).squeeze(1)  # [S]


def uniform(seed: int, step: int) -> float:
    """The `step`-th output of a splitmix64 stream seeded with `seed`, as a double in [0, 1)."""
    z = (seed + (step + 1) * 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    z ^= z >> 31
    return (z >> 11) * 2.0**-53


def build_outputs(
    token_ids: torch.Tensor, logprobs: torch.Tensor, md: SamplingMetadata
) -> list[SampledToken]:
    chosen = logprobs.gather(1, token_ids.unsqueeze(1)).squeeze(1)  # [B]
    top_ids, top_logprobs = compute_top_n(logprobs, md.top_n)
    return [
        SampledToken(token_id=t, logprob=lp, top_ids=ids, top_logprobs=lps)
        for t, lp, ids, lps in zip(
            token_ids.tolist(), chosen.tolist(), top_ids, top_logprobs, strict=True
        )
    ]
