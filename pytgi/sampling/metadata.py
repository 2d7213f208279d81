"""Per-step sampling inputs, rebuilt from the step's `SampleRow`s at every step.

`SamplingMetadata.from_rows` reads each row's `SamplingParams` and token history once and builds
only the tensors some row needs: a processor whose parameter is neutral for every row is `None` and
costs nothing. Parameters used by a subset of rows carry the row indices (`RowParams`), so filters
like top-p sort only those rows. Nothing here is kept between steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from pytgi.messages.sampling_params import SamplingParams

RowFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class SampleRow:
    """One logits row to choose a token for: a request at the end of its history, or (verifying
    speculation) at one of its draft tokens."""

    request_id: str
    sampling: SamplingParams
    history: list[int]  # the request's tokens so far (prompt + generated); not copied
    drafts: list[int]  # draft tokens between the history and this row
    output_index: int  # which generated token this row chooses (seeds its draw)
    # the tokens its grammar allows here: int32 [ceil(V / 32)], bit t % 32 of word t // 32
    grammar_mask: np.ndarray | None = None

    @property
    def last_token(self) -> int:
        return self.drafts[-1] if self.drafts else self.history[-1]

    @property
    def num_tokens(self) -> int:
        return len(self.history) + len(self.drafts)


@dataclass(frozen=True)
class RowParams:
    """One parameter for the rows that use it."""

    rows: torch.Tensor | None  # [R] int64 batch rows; None = every row of the batch
    values: torch.Tensor  # [R]

    def apply(self, scores: torch.Tensor, fn: RowFn) -> torch.Tensor:
        """scores [B, V] → scores [B, V] with `fn(scores[rows], values)` written to those rows."""
        if self.rows is None:
            return fn(scores, self.values)
        scores[self.rows] = fn(scores[self.rows], self.values)  # [R, V] into [B, V]
        return scores


@dataclass(frozen=True)
class PenaltyInputs:
    """The distinct (row, token) pairs in the histories (prompt + generated) of penalised rows."""

    token_index: torch.Tensor  # [U] int64: batch_row * V + token_id, each pair once
    counts: torch.Tensor  # [U] float32: occurrences of the token in the row's history
    seq_lens: torch.Tensor  # [U] float32: the row's prompt + generated tokens
    repetition_penalty: torch.Tensor | None  # [U] the row's penalty; None when 1.0 for every row
    frequency_penalty: torch.Tensor | None  # [U] the row's penalty; None when 0.0 for every row


@dataclass(frozen=True)
class GrammarMasks:
    """The token masks of the rows that have a grammar."""

    rows: list[int] | None  # batch rows; None = every row
    bitmask: np.ndarray  # int32 [G, ceil(V / 32)], row i for rows[i]


@dataclass(frozen=True)
class SamplingMetadata:
    num_rows: int
    top_n: list[int]  # alternatives to report per row
    sample_rows: list[int]  # rows that sample; the others take the argmax
    sample_seeds: list[int]  # per sample row
    sample_steps: list[int]  # per sample row: index of the token being generated
    watermark_rows: list[int]
    watermark_prev_tokens: list[int]  # per watermark row: the last token of its history
    penalties: PenaltyInputs | None
    grammar: GrammarMasks | None
    temperature: torch.Tensor | None  # [B]
    top_k: RowParams | None
    top_p: RowParams | None
    typical_p: RowParams | None

    @property
    def any_penalty(self) -> bool:
        return self.penalties is not None

    @property
    def any_watermark(self) -> bool:
        return bool(self.watermark_rows)

    @property
    def any_grammar(self) -> bool:
        return self.grammar is not None

    @property
    def any_warper(self) -> bool:
        warpers = (self.temperature, self.top_k, self.top_p, self.typical_p)
        return any(w is not None for w in warpers)

    @property
    def all_greedy(self) -> bool:
        return not self.sample_rows

    @property
    def max_top_n(self) -> int:
        return max(self.top_n, default=0)

    @classmethod
    def from_rows(
        cls, rows: list[SampleRow], vocab_size: int, device: torch.device | str
    ) -> SamplingMetadata:
        params = [r.sampling for r in rows]
        sample_rows = [i for i, p in enumerate(params) if p.do_sample]
        watermark_rows = [i for i, p in enumerate(params) if p.watermark]
        return cls(
            num_rows=len(params),
            top_n=[p.top_n_tokens for p in params],
            sample_rows=sample_rows,
            # the router always sets a seed for a sampling request; 0 stands in if one is missing
            sample_seeds=[params[i].seed or 0 for i in sample_rows],
            sample_steps=[rows[i].output_index for i in sample_rows],
            watermark_rows=watermark_rows,
            watermark_prev_tokens=[rows[i].last_token for i in watermark_rows],
            penalties=build_penalties(rows, vocab_size, device),
            grammar=build_grammar_masks(rows),
            temperature=build_temperature(params, device),
            top_k=build_row_params(params, "top_k", 0, torch.int64, device),
            top_p=build_row_params(params, "top_p", 1.0, torch.float32, device),
            typical_p=build_row_params(params, "typical_p", 1.0, torch.float32, device),
        )


def build_grammar_masks(rows: list[SampleRow]) -> GrammarMasks | None:
    picked = [i for i, r in enumerate(rows) if r.grammar_mask is not None]
    if not picked:
        return None
    bitmask = np.stack([rows[i].grammar_mask for i in picked])  # [G, W]
    return GrammarMasks(rows=None if len(picked) == len(rows) else picked, bitmask=bitmask)


def build_temperature(params: list[SamplingParams], device) -> torch.Tensor | None:
    if all(p.temperature == 1.0 for p in params):
        return None
    return torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)


def build_row_params(
    params: list[SamplingParams], name: str, neutral: float, dtype: torch.dtype, device
) -> RowParams | None:
    """The rows whose `name` differs from `neutral`, with their values (None if there are none)."""
    rows = [i for i, p in enumerate(params) if getattr(p, name) != neutral]
    if not rows:
        return None
    values = torch.tensor([getattr(params[i], name) for i in rows], dtype=dtype, device=device)
    return RowParams(rows=index_tensor(rows, len(params), device), values=values)


def build_penalties(rows: list[SampleRow], vocab_size: int, device) -> PenaltyInputs | None:
    """Count each row's history tokens on the CPU (no device sync), then move the pairs over."""
    picked = [(i, r) for i, r in enumerate(rows) if has_penalty(r.sampling)]
    if not picked:
        return None
    histories = [chain(r.history, r.drafts) for _, r in picked]
    token_ids = torch.tensor(list(chain.from_iterable(histories)), dtype=torch.int64)  # [N]
    lens = torch.tensor([r.num_tokens for _, r in picked])  # [P]
    slots = torch.arange(len(picked)).repeat_interleave(lens)  # [N] row within P
    pairs, counts = torch.unique(slots * vocab_size + token_ids, return_counts=True)  # [U]
    slot_of_pair = pairs // vocab_size  # [U]
    batch_rows = torch.tensor([i for i, _ in picked])  # [P]
    rep = [r.sampling.repetition_penalty for _, r in picked]
    freq = [r.sampling.frequency_penalty for _, r in picked]
    return PenaltyInputs(
        token_index=(batch_rows[slot_of_pair] * vocab_size + pairs % vocab_size).to(device),
        counts=counts.to(device=device, dtype=torch.float32),
        seq_lens=lens[slot_of_pair].to(device=device, dtype=torch.float32),
        repetition_penalty=per_pair(rep, 1.0, slot_of_pair, device),
        frequency_penalty=per_pair(freq, 0.0, slot_of_pair, device),
    )


def has_penalty(p: SamplingParams) -> bool:
    return p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0


def per_pair(
    values: list[float], neutral: float, slot_of_pair: torch.Tensor, device
) -> torch.Tensor | None:
    """A per-row parameter spread over its (row, token) pairs [U]; None if neutral everywhere."""
    if all(v == neutral for v in values):
        return None
    return torch.tensor(values, dtype=torch.float32)[slot_of_pair].to(device)  # [U]


def index_tensor(rows: list[int], num_rows: int, device) -> torch.Tensor | None:
    """Row indices as a tensor, or None when they are all the rows (no gather/scatter needed)."""
    if len(rows) == num_rows:
        return None
    return torch.tensor(rows, dtype=torch.int64, device=device)
