"""The sparse MLP block: router gate, routed experts and an optional shared expert.

Parameter names follow the checkpoints (Qwen2-MoE, DeepSeek; Mixtral's `block_sparse_moe` is
renamed to `mlp` by its family): `gate.weight` [E, hidden] (replicated) and, for DeepSeek-V3,
`gate.e_score_correction_bias` [E]; `experts.w13_weight` / `experts.w2_weight` (experts.py); the
shared expert as `shared_experts` (DeepSeek; Qwen2-MoE's `shared_expert` is renamed, its
`shared_expert_gate` kept) holding `gate_up_proj` and `down_proj` like a dense gated MLP.
"""

from __future__ import annotations

import torch
from torch import nn

from pytgi.errors import ModelLoadError
from pytgi.layers.activation import get_activation
from pytgi.layers.linear import MergedColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from pytgi.layers.moe.config import MoEConfig
from pytgi.layers.moe.experts import FusedExperts, QuantizedExperts
from pytgi.layers.moe.router import select_experts
from pytgi.layers.quantization.base import QuantConfig


def experts_quantized(quant_config: QuantConfig | None) -> bool:
    """Whether the routed experts run as per-expert quantized linears (a `--quantize` method)
    rather than stacked full-precision tensors (no quantization, or GGUF's dequantized
    experts)."""
    return quant_config is not None and not quant_config.experts_in_full_precision


class RouterGate(nn.Module):
    """logits = x @ weight^T, in fp32 (the routers' precision), plus the optional selection
    bias."""

    def __init__(self, hidden_size: int, num_experts: int, correction_bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size), requires_grad=False)
        self.e_score_correction_bias = None
        if correction_bias:
            self.e_score_correction_bias = nn.Parameter(
                torch.empty(num_experts, dtype=torch.float32), requires_grad=False
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.float() @ self.weight.float().t()  # [T, E]


class SharedExpert(nn.Module):
    """down(act(gate(x)) * up(x)) over the tensor-parallel ranks (a dense gated MLP)."""

    def __init__(self, hidden_size, intermediate_size, act, quant_config, prefix):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size,
            [intermediate_size] * 2,
            quant_config=quant_config,
            prefix=f"{prefix}.gate_up_proj",
        )
        self.down_proj = RowParallelLinear(
            intermediate_size, hidden_size, quant_config=quant_config, prefix=f"{prefix}.down_proj"
        )
        self.act_fn = get_activation(act, gated=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class SparseMoeBlock(nn.Module):
    def __init__(
        self,
        config: MoEConfig,
        hidden_size: int,
        quant_config: QuantConfig | None,
        prefix: str,
    ):
        super().__init__()
        self.config = config
        self.gate = RouterGate(hidden_size, config.num_experts, config.score_correction_bias)
        if experts_quantized(quant_config):
            if not config.per_expert_checkpoint:
                raise ModelLoadError(
                    f"{quant_config.name} weights on stacked checkpoint experts are not "
                    "supported yet (serve the model unquantized)"
                )
            self.experts = QuantizedExperts(
                config.num_experts,
                hidden_size,
                config.intermediate_size,
                config.hidden_act,
                quant_config,
                f"{prefix}.experts",
            )
        else:
            self.experts = FusedExperts(
                config.num_experts, hidden_size, config.intermediate_size, config.hidden_act
            )
        self.shared_experts = self.shared_expert_gate = None
        if config.shared_intermediate_size:
            self.shared_experts = SharedExpert(
                hidden_size,
                config.shared_intermediate_size,
                config.hidden_act,
                quant_config,
                f"{prefix}.shared_experts",
            )
            if config.shared_expert_gate:
                self.shared_expert_gate = ReplicatedLinear(
                    hidden_size, 1, quant_config=None, prefix=f"{prefix}.shared_expert_gate"
                )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        weights, ids = select_experts(
            self.gate(x), self.config, self.gate.e_score_correction_bias
        )  # [T, k] each
        out = self.experts(x, weights, ids, self.config.scale_input)
        if self.shared_experts is not None:
            shared = self.shared_experts(x)  # [T, hidden]
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        return out

    def fused_decode_tensors(self) -> None:
        """The fused decode stack runs dense MLPs only: MoE layers run layer by layer."""
        return None
