"""Batched logits processors: penalties and warpers, as pure functions.

The penalties work on the logits of the tokens each row has seen, one entry per distinct (row,
token) [U], so their cost follows the history length, not the vocabulary. The warpers take
`scores` [R, V] float32 and one parameter per row [R] and return new scores; rows whose parameter
is neutral (temperature 1.0) come back unchanged. The semantics match TGI
(`utils/logits_process.py`) and transformers' `*LogitsWarper`s; filtered tokens get -inf. The
Sampler picks the rows each processor applies to (see `SamplingMetadata`).
"""

from __future__ import annotations

import torch

FILTER_VALUE = -float("inf")
TOP_P_CANDIDATES = 1024  # tokens top-p looks at before falling back to a full sort


def apply_repetition_penalty(logits: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """CTRL/HF repetition penalty: logit<0 → ×p, else ÷p.

    Applied to the logits of the tokens a row has seen (prompt + generated), gathered as one entry
    per distinct (row, token): logits, penalty [U] → [U]. Unlike TGI's batch tensor (right-padded
    with id 0), only ids that really occur are penalised.
    """
    return torch.where(logits < 0, logits * penalty, logits / penalty)  # [U]


def apply_frequency_penalty(
    logits: torch.Tensor, counts: torch.Tensor, penalty: torch.Tensor, seq_lens: torch.Tensor
) -> torch.Tensor:
    """TGI's frequency penalty: `logit -= p * count(token) / L`, per distinct (row, token) [U].

    TGI divides by the padded batch length; we divide by the request's own sequence length
    (prompt + generated so far), so a request's scores do not depend on its batch neighbours.
    """
    return logits - (counts / seq_lens) * penalty  # [U]


def apply_temperature(scores: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    return scores / temperature.unsqueeze(1)  # [R, V]


def apply_top_k(scores: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Keep tokens whose score is >= the row's k-th largest (ties at the k-th are kept; k >= 1)."""
    vocab_size = scores.shape[-1]
    k = top_k.clamp(min=1, max=vocab_size)  # [R]
    max_k = int(k.max())
    top_values = torch.topk(scores, max_k, dim=-1).values  # [R, max_k], descending
    kth = top_values.gather(1, (k - 1).unsqueeze(1))  # [R, 1]
    return scores.masked_fill(scores < kth, FILTER_VALUE)  # [R, V]


def apply_top_p(scores: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Nucleus filtering: drop the tokens whose ascending cumulative probability is <= 1 - p.

    The most likely token is always kept. Rows whose nucleus lies within their `TOP_P_CANDIDATES`
    best tokens (almost always, and always after top-k) are filtered on those candidates only: a
    top-k selection instead of a sort of the whole vocabulary. The other rows are sorted in full.
    """
    num_candidates = min(TOP_P_CANDIDATES, scores.shape[-1])
    values, ids = torch.topk(scores, num_candidates, dim=-1)  # [R, C], descending
    log_total = torch.logsumexp(scores, dim=-1, keepdim=True)  # [R, 1]
    probs = (values - log_total).exp()  # [R, C]
    mass = probs.sum(dim=-1)  # [R]
    out = top_p_on_candidates(scores, values, ids, probs, 1 - mass, top_p)  # [R, V]
    uncovered = torch.nonzero(mass < top_p).flatten()  # [U] rows whose nucleus may reach further
    if uncovered.numel() > 0:
        out[uncovered] = top_p_sorted(scores[uncovered], top_p[uncovered])  # [U, V]
    return out


def top_p_on_candidates(
    scores: torch.Tensor,
    values: torch.Tensor,
    ids: torch.Tensor,
    probs: torch.Tensor,
    tail_mass: torch.Tensor,
    top_p: torch.Tensor,
) -> torch.Tensor:
    """Top-p over the best candidates (descending `values`/`ids`/`probs` [R, C]); the tokens outside
    them (probability `tail_mass` [R]) come first in ascending order, so they are all dropped."""
    cum_ascending = tail_mass.unsqueeze(1) + probs.flip(-1).cumsum(dim=-1)  # [R, C]
    remove = (cum_ascending <= (1 - top_p).unsqueeze(1)).flip(-1)  # [R, C], descending order
    remove[:, 0] = False
    kept = values.masked_fill(remove, FILTER_VALUE)  # [R, C]
    return torch.full_like(scores, FILTER_VALUE).scatter_(1, ids, kept)  # [R, V]


def top_p_sorted(scores: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Top-p with a full ascending sort (transformers' TopPLogitsWarper, per-row p)."""
    sorted_scores, sorted_ids = torch.sort(scores, dim=-1, descending=False)  # [R, V]
    cum_probs = sorted_scores.softmax(dim=-1).cumsum(dim=-1)  # [R, V]
    sorted_remove = cum_probs <= (1 - top_p).unsqueeze(1)  # [R, V]
    sorted_remove[:, -1] = False
    remove = sorted_remove.scatter(1, sorted_ids, sorted_remove)  # [R, V]
    return scores.masked_fill(remove, FILTER_VALUE)


def apply_typical_p(scores: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """Locally typical filtering: keep the tokens whose surprisal is closest to the entropy.

    Tokens are ranked by |surprisal - entropy|; the smallest set whose probability mass reaches
    `mass` is kept (at least one token).
    """
    logprobs = torch.log_softmax(scores, dim=-1)  # [R, V]
    entropy = -(logprobs * logprobs.exp()).nansum(-1, keepdim=True)  # [R, 1]
    distance = (-logprobs - entropy).abs()  # [R, V]
    sorted_distance, sorted_ids = torch.sort(distance, dim=-1, descending=False)  # [R, V]
    cum_probs = scores.gather(-1, sorted_ids).softmax(dim=-1).cumsum(dim=-1)  # [R, V]
    last = (cum_probs < mass.unsqueeze(1)).sum(dim=1).clamp(max=scores.shape[-1] - 1)  # [R]
    cutoff = sorted_distance.gather(1, last.unsqueeze(1))  # [R, 1]
    sorted_remove = sorted_distance > cutoff  # [R, V]
    sorted_remove[:, 0] = False
    remove = sorted_remove.scatter(1, sorted_ids, sorted_remove)  # [R, V]
    return scores.masked_fill(remove, FILTER_VALUE)
