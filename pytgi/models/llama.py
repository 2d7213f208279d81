"""Llama-family causal LM: Llama 2/3/3.x, CodeLlama, Mistral, Qwen2, Qwen3 and Granite (registry
aliases with flags on `DecoderSpec`). Parameter names follow the HF checkpoints except the fused
`qkv_proj` and `gate_up_proj` (see `packed_modules_mapping`).
"""

from __future__ import annotations

import torch
from torch import nn

from pytgi.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from pytgi.layers.norm import RMSNorm
from pytgi.layers.quantization.base import QuantConfig
from pytgi.layers.rotary import get_rope
from pytgi.models.base import CausalLM
from pytgi.models.blocks import DecoderStack
from pytgi.models.config import DecoderSpec, decoder_spec_from_hf


class LlamaModel(nn.Module):
    def __init__(self, spec: DecoderSpec, quant_config: QuantConfig | None = None):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(
            spec.vocab_size, spec.hidden_size, quant_config=quant_config
        )
        self.embedding_multiplier = spec.embedding_multiplier
        self.rotary_emb = get_rope(
            spec.head_dim,
            spec.rotary_size,
            spec.max_position_embeddings,
            spec.rope_theta,
            spec.rope_scaling,
        )
        self.layers = DecoderStack(spec, quant_config, prefix="model.layers")
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]."""
        hidden = self.embed_tokens(input_ids)  # [T, hidden]
        if self.embedding_multiplier != 1.0:
            hidden = hidden * self.embedding_multiplier
        cos, sin = self.rotary_emb(positions, hidden.dtype)  # [T, 1, rotary_dim] each
        hidden, residual = self.layers(hidden, cos, sin)
        return self.norm(hidden, residual)[0]


class LlamaForCausalLM(CausalLM):
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, spec: DecoderSpec, quant_config: QuantConfig | None = None):
        super().__init__()
        self.spec = spec
        self.model = LlamaModel(spec, quant_config)
        self.lm_head = ParallelLMHead(spec.vocab_size, spec.hidden_size, quant_config=quant_config)
        if spec.tie_word_embeddings:
            self.lm_head.tie(self.model.embed_tokens)
        self.logits_scaling = spec.logits_scaling

    @classmethod
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict) -> DecoderSpec:
        return decoder_spec_from_hf(hf_config, architecture, flags)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        logits = self.lm_head.compute_logits(hidden)
        if logits is not None and self.logits_scaling != 1.0:
            logits = logits / self.logits_scaling
        return logits

    def fused_decode_layers(self):
        return self.model.layers.fused_decode_layers()
