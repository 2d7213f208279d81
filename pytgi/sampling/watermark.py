"""TGI's "A Watermark for Large Language Models" (Kirchenbauer et al.) logits bias.

For each row, a CPU `torch.Generator` seeded with `15485863 * previous_token` draws a permutation
of the vocabulary; its first `int(gamma * V)` ids are the green list, whose logits get `+delta`.
The generator always runs on the CPU, so the green list of a token is the same on every device
(and equals TGI's on CPU). Green lists depend only on the previous token, so they are cached.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

HASH_KEY = 15485863


class Watermark:
    """Adds `delta` to the green-list logits of the given rows; owns a small LRU of green masks."""

    def __init__(self, vocab_size: int, gamma: float, delta: float, cache_size: int = 128):
        self.vocab_size = vocab_size
        self.gamma = gamma
        self.delta = delta
        self.cache_size = cache_size
        self._masks: OrderedDict[int, torch.Tensor] = OrderedDict()  # prev token → [V] bool (CPU)

    def greenlist_ids(self, prev_token: int) -> torch.Tensor:
        """The green-list ids [int(gamma * V)] for the token following `prev_token`."""
        generator = torch.Generator(device="cpu")
        generator.manual_seed(HASH_KEY * prev_token)
        permutation = torch.randperm(self.vocab_size, generator=generator)  # [V]
        return permutation[: int(self.vocab_size * self.gamma)]  # [G]

    def greenlist_mask(self, prev_token: int) -> torch.Tensor:
        mask = self._masks.get(prev_token)
        if mask is not None:
            self._masks.move_to_end(prev_token)
            return mask
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)  # [V]
        mask[self.greenlist_ids(prev_token)] = True
        self._masks[prev_token] = mask
        if len(self._masks) > self.cache_size:
            self._masks.popitem(last=False)
        return mask

    def __call__(self, scores: torch.Tensor, prev_tokens: list[int]) -> torch.Tensor:
        """scores [R, V], prev_tokens[i] = last token of row i's history → biased scores [R, V]."""
        masks = torch.stack([self.greenlist_mask(t) for t in prev_tokens])  # [R, V] bool
        return scores.add(masks.to(scores.device), alpha=self.delta)  # [R, V]
