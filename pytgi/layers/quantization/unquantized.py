"""The plain path: a dense weight [out, in] in the model dtype and `F.linear`.

On CPU in fp32, a layer with at least as many outputs as inputs keeps its weight column-major
(still a logical [out, in] tensor, stored as the contiguous transpose): MKL then streams the
weight as x @ W^T without a transposed GEMV, 1.1-1.9x faster at 1-16 rows (decode) and the same
at prefill sizes; layers with fewer outputs than inputs (down_proj) run faster row-major
(docs/PERFORMANCE.md, "Kernel choices").
"""

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

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        weight = layer.weight
        out_features, in_features = weight.shape
        if weight.device.type == "cpu" and weight.dtype == torch.float32:
            if out_features >= in_features and weight.is_contiguous():
                weight.data = weight.data.t().contiguous().t()  # [out, in], strides (1, out)

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return F.linear(x, layer.weight, bias)
