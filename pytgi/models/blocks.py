"""Shared decoder blocks. Every family's variations are flags on `DecoderSpec`, never branches on
the model type: the norm (RMS, Gemma's 1 + w, LayerNorm with or without bias), q/k/v and output
biases, per-head q/k norms, the position encoding (rotary in either layout and on part of the head,
one rotary table per layer kind, ALiBi, or learned positions outside the stack), logit
soft-capping, clamped q/k/v (DBRX), sliding windows and attention chunks in attention, Llama 4's
no-rope layers (with their query temperature) and weightless q/k L2 norm, a gated or plain MLP or a
sparse mixture-of-experts block on the layers `DecoderSpec.moe` names (`make_mlp`), DeepSeek's
latent attention in place of q/k/v heads (`DecoderSpec.mla`, `make_attention`), and how a layer
composes attention and MLP (`DecoderSpec.block`: sequential, parallel with one or two norms, or
sandwiched between pre- and post-norms).

`DecoderStack` runs the layers in order, unless the step's forward context carries a decode-step
accelerator's replacement for the whole stack (the model runner decides that per step). For the
accelerator, each block hands over its tensors (`fused_decode_tensors`), or None when a weight is in
no layout the accelerator runs (tensor-parallel, no kernels, fp32-activation quantized formats).

Rotary tables reach the layers as cos / sin [R, T, 1, rotary_dim]: R = 1, or 2 when sliding-window
layers rotate with their own base (`DecoderSpec.rope_table`); rotary_dim = 0 without rotary. With
Llama 4's attention temperature one more row follows (`DecoderSpec.temperature_table`): cos holds
each token's query scale for the no-rope layers, sin zeros.
"""

from __future__ import annotations

import torch
from torch import nn

from pytgi.layers.activation import get_activation
from pytgi.layers.attention import Attention, alibi_slopes
from pytgi.layers.forward_context import get_forward_context
from pytgi.layers.linear import (
    ColumnParallelLinear,
    LinearBase,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from pytgi.layers.moe.block import SparseMoeBlock
from pytgi.layers.norm import LayerNorm, RMSNorm
from pytgi.layers.quantization.base import QuantConfig
from pytgi.layers.quantization.unquantized import pack_column_tiles
from pytgi.layers.rotary import ApplyRotary
from pytgi.models.config import (
    ALIBI,
    PARALLEL,
    PARALLEL_TWO_NORMS,
    SANDWICH,
    SEQUENTIAL,
    DecoderSpec,
    Norm,
)

FusedTensors = dict[str, torch.Tensor]


def make_norm(spec: DecoderSpec, size: int | None = None) -> nn.Module:
    size = size or spec.hidden_size
    if spec.norm == Norm.LAYER:
        return LayerNorm(size, spec.norm_eps, bias=spec.norm_bias)
    return RMSNorm(size, spec.norm_eps, weight_offset=spec.norm_weight_offset)


def _norm_tensors(norm: nn.Module, name: str) -> FusedTensors:
    tensors = {name: norm.weight}
    if getattr(norm, "bias", None) is not None:
        tensors[f"{name}_bias"] = norm.bias
    return tensors


def _packed(linear: LinearBase, name: str) -> FusedTensors | None:
    """A linear's weight as the fused kernel takes it (packed fp32 tiles, or a quantized weight
    in its kernel layout; see `LinearMethod.fused_decode_tensors`); None when its method cannot
    run there (not fp32, no kernels, a format the stack lacks) or the weight is sharded."""
    if linear.tp.world_size != 1:
        return None
    tensors = linear.quant_method.fused_decode_tensors(linear, name)
    return None if tensors is None else tensors | _lora_tensors(linear, name)


def _lora_tensors(linear: LinearBase, name: str) -> FusedTensors:
    """Each LoRA adapter slot s of the linear as the fused stack takes it, in fp32 whatever the
    base weight's format: `name.lora{s}.a` A [r, in] and `name.lora{s}.b` the scaled B [out, r]
    as column tiles [ceil(out / 16), r, 16] (the layout of the stack's fp32 weights)."""
    tensors = {}
    for slot, weights in linear.lora_adapters.items():
        tensors[f"{name}.lora{slot}.a"] = weights.a.float().contiguous()
        tensors[f"{name}.lora{slot}.b"] = pack_column_tiles(weights.b.float())
    return tensors


class DecoderAttention(nn.Module):
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
            checkpoint_layout=spec.qkv_checkpoint_layout,
        )
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(
            spec.num_heads * spec.head_dim,
            spec.hidden_size,
            bias=spec.o_bias,
            quant_config=quant_config,
            prefix=f"{prefix}.o_proj",
        )
        self.qkv_clip = spec.qkv_clip
        self.qk_norm = spec.qk_norm
        if spec.qk_norm:
            self.q_norm = make_norm(spec, spec.head_dim)
            self.k_norm = make_norm(spec, spec.head_dim)
        self.attn = Attention(
            self.num_heads,
            spec.head_dim,
            spec.attention_scale,
            self.num_kv_heads,
            spec.sliding_window(layer_idx),
            prefix=f"{prefix}.attn",
            logits_soft_cap=spec.attn_logit_softcap,
            alibi_slopes=self._alibi_slopes(spec),
            attention_chunk_size=spec.attention_chunk_size(layer_idx),
        )
        nope = spec.is_nope(layer_idx)
        self.rotate = ApplyRotary(spec.rotary_interleaved) if spec.uses_rope and not nope else None
        self.rope_table = spec.rope_table(layer_idx)
        self.qk_l2_norm = spec.qk_l2_norm and not nope
        self.norm_eps = spec.norm_eps
        self.temperature_table = spec.temperature_table if nope else None

    def _alibi_slopes(self, spec: DecoderSpec) -> tuple[float, ...] | None:
        if spec.position_encoding != ALIBI:
            return None
        first = self.qkv_proj.tp.rank * self.num_heads  # this rank's query heads
        slopes = alibi_slopes(spec.num_heads, spec.alibi_slope_scale)
        return slopes[first : first + self.num_heads]

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h, kvh = self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(hidden).unflatten(-1, (h + 2 * kvh, self.head_dim))  # [T, H+2KVH, D]
        if self.qkv_clip is not None:
            qkv = qkv.clamp(-self.qkv_clip, self.qkv_clip)
        q, k = qkv[:, :h], qkv[:, h : h + kvh]  # [T, H, D], [T, KVH, D]
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotate is not None:
            cos, sin = cos[self.rope_table], sin[self.rope_table]  # [T, 1, rotary_dim]
            if self.qk_norm:
                q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
            else:  # q and k heads are adjacent: rotate them in one go (qkv is ours to overwrite)
                qk = self.rotate(qkv[:, : h + kvh], cos, sin)  # [T, H+KVH, D]
                q, k = qk[:, :h], qk[:, h:]
        if self.qk_l2_norm:  # Llama 4: after the rotary, no weight
            q, k = _l2_norm(q, self.norm_eps), _l2_norm(k, self.norm_eps)
        if self.temperature_table is not None:  # the query scale, per token
            # no-rope layers never slice cos: the row after the rotary tables, [T, 1, 1] here
            q = q * cos[self.temperature_table][:, :, :1]
        out = self.attn(q, k, qkv[:, h + kvh :])  # [T, H, D]
        return self.o_proj(out.flatten(1))  # [T, hidden]

    def fused_decode_tensors(self) -> FusedTensors | None:
        qkv, o = _packed(self.qkv_proj, "qkv"), _packed(self.o_proj, "o")
        if qkv is None or o is None:
            return None
        tensors = qkv | o
        if self.qk_norm:
            tensors |= _norm_tensors(self.q_norm, "q_norm") | _norm_tensors(self.k_norm, "k_norm")
        if self.attn.params.alibi_slopes is not None:
            tensors["alibi_slopes"] = torch.tensor(self.attn.params.alibi_slopes)
        return tensors


def _l2_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the head dim, in fp32 (Llama 4's weightless q/k norm)."""
    return torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)), gate and up as one fused projection."""

    def __init__(self, spec: DecoderSpec, quant_config: QuantConfig | None, prefix: str):
        super().__init__()
        self.act_fn = get_activation(spec.hidden_act, gated=True)
        self.gate_up_proj = MergedColumnParallelLinear(
            spec.hidden_size,
            [spec.intermediate_size] * 2,
            bias=spec.mlp_bias,
            quant_config=quant_config,
            prefix=f"{prefix}.gate_up_proj",
        )
        self.down_proj = _down_proj(spec, quant_config, prefix)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))  # [T, hidden]

    def fused_decode_tensors(self) -> FusedTensors | None:
        return _packed_pair(self.gate_up_proj, "gate_up", self.down_proj)


class MLP(nn.Module):
    """down(act(up(x))): the plain two-layer MLP (GPT-2, Falcon, Phi, Starcoder2)."""

    def __init__(self, spec: DecoderSpec, quant_config: QuantConfig | None, prefix: str):
        super().__init__()
        self.act_fn = get_activation(spec.hidden_act, gated=False)
        self.up_proj = ColumnParallelLinear(
            spec.hidden_size,
            spec.intermediate_size,
            bias=spec.mlp_bias,
            quant_config=quant_config,
            prefix=f"{prefix}.up_proj",
        )
        self.down_proj = _down_proj(spec, quant_config, prefix)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.up_proj(x)))  # [T, hidden]

    def fused_decode_tensors(self) -> FusedTensors | None:
        return _packed_pair(self.up_proj, "up", self.down_proj)


def _down_proj(
    spec: DecoderSpec, quant_config: QuantConfig | None, prefix: str
) -> RowParallelLinear:
    """Either MLP's output projection, intermediate -> hidden."""
    return RowParallelLinear(
        spec.intermediate_size,
        spec.hidden_size,
        bias=spec.mlp_bias,
        quant_config=quant_config,
        prefix=f"{prefix}.down_proj",
    )


def _packed_pair(up: LinearBase, up_name: str, down: LinearBase) -> FusedTensors | None:
    """An MLP's two projections as the fused decode stack takes them, or None."""
    up_tensors, down_tensors = _packed(up, up_name), _packed(down, "down")
    if up_tensors is None or down_tensors is None:
        return None
    return up_tensors | down_tensors


def make_attention(
    spec: DecoderSpec, layer_idx: int, quant_config: QuantConfig | None, prefix: str
) -> nn.Module:
    if spec.mla is not None:
        from pytgi.models.mla import LatentAttentionBlock

        return LatentAttentionBlock(spec, layer_idx, quant_config, prefix)
    return DecoderAttention(spec, layer_idx, quant_config, prefix)


def make_mlp(
    spec: DecoderSpec, layer_idx: int, quant_config: QuantConfig | None, prefix: str
) -> nn.Module:
    """Layer `layer_idx`'s MLP: the sparse MoE block where the spec's MoE config says so, else
    the dense gated or plain MLP (of `intermediate_size`)."""
    if spec.moe is not None and spec.moe.is_sparse(layer_idx):
        return SparseMoeBlock(spec.moe, spec.hidden_size, quant_config, prefix)
    mlp_class = GatedMLP if spec.mlp_gated else MLP
    return mlp_class(spec, quant_config, prefix)


class DecoderLayer(nn.Module):
    """One layer; the residual stream is carried separately so each norm fuses the add: a layer
    maps (hidden, residual) to the same, the stream being their sum (residual None: hidden is
    the stream). Norm names follow the checkpoints: `post_attention_layernorm` is the pre-MLP
    norm of a sequential block (Llama) and the post-attention norm of a sandwich (Gemma)."""

    def __init__(
        self, spec: DecoderSpec, layer_idx: int, quant_config: QuantConfig | None, prefix: str
    ):
        super().__init__()
        self.block = spec.block
        self.self_attn = make_attention(spec, layer_idx, quant_config, f"{prefix}.self_attn")
        self.mlp = make_mlp(spec, layer_idx, quant_config, f"{prefix}.mlp")
        self.input_layernorm = make_norm(spec)
        if self.block in (SEQUENTIAL, SANDWICH):
            self.post_attention_layernorm = make_norm(spec)
        if self.block == PARALLEL_TWO_NORMS:
            self.mlp_layernorm = make_norm(spec)
        if self.block == SANDWICH:
            self.pre_feedforward_layernorm = make_norm(spec)
            self.post_feedforward_layernorm = make_norm(spec)
        self.residual_multiplier = spec.residual_multiplier

    def _scaled(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.residual_multiplier == 1.0 else x * self.residual_multiplier

    def forward(self, hidden, residual, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden, residual) [T, hidden] each -> the same after attention and MLP."""
        if residual is None:
            normed, residual = self.input_layernorm(hidden), hidden
        else:
            normed, residual = self.input_layernorm(hidden, residual)
        attn = self.self_attn(normed, cos, sin)
        if self.block == PARALLEL:
            return attn + self.mlp(normed), residual
        if self.block == PARALLEL_TWO_NORMS:
            return attn + self.mlp(self.mlp_layernorm(residual)), residual
        if self.block == SANDWICH:
            attn = self.post_attention_layernorm(attn)
            normed, residual = self.pre_feedforward_layernorm(attn, residual)
            return self.post_feedforward_layernorm(self.mlp(normed)), residual
        normed, residual = self.post_attention_layernorm(self._scaled(attn), residual)
        return self._scaled(self.mlp(normed)), residual

    def fused_decode_tensors(self) -> FusedTensors | None:
        """Norm keys as the fused kernel names them: input_norm, mlp_norm (the norm feeding the
        MLP when it is not input_norm), attn_out_norm and mlp_out_norm (a sandwich's post-norms),
        each with an optional _bias."""
        attention, mlp = self.self_attn.fused_decode_tensors(), self.mlp.fused_decode_tensors()
        if attention is None or mlp is None:
            return None
        norms = _norm_tensors(self.input_layernorm, "input_norm")
        if self.block == SEQUENTIAL:
            norms |= _norm_tensors(self.post_attention_layernorm, "mlp_norm")
        elif self.block == PARALLEL_TWO_NORMS:
            norms |= _norm_tensors(self.mlp_layernorm, "mlp_norm")
        elif self.block == SANDWICH:
            norms |= _norm_tensors(self.post_attention_layernorm, "attn_out_norm")
            norms |= _norm_tensors(self.pre_feedforward_layernorm, "mlp_norm")
            norms |= _norm_tensors(self.post_feedforward_layernorm, "mlp_out_norm")
        return attention | mlp | norms


class DecoderStack(nn.ModuleList):
    """The decoder layers (parameter names `layers.{i}`), run layer by layer unless the forward
    context hands this step to a decode-step accelerator."""

    def __init__(self, spec: DecoderSpec, quant_config: QuantConfig | None, prefix: str):
        super().__init__(
            DecoderLayer(spec, i, quant_config, f"{prefix}.{i}") for i in range(spec.num_layers)
        )

    def forward(self, hidden, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [T, hidden], cos / sin [R, T, 1, rotary_dim] -> (hidden, residual) [T, hidden]
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
