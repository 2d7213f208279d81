"""Linear layers with tensor parallelism built in (vLLM / nano-vllm vocabulary).

Each layer allocates only this rank's shard (through its `LinearMethod`) and gives every parameter a
`weight_loader(param, loaded_weight, shard_id=None)` that checks the full checkpoint tensor's shape
and narrows it to this rank's part. Column-parallel layers split output features (no communication);
row-parallel layers split input features and all-reduce. Fused layers (QKV, gate/up) take one
checkpoint tensor per `shard_id`.
"""

from __future__ import annotations

import torch
from torch import nn

from pytgi.distributed.comm import tp_all_reduce
from pytgi.errors import ModelLoadError
from pytgi.layers.build_context import current_build_context
from pytgi.layers.forward_context import current_lora_batch
from pytgi.layers.lora import LoRAWeights, add_lora
from pytgi.layers.quantization.base import QuantConfig, set_weight_attrs
from pytgi.layers.quantization.unquantized import UnquantizedLinearMethod


def divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator != 0:
        raise ModelLoadError(
            f"{what} ({numerator}) is not divisible by the number of shards ({denominator})"
        )
    return numerator // denominator


def load_part(dst: torch.Tensor, loaded: torch.Tensor, dim: int | None, index: int, num_parts: int):
    """Copy part `index` of `num_parts` equal parts of `loaded` (split along `dim`) into `dst`,
    after checking that `loaded` has the full shape."""
    expected = list(dst.shape)
    if dim is not None:
        expected[dim] *= num_parts
    if list(loaded.shape) != expected:
        raise ModelLoadError(
            f"checkpoint shape {tuple(loaded.shape)} does not match the expected {tuple(expected)}"
        )
    if dim is not None:
        loaded = loaded.narrow(dim, index * dst.shape[dim], dst.shape[dim])
    dst.copy_(loaded)


class LinearBase(nn.Module):
    def __init__(
        self,
        input_size: int,
        output_partition_sizes: list[int],
        bias: bool,
        quant_config: QuantConfig | None,
        prefix: str,
        params_dtype: torch.dtype | None,
    ):
        super().__init__()
        self.tp = current_build_context().tp
        self.input_size = input_size
        self.output_size = sum(output_partition_sizes)
        params_dtype = params_dtype or torch.get_default_dtype()
        context = current_build_context()
        kernels = context.kernels
        method = quant_config.get_linear_method(prefix, context.quant()) if quant_config else None
        self.quant_method = method or UnquantizedLinearMethod(kernels)
        self.quant_method.create_weights(
            self, input_size, output_partition_sizes, params_dtype, self.weight_loader
        )
        self.bias = None
        if bias:
            self.bias = nn.Parameter(
                torch.empty(self.output_size, dtype=params_dtype), requires_grad=False
            )
            set_weight_attrs(self.bias, weight_loader=self.weight_loader, output_dim=0)
        # LoRA adapter slot -> this rank's A/B (layers/lora.py); empty without adapters
        self.lora_adapters: dict[int, LoRAWeights] = {}

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        raise NotImplementedError

    def with_lora(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y [T, out_local] plus the LoRA deltas of the step's adapter rows."""
        if not self.lora_adapters:
            return y
        batch = current_lora_batch()
        return y if batch is None else add_lora(self.lora_adapters, batch, x, y)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.with_lora(x, self.quant_method.apply(self, x, self.bias))  # [T, out_local]


class ReplicatedLinear(LinearBase):
    """Every rank holds the whole weight."""

    def __init__(
        self, input_size, output_size, bias=False, quant_config=None, prefix="", params_dtype=None
    ):
        super().__init__(input_size, [output_size], bias, quant_config, prefix, params_dtype)

    def weight_loader(self, param, loaded, shard_id=None):
        load_part(param.data, loaded, None, 0, 1)


class ColumnParallelLinear(LinearBase):
    """Output features split over ranks: y_local = x @ W_local^T; no communication."""

    def __init__(
        self,
        input_size,
        output_size,
        bias=False,
        quant_config=None,
        prefix="",
        params_dtype=None,
        output_sizes: list[int] | None = None,
    ):
        tp_size = current_build_context().tp.world_size
        self.output_sizes = output_sizes or [output_size]
        parts = [divide(s, tp_size, f"{prefix or 'linear'} output size") for s in self.output_sizes]
        super().__init__(input_size, parts, bias, quant_config, prefix, params_dtype)

    def weight_loader(self, param, loaded, shard_id=None):
        load_part(
            param.data, loaded, getattr(param, "output_dim", None), self.tp.rank, self.tp.world_size
        )


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections in one matmul (gate_up_proj); shard_id = index."""

    def __init__(
        self,
        input_size,
        output_sizes: list[int],
        bias=False,
        quant_config=None,
        prefix="",
        params_dtype=None,
    ):
        super().__init__(
            input_size,
            sum(output_sizes),
            bias,
            quant_config,
            prefix,
            params_dtype,
            output_sizes=output_sizes,
        )

    def weight_loader(self, param, loaded, shard_id=None):
        """One checkpoint tensor per shard (shard_id = its index), or the checkpoint's own fused
        tensor (shard_id None: the shards concatenated along the output dimension, Phi-3's
        gate_up_proj)."""
        dim = param.output_dim
        if shard_id is None:
            _check_fused(loaded, dim, sum(self.output_sizes))
            for index, part in enumerate(loaded.split(self.output_sizes, dim=dim)):
                self.weight_loader(param, part, index)
            return
        tp_size = self.tp.world_size
        offset = sum(self.output_sizes[:shard_id]) // tp_size
        size = self.output_sizes[shard_id] // tp_size
        load_part(param.data.narrow(dim, offset, size), loaded, dim, self.tp.rank, tp_size)


class QKVParallelLinear(ColumnParallelLinear):
    """Fused q/k/v projection, heads split over ranks; shard_id in ("q", "k", "v"), or None for a
    checkpoint that stores q/k/v as one tensor, ordered as `checkpoint_layout` says: "concat"
    [q | k | v] (Phi-3, GPT-2, Baichuan's W_pack) or "grouped", per KV head [its query heads | k |
    v] (Falcon; GPT-BigCode without multi-query attention).

    With fewer KV heads than ranks, each KV head is replicated on world_size // num_kv_heads ranks.
    """

    def __init__(
        self,
        hidden_size,
        head_dim,
        num_heads,
        num_kv_heads,
        bias=False,
        quant_config=None,
        prefix="",
        params_dtype=None,
        checkpoint_layout: str = "concat",
    ):
        tp_size = current_build_context().tp.world_size
        self.head_dim = head_dim
        self.total_num_heads, self.total_num_kv_heads = num_heads, num_kv_heads
        self.checkpoint_layout = checkpoint_layout
        self.num_heads = divide(num_heads, tp_size, "number of attention heads")
        if num_kv_heads >= tp_size:
            self.num_kv_heads = divide(num_kv_heads, tp_size, "number of key/value heads")
            self.kv_replicas = 1
        else:
            self.num_kv_heads = 1
            self.kv_replicas = divide(tp_size, num_kv_heads, "shards per key/value head")
        q_size, kv_size = self.num_heads * head_dim, self.num_kv_heads * head_dim
        sizes = [q_size * tp_size, kv_size * tp_size, kv_size * tp_size]
        super().__init__(
            hidden_size, sum(sizes), bias, quant_config, prefix, params_dtype, output_sizes=sizes
        )
        self.q_size, self.kv_size = q_size, kv_size

    def weight_loader(self, param, loaded, shard_id=None):
        if shard_id is None:
            self._load_fused(param, loaded)
            return
        assert shard_id in ("q", "k", "v"), shard_id
        rank, tp_size = self.tp.rank, self.tp.world_size
        offset, size = {
            "q": (0, self.q_size),
            "k": (self.q_size, self.kv_size),
            "v": (self.q_size + self.kv_size, self.kv_size),
        }[shard_id]
        index, num_parts = rank, tp_size
        if shard_id != "q":
            index, num_parts = rank // self.kv_replicas, tp_size // self.kv_replicas
        dim = param.output_dim
        load_part(param.data.narrow(dim, offset, size), loaded, dim, index, num_parts)

    def _load_fused(self, param, loaded: torch.Tensor) -> None:
        """The checkpoint's single q/k/v tensor (weight [out, in] or bias [out]), split into the
        three shards after reordering a grouped layout to [q | k | v]."""
        dim = param.output_dim
        heads, kv_heads, d = self.total_num_heads, self.total_num_kv_heads, self.head_dim
        _check_fused(loaded, dim, (heads + 2 * kv_heads) * d)
        if self.checkpoint_layout == "grouped":
            group = heads // kv_heads
            blocks = loaded.unflatten(dim, (kv_heads, group + 2, d))  # [KVH, group+2, D, (in)]
            q = blocks.narrow(dim + 1, 0, group).flatten(dim, dim + 2)  # [H * D, (in)]
            k, v = (blocks.select(dim + 1, group + i).flatten(dim, dim + 1) for i in (0, 1))
        else:
            q, k, v = loaded.split([heads * d, kv_heads * d, kv_heads * d], dim=dim)
        for shard_id, part in zip("qkv", (q, k, v), strict=True):
            self.weight_loader(param, part, shard_id)


def _check_fused(loaded: torch.Tensor, dim: int, expected: int) -> None:
    if loaded.dim() <= dim or loaded.shape[dim] != expected:
        raise ModelLoadError(
            f"checkpoint shape {tuple(loaded.shape)} does not match the fused projection's "
            f"{expected} output features"
        )


class RowParallelLinear(LinearBase):
    """Input features split over ranks: y = all_reduce(x_local @ W_local^T) + b."""

    def __init__(
        self, input_size, output_size, bias=False, quant_config=None, prefix="", params_dtype=None
    ):
        tp_size = current_build_context().tp.world_size
        in_part = divide(input_size, tp_size, f"{prefix or 'linear'} input size")
        super().__init__(in_part, [output_size], bias, quant_config, prefix, params_dtype)

    def weight_loader(self, param, loaded, shard_id=None):
        # the bias has no input_dim: every rank holds all of it and adds it after the reduction
        load_part(
            param.data, loaded, getattr(param, "input_dim", None), self.tp.rank, self.tp.world_size
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.world_size == 1:
            return self.with_lora(x, self.quant_method.apply(self, x, self.bias))  # [T, out]
        y = tp_all_reduce(self.with_lora(x, self.quant_method.apply(self, x)))  # [T, out]
        return y + self.bias if self.bias is not None else y
