"""The plain path: a dense weight [out, in] in the model dtype and `F.linear`."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from pytgi.layers.quantization.base import LinearMethod, set_weight_attrs


class UnquantizedLinearMethod(LinearMethod):
    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        params_dtype: torch.dtype,
        weight_loader: Callable,
    ) -> None:
        weight = torch.nn.Parameter(
            torch.empty(sum(output_partition_sizes), input_size_per_partition, dtype=params_dtype),
            requires_grad=False,
        )
        set_weight_attrs(weight, weight_loader=weight_loader, output_dim=0, input_dim=1)
        layer.register_parameter("weight", weight)

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return F.linear(x, layer.weight, bias)
