"""Shared decoder blocks for Llama-family models; variations are flags on `ModelSpec`, not branches
on model type: q/k/v and output bias, per-head q/k RMSNorm (Qwen3), attention scale and residual
multiplier (Granite), per-layer sliding window (Mistral, Qwen2).
"""

from __future__ import annotations

import torch
from torch import nn

from pytgi.errors import ModelLoadError
from pytgi.layers.activation import ACTIVATIONS
from pytgi.layers.attention import Attention
from pytgi.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from pytgi.layers.norm import RMSNorm
from pytgi.layers.quantization.base import QuantConfig
from pytgi.layers.rotary import apply_rotary_
from pytgi.models.config import ModelSpec


class RopeAttention(nn.Module):
    def __init__(
        self, spec: ModelSpec, layer_idx: int, quant_config: QuantConfig | None, prefix: str
    ):
        super().__init__()
        self.head_dim = spec.head_dim
        self.qkv_proj = QKVParallelLinear(
            spec.hidden_size,
            spec.head_dim,
            spec.num_heads,
            spec.num_kv_heads,
            bias=spec.qkv_bias,
            quant_config=quant_config,
            prefix=f"{prefix}.qkv_proj",
        )
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(
            spec.num_heads * spec.head_dim,
            spec.hidden_size,
            bias=spec.o_bias,
            quant_config=quant_config,
            prefix=f"{prefix}.o_proj",
        )
        self.qk_norm = spec.qk_norm
        if spec.qk_norm:
            self.q_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps)
            self.k_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps)
        self.attn = Attention(
            self.num_heads,
            spec.head_dim,
            spec.attention_scale,
            self.num_kv_heads,
            spec.sliding_windows[layer_idx],
        )

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h, kvh = self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(hidden).unflatten(-1, (h + 2 * kvh, self.head_dim))  # [T, H+2KVH, D]
        if self.qk_norm:
            q = apply_rotary_(self.q_norm(qkv[:, :h]), cos, sin)  # [T, H, D]
            k = apply_rotary_(self.k_norm(qkv[:, h : h + kvh]), cos, sin)  # [T, KVH, D]
        else:  # q and k heads are adjacent: rotate them in one go (qkv is ours to overwrite)
            qk = apply_rotary_(qkv[:, : h + kvh], cos, sin)  # [T, H+KVH, D]
            q, k = qk[:, :h], qk[:, h:]
        out = self.attn(q, k, qkv[:, h + kvh :])  # [T, H, D]
        return self.o_proj(out.flatten(1))  # [T, hidden]


class GatedMLP(nn.Module):
    def __init__(self, spec: ModelSpec, quant_config: QuantConfig | None, prefix: str):
        super().__init__()
        if spec.hidden_act not in ACTIVATIONS:
            raise ModelLoadError(
                f"unsupported hidden_act '{spec.hidden_act}' "
                f"(supported: {', '.join(sorted(ACTIVATIONS))})"
            )
        self.gate_up_proj = MergedColumnParallelLinear(
            spec.hidden_size,
            [spec.intermediate_size] * 2,
            bias=spec.mlp_bias,
            quant_config=quant_config,
            prefix=f"{prefix}.gate_up_proj",
        )
        self.act_fn = ACTIVATIONS[spec.hidden_act]()
        self.down_proj = RowParallelLinear(
            spec.intermediate_size,
            spec.hidden_size,
            bias=spec.mlp_bias,
            quant_config=quant_config,
            prefix=f"{prefix}.down_proj",
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))  # [T, hidden]


class DecoderLayer(nn.Module):
    """Pre-norm block; the residual stream is carried separately so each norm fuses the add."""

    def __init__(
        self, spec: ModelSpec, layer_idx: int, quant_config: QuantConfig | None, prefix: str
    ):
        super().__init__()
        self.self_attn = RopeAttention(spec, layer_idx, quant_config, f"{prefix}.self_attn")
        self.mlp = GatedMLP(spec, quant_config, f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.residual_multiplier = spec.residual_multiplier

    def _scaled(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.residual_multiplier == 1.0 else x * self.residual_multiplier

    def forward(self, hidden, residual, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden, residual) [T, hidden] each -> the same after attention and MLP."""
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self._scaled(self.self_attn(hidden, cos, sin))
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self._scaled(self.mlp(hidden)), residual
