"""The quantization strategy interface held by every linear layer.

A `QuantConfig` (found from the checkpoint's `quantization_config` or `--quantize`) hands each
linear layer a `LinearMethod`. The method creates the layer's weight parameters (in the layer's
local shard shape), post-processes them after loading (repacking, transposes) and applies the
matmul. Parallel layers stay one class whatever the format.

Sharding contract: each parameter a method creates carries `output_dim` and/or `input_dim`
attributes (the tensor dim that holds output features / input features, or None when it holds
neither), so the layer's `weight_loader` knows which dimension of a checkpoint tensor to narrow for
this rank.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from pytgi.backends.base import QuantOps


class LinearMethod(ABC):
    """How one linear layer stores and applies its weight."""

    @abstractmethod
    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        params_dtype: torch.dtype,
        weight_loader: Callable,
    ) -> None:
        """Register this rank's parameters on `layer` (one output size per packed shard)."""

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:  # noqa: B027
        """Turn loaded checkpoint tensors into the layout `apply` wants (default: nothing to do)."""

    @abstractmethod
    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x [T, in_per_partition] -> [T, out_per_partition]."""

    def fused_decode_tensors(self, layer: torch.nn.Module, name: str) -> dict | None:
        """The loaded weight (and bias) as the fused CPU decode stack takes linear `name`
        (backends/cpu/csrc/decode_stack.cpp: fp32 tiles `name`, or a quantized weight
        `name.codes` / `.scales` / `.mins` / `.table` / `.layout`, and `name_bias`); None when
        the stack cannot compute this layer exactly as `apply` does."""
        return None


class QuantConfig(ABC):
    """A quantization format: which `LinearMethod` each linear layer uses."""

    name: str
    # whether the checkpoint hands mixture-of-experts weights over in full precision (GGUF's
    # experts are dequantized at load); MoE layers refuse a format that would quantize them
    experts_in_full_precision: bool = False

    @abstractmethod
    def get_linear_method(self, prefix: str, ops: QuantOps) -> LinearMethod:
        """The method for the linear layer at `prefix` (a format may leave some unquantized);
        `ops` are the platform's quantized products for the model (the build context's)."""

    def get_lm_head_method(self, ops: QuantOps) -> LinearMethod | None:
        """The method of the LM head's vocabulary rows, or None to keep it in full precision."""
        return None

    def get_embedding_method(self, ops: QuantOps) -> LinearMethod | None:
        """The method holding an untied token embedding's rows (looked up dequantised), or None
        to keep it in full precision."""
        return None


def set_weight_attrs(param: torch.nn.Parameter, **attrs) -> None:
    """Attach loader metadata (weight_loader, output_dim, input_dim) to a parameter."""
    for key, value in attrs.items():
        assert not hasattr(param, key), f"parameter already has attribute {key!r}"
        setattr(param, key, value)
