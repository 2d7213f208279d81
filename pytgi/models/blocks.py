"""Shared decoder blocks for Llama-family models; variations are flags on `DecoderSpec`, not
branches on model type: q/k/v and output bias, per-head q/k RMSNorm (Qwen3), attention scale and
residual multiplier (Granite), per-layer sliding window (Mistral, Qwen2).

`DecoderStack` runs the layers in order, unless the step's forward context carries a decode-step
accelerator's replacement for the whole stack (the model runner decides that per step). For the
accelerator, each block hands over its tensors (`fused_decode_tensors`), or None when a weight is in
no layout the accelerator runs (tensor-parallel, no kernels, fp32-activation quantized formats).
"""

from __future__ import annotations

import torch
from torch import nn

from pytgi.errors import ModelLoadError
from pytgi.layers.activation import ACTIVATIONS
from pytgi.layers.attention import Attention
from pytgi.layers.forward_context import get_forward_context
from pytgi.layers.linear import (
    LinearBase,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from pytgi.layers.norm import RMSNorm
from pytgi.layers.quantization.base import QuantConfig
from pytgi.layers.rotary import ApplyRotary
from pytgi.models.config import DecoderSpec

FusedTensors = dict[str, torch.Tensor]


def _packed(linear: LinearBase, name: str) -> FusedTensors | None:
    """A linear's weight as the fused kernel takes it (packed fp32 tiles, or a quantized weight
    in its kernel layout; see `LinearMethod.fused_decode_tensors`); None when its method cannot
    run there (not fp32, no kernels, a format the stack lacks) or the weight is sharded."""
    if linear.tp.world_size != 1:
        return None
    return linear.quant_method.fused_decode_tensors(linear, name)


class RopeAttention(nn.Module):
    def __init__(
        self, spec: DecoderSpec, layer_idx: int, quant_config: QuantConfig | None, prefix: str
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
            spec.sliding_window(layer_idx),
            prefix=f"{prefix}.attn",
        )
        self.rotate = ApplyRotary()

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h, kvh = self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(hidden).unflatten(-1, (h + 2 * kvh, self.head_dim))  # [T, H+2KVH, D]
        if self.qk_norm:
            q = self.rotate(self.q_norm(qkv[:, :h]), cos, sin)  # [T, H, D]
            k = self.rotate(self.k_norm(qkv[:, h : h + kvh]), cos, sin)  # [T, KVH, D]
        else:  # q and k heads are adjacent: rotate them in one go (qkv is ours to overwrite)
            qk = self.rotate(qkv[:, : h + kvh], cos, sin)  # [T, H+KVH, D]
            q, k = qk[:, :h], qk[:, h:]
        out = self.attn(q, k, qkv[:, h + kvh :])  # [T, H, D]
        return self.o_proj(out.flatten(1))  # [T, hidden]

    def fused_decode_tensors(self) -> FusedTensors | None:
        qkv, o = _packed(self.qkv_proj, "qkv"), _packed(self.o_proj, "o")
        if qkv is None or o is None:
            return None
        tensors = qkv | o
        if self.qk_norm:
            tensors |= {"q_norm": self.q_norm.weight, "k_norm": self.k_norm.weight}
        return tensors


class GatedMLP(nn.Module):
    def __init__(self, spec: DecoderSpec, quant_config: QuantConfig | None, prefix: str):
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

    def fused_decode_tensors(self) -> FusedTensors | None:
        gate_up, down = _packed(self.gate_up_proj, "gate_up"), _packed(self.down_proj, "down")
        if gate_up is None or down is None:
            return None
        return gate_up | down


class DecoderLayer(nn.Module):
    """Pre-norm block; the residual stream is carried separately so each norm fuses the add."""

    def __init__(
        self, spec: DecoderSpec, layer_idx: int, quant_config: QuantConfig | None, prefix: str
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

    def fused_decode_tensors(self) -> FusedTensors | None:
        attention, mlp = self.self_attn.fused_decode_tensors(), self.mlp.fused_decode_tensors()
        if attention is None or mlp is None:
            return None
        norms = {
            "input_norm": self.input_layernorm.weight,
            "post_norm": self.post_attention_layernorm.weight,
        }
        return attention | mlp | norms


class DecoderStack(nn.ModuleList):
    """The decoder layers (parameter names `layers.{i}`), run layer by layer unless the forward
    context hands this step to a decode-step accelerator."""

    def __init__(self, spec: DecoderSpec, quant_config: QuantConfig | None, prefix: str):
        super().__init__(
            DecoderLayer(spec, i, quant_config, f"{prefix}.{i}") for i in range(spec.num_layers)
        )

    def forward(self, hidden, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [T, hidden], cos / sin [T, 1, rotary_dim] -> (hidden, residual) [T, hidden]
        each: the final norm's input is their sum."""
        fused = get_forward_context().fused_layers
        if fused is not None:
            return fused(hidden, cos, sin)
        residual = None
        for layer in self:
            hidden, residual = layer(hidden, residual, cos, sin)
        return hidden, residual

    def fused_decode_layers(self) -> list[tuple[str, dict[str, torch.Tensor]]] | None:
        """(attention layer name, tensors) per layer, or None when a layer's weights are in no
        layout the fused stack runs."""
        layers = [(layer.self_attn.attn.layer_name, layer.fused_decode_tensors()) for layer in self]
        return None if any(tensors is None for _, tensors in layers) else layers
