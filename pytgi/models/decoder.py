"""The generic decoder-only causal LM over the shared blocks: embeddings (scaled, plus learned
positions when the family has them), the rotary tables, `DecoderStack`, the final norm and the LM
head with its logit post-processing (scale, division, soft-cap). Family files subclass
`DecoderForCausalLM`: they read their HF config into a `DecoderSpec` and declare how their
checkpoint names map onto these parameters (`weight_renames`, `packed_modules_mapping`, ...).

Parameter names: model.embed_tokens, model.embed_positions, model.layers.{i}.*, model.norm,
lm_head (Llama's checkpoint names, which most families share).
"""

from __future__ import annotations

import torch
from torch import nn

from pytgi.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from pytgi.layers.quantization.base import QuantConfig
from pytgi.layers.rotary import get_rope
from pytgi.models.base import CausalLM
from pytgi.models.blocks import DecoderStack, make_norm
from pytgi.models.config import LEARNED, DecoderSpec

# separate q/k/v checkpoint tensors load into the fused qkv_proj
QKV_PACKED_MODULES = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
}
# and gate/up into gate_up_proj (families with a gated MLP; a plain MLP's up_proj is its own)
LLAMA_PACKED_MODULES = {
    **QKV_PACKED_MODULES,
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class DecoderModel(nn.Module):
    def __init__(self, spec: DecoderSpec, quant_config: QuantConfig | None = None):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(
            spec.vocab_size, spec.hidden_size, quant_config=quant_config
        )
        self.embed_positions = None
        if spec.position_encoding == LEARNED:
            self.embed_positions = VocabParallelEmbedding(
                spec.max_position_embeddings, spec.hidden_size
            )
        self.embedding_multiplier = spec.embedding_multiplier
        self.rotary_dim = spec.rotary_size if spec.uses_rope else 0
        self.rotary_embs = nn.ModuleList()
        if spec.uses_rope:
            bases = [(spec.rope_theta, spec.rope_scaling)]
            if spec.local_rope_theta is not None:
                bases.append((spec.local_rope_theta, None))
            self.rotary_embs.extend(
                get_rope(
                    spec.head_dim,
                    spec.rotary_size,
                    spec.max_position_embeddings,
                    base,
                    scaling,
                    spec.rotary_interleaved,
                )
                for base, scaling in bases
            )
        self.attn_temperature = spec.attn_temperature
        self.layers = DecoderStack(spec, quant_config, prefix="model.layers")
        self.norm = make_norm(spec)

    def rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """positions [T] -> (cos, sin) [R, T, 1, rotary_dim], one row per rotary table (an empty
        [1, T, 1, 0] without rotary)."""
        if not self.rotary_embs:
            empty = torch.empty(1, positions.shape[0], 1, 0, dtype=dtype, device=positions.device)
            return empty, empty
        tables = [rope(positions, dtype) for rope in self.rotary_embs]
        if self.attn_temperature is not None:
            tables.append(self._temperature(positions, dtype, tables[0][0].shape[-1]))
        if len(tables) == 1:
            cos, sin = tables[0]
            return cos.unsqueeze(0), sin.unsqueeze(0)
        return torch.stack([c for c, _ in tables]), torch.stack([s for _, s in tables])

    def _temperature(self, positions: torch.Tensor, dtype: torch.dtype, width: int):
        """Llama 4's attention temperature as a table row: cos [T, 1, width] holds each token's
        query scale 1 + attn_scale * log1p(floor((p + 1) / floor_scale)), sin zeros."""
        floor_scale, attn_scale = self.attn_temperature
        scale = torch.log1p(torch.floor((positions.float() + 1.0) / floor_scale)) * attn_scale + 1.0
        cos = scale.to(dtype).view(-1, 1, 1).expand(-1, 1, width)  # [T, 1, width]
        return cos, torch.zeros_like(cos)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden]."""
        hidden = self.embed_tokens(input_ids)  # [T, hidden]
        if self.embedding_multiplier != 1.0:
            hidden = hidden * self.embedding_multiplier
        if self.embed_positions is not None:
            hidden = hidden + self.embed_positions(positions)
        cos, sin = self.rotary(positions, hidden.dtype)
        hidden, residual = self.layers(hidden, cos, sin)
        return self.norm(hidden, residual)[0]


class DecoderForCausalLM(CausalLM):
    packed_modules_mapping = LLAMA_PACKED_MODULES

    def __init__(self, spec: DecoderSpec, quant_config: QuantConfig | None = None):
        super().__init__()
        self.spec = spec
        self.model = DecoderModel(spec, quant_config)
        head_class = self.lm_head_class(spec)
        self.lm_head = head_class(
            spec.vocab_size, spec.hidden_size, quant_config=quant_config, bias=spec.lm_head_bias
        )
        if spec.tie_word_embeddings:
            self.lm_head.tie(self.model.embed_tokens)

    @staticmethod
    def lm_head_class(spec: DecoderSpec) -> type[ParallelLMHead]:
        return ParallelLMHead

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        logits = self.lm_head.compute_logits(hidden)  # [N, V] on rank 0
        spec = self.spec
        if logits is None:
            return None
        if spec.logit_scale != 1.0:
            logits = logits * spec.logit_scale
        if spec.logits_scaling != 1.0:
            logits = logits / spec.logits_scaling
        if spec.final_logit_softcap is not None:
            cap = spec.final_logit_softcap
            logits = torch.tanh(logits / cap) * cap
        return logits

    def steps_capturable(self) -> bool:
        return self.spec.moe is None and self.spec.mla is None

    def fused_decode_layers(self):
        return self.model.layers.fused_decode_layers()
