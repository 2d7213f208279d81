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
from pytgi.layers.build_context import current_build_context
from pytgi.layers.linear import MergedColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from pytgi.layers.moe.config import MoEConfig
from pytgi.layers.moe.experts import FusedExperts, QuantizedExperts
from pytgi.layers.moe.router import select_experts
from pytgi.layers.quantization.base import QuantConfig
from pytgi.layers.quantization.unquantized import pack_column_tiles


def experts_quantized(quant_config: QuantConfig | None) -> bool:
    """Whether the routed experts run as per-expert quantized linears (a `--quantize` method)
    rather than stacked full-precision tensors (no quantization, or GGUF's dequantized
    experts)."""
    return quant_config is not None and not quant_config.experts_in_full_precision


class RouterGate(nn.Module):
    """logits = x @ weight^T, in fp32 (the routers' precision), plus the optional selection
    bias. With the compiled CPU kernels the product runs on the weight packed as 16-column tiles
    (`weight_packed`, made after loading): the row-invariant kernel the fused decode stack runs
    too, so a row's routing does not depend on the other rows of its step."""

    def __init__(self, hidden_size: int, num_experts: int, correction_bias: bool):
        super().__init__()
        self.kernels = current_build_context().kernels
        self.weight_packed = None  # [ceil(E/16), hidden, 16], once loaded
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size), requires_grad=False)
        self.e_score_correction_bias = None
        if correction_bias:
            self.e_score_correction_bias = nn.Parameter(
                torch.empty(num_experts, dtype=torch.float32), requires_grad=False
            )

    def process_weights_after_loading(self) -> None:
        if self.kernels is not None and self.weight.device.type == "cpu":
            self.weight_packed = pack_column_tiles(self.weight.data.float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight_packed is None:
            return x.float() @ self.weight.float().t()  # [T, E]
        logits = self.kernels.linear_packed(x.float().contiguous(), self.weight_packed)
        return logits[:, : self.weight.shape[0]]  # [T, E]


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

    def fused_decode_tensors(self) -> dict[str, torch.Tensor] | None:
        """The block as the fused CPU decode stack takes it (csrc/moe_stack.h): `moe.router`
        (the gate [E, hidden] as 16-column tiles), the packed experts (`moe.gate_up`,
        `moe.down`) and the shared expert's packed `moe.shared_gate_up`, `moe.shared_down` and
        `moe.shared_gate`; None when a weight is not fp32 tiles (quantized experts, no kernels,
        tensor parallelism). Which routing rules the stack computes is the accelerator's check
        (`DecoderSpec.moe`); it adds `moe.config`."""
        tensors = self.experts.fused_decode_tensors()
        if tensors is None:
            return None
        if self.gate.weight_packed is None:
            return None
        tensors = tensors | {"moe.router": self.gate.weight_packed}
        if self.shared_experts is None:
            return tensors
        linears = [
            (self.shared_experts.gate_up_proj, "moe.shared_gate_up"),
            (self.shared_experts.down_proj, "moe.shared_down"),
        ]
        if self.shared_expert_gate is not None:
            linears.append((self.shared_expert_gate, "moe.shared_gate"))
        for linear, name in linears:
            packed = linear.quant_method.fused_decode_tensors(linear, name)
            if packed is None or linear.tp.world_size != 1 or set(packed) != {name}:
                return None  # quantized, sharded, or with a bias the kernel does not add
            tensors |= packed
        return tensors
