"""Vocabulary-parallel token embedding and LM head.

The vocabulary is split into equal contiguous ranges, one per rank (the last range padded with zero
rows). The embedding looks up local ids, zeroes the others and all-reduces; the LM head computes
local logits and gathers them to rank 0, which is the only rank that samples.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pytgi.distributed.comm import tp_all_reduce, tp_gather_to_first_rank
from pytgi.distributed.parallel_state import get_tp_info
from pytgi.errors import ModelLoadError
from pytgi.layers.quantization.base import set_weight_attrs


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, params_dtype=None):
        super().__init__()
        self.tp = get_tp_info()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        per_rank = -(-num_embeddings // self.tp.world_size)
        self.vocab_start = min(self.tp.rank * per_rank, num_embeddings)
        self.vocab_end = min(self.vocab_start + per_rank, num_embeddings)
        dtype = params_dtype or torch.get_default_dtype()
        self.weight = nn.Parameter(
            torch.empty(per_rank, embedding_dim, dtype=dtype), requires_grad=False
        )
        set_weight_attrs(self.weight, weight_loader=self.weight_loader)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        expected = (self.num_embeddings, self.embedding_dim)
        if tuple(loaded.shape) != expected:
            raise ModelLoadError(
                f"checkpoint shape {tuple(loaded.shape)} does not match the expected {expected}"
            )
        num_local = self.vocab_end - self.vocab_start
        param.data[:num_local].copy_(loaded[self.vocab_start : self.vocab_end])
        param.data[num_local:].zero_()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.world_size == 1:
            return F.embedding(input_ids, self.weight)  # [T, D]
        is_local = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)  # [T]
        local_ids = (input_ids - self.vocab_start) * is_local  # [T]
        y = F.embedding(local_ids, self.weight).masked_fill_(~is_local.unsqueeze(1), 0.0)
        return tp_all_reduce(y)  # [T, D]


class ParallelLMHead(VocabParallelEmbedding):
    """Projects hidden states to vocabulary logits; may share its weight with the embedding."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """hidden [N, D] -> logits [N, V] on rank 0, None on the other ranks."""
        logits = tp_gather_to_first_rank(F.linear(hidden, self.weight))  # [N, V_padded]
        if logits is None:
            return None
        return logits[:, : self.num_embeddings] if self.tp.world_size > 1 else logits
