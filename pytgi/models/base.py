"""The model contract: what every causal LM implements for the loader and the model runner.

A model family subclasses `CausalLM`, builds its spec from the HF config (`spec_from_hf`), and
declares how checkpoint tensors map onto its parameters (class attributes read by
`models.loader.WeightMapper`):

- `packed_modules_mapping`: checkpoint module -> (fused parameter module, shard id), e.g. q_proj ->
  (qkv_proj, "q"): several checkpoint tensors load into one fused parameter;
- `weight_renames`: (regex, replacement) applied to checkpoint names first, in order;
- `transposed_weights`: regexes of checkpoint tensors stored [in, out] (GPT-2's Conv1D);
- `ignored_weights`: regexes of checkpoint tensors with no parameter (stale rotary buffers);
- `expert_weight_mapping()`: (parameter fragment, checkpoint fragment, expert id, shard id) rows
  for experts stacked into one parameter, e.g. ("experts.w13_", "experts.3.gate_proj.", 3, "w1").

A model may also opt into the decode-step accelerator by returning its decoder layers' tensors
from `fused_decode_layers()` (the accelerator then checks the spec's features against what it
implements).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import torch
from torch import nn

from pytgi.models.config import ModelSpec


class CausalLM(nn.Module):
    packed_modules_mapping: ClassVar[dict[str, tuple[str, Any]]] = {}
    weight_renames: ClassVar[tuple[tuple[str, str], ...]] = ()
    transposed_weights: ClassVar[tuple[str, ...]] = ()
    ignored_weights: ClassVar[tuple[str, ...]] = (r"rotary_emb\.inv_freq$",)

    spec: ModelSpec

    @classmethod
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict) -> ModelSpec:
        raise NotImplementedError

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]."""
        raise NotImplementedError

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """hidden [N, hidden] -> logits [N, vocab] on rank 0 (None on other ranks)."""
        raise NotImplementedError

    def is_ignored_weight(self, name: str) -> bool:
        """Checkpoint tensors with no parameter here; a tied head's copy is one."""
        if self.spec.tie_word_embeddings and name == "lm_head.weight":
            return True
        return any(re.search(pattern, name) for pattern in self.ignored_weights)

    def expert_weight_mapping(self) -> list[tuple[str, str, int, Any]]:
        return []

    def steps_capturable(self) -> bool:
        """Whether a step's forward can be recorded once and replayed (CUDA graphs): False when a
        layer decides its work on the host from the step's data (MoE expert counts, latent
        attention's per-step plan)."""
        return True

    def fused_decode_layers(self) -> list[tuple[str, dict[str, torch.Tensor]]] | None:
        """(attention layer name, tensors) per decoder layer for the decode-step accelerator, or
        None when this model does not run there (the default)."""
        return None
