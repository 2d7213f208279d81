"""Logprob reporting: the top-n alternatives of each sampled token, and prompt logprobs."""

from __future__ import annotations

import torch

PREFILL_CHUNK_ROWS = 512  # bounds the [chunk, V] temporaries of long prompts


def compute_top_n(
    logprobs: torch.Tensor, top_n: list[int]
) -> tuple[list[list[int]], list[list[float]]]:
    """The best `top_n[i]` ids and logprobs of each row of `logprobs` [B, V], best first.

    As TGI: every token tied with the n-th best value is returned too (a row may get more than
    n), and tokens at -inf are never returned (a row may get fewer than n). Rows with n == 0 get
    [].
    """
    num_rows, vocab_size = logprobs.shape
    top_ids: list[list[int]] = [[] for _ in range(num_rows)]
    top_logprobs: list[list[float]] = [[] for _ in range(num_rows)]
    rows = [i for i, n in enumerate(top_n) if n > 0]
    if not rows:
        return top_ids, top_logprobs
    picked = logprobs if len(rows) == num_rows else logprobs[rows]  # [R, V]
    row_n = [min(top_n[i], vocab_size) for i in rows]
    n = torch.tensor(row_n, device=logprobs.device)  # [R]
    max_n = max(row_n)
    best = torch.topk(picked, max_n, dim=-1)  # [R, max_n], descending
    nth = best.values.gather(1, (n - 1).unsqueeze(1))  # [R, 1]
    nth = nth.clamp(min=torch.finfo(logprobs.dtype).min)  # -inf tokens never qualify
    num_kept = (picked >= nth).sum(dim=-1)  # [R]
    max_kept = int(num_kept.max())
    kept = best if max_kept <= max_n else torch.topk(picked, max_kept, dim=-1)  # ties past n
    for row, count, ids, values in zip(
        rows, num_kept.tolist(), kept.indices.tolist(), kept.values.tolist(), strict=True
    ):
        top_ids[row] = ids[:count]
        top_logprobs[row] = values[:count]
    return top_ids, top_logprobs


def compute_prefill_logprobs(logits: torch.Tensor, target_ids: torch.Tensor) -> torch.Tensor:
    """Raw logprob of each next token: `log_softmax(logits[t])[target_ids[t]]`.

    logits [T, V] (position t predicts target t), target_ids [T] (any device, integer) → [T]
    float32 on the logits' device. No processor is applied: decoder_input_details reports the
    model's own distribution.
    """
    out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)  # [T]
    target_ids = target_ids.to(device=logits.device, dtype=torch.int64)  # [T]
    for start in range(0, logits.shape[0], PREFILL_CHUNK_ROWS):
        chunk = logits[start : start + PREFILL_CHUNK_ROWS].float()  # [C, V]
        targets = target_ids[start : start + PREFILL_CHUNK_ROWS].unsqueeze(1)  # [C, 1]
        picked = chunk.gather(1, targets).squeeze(1)  # [C]
        out[start : start + chunk.shape[0]] = picked - torch.logsumexp(chunk, dim=-1)  # [C]
    return out
