"""The plain path: a dense weight [out, in] in the model dtype.

CPU fp32 layouts, chosen after loading (measurements in docs/PERFORMANCE.md, "Kernel choices"):
- with the compiled CPU kernels: the weight is packed as 16-column tiles [ceil(out/16), in, 16]
  (zero-padded) and `linear_packed` runs every batch size on it;
- without them: a layer with at least as many outputs as inputs keeps its weight column-major
  (still a logical [out, in] tensor, stored as the contiguous transpose), which MKL streams
  faster at decode sizes; narrower layers (down_proj) stay row-major.
Everywhere else: `F.linear` on the checkpoint's row-major weight.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from pytgi.layers.quantization.base import LinearMethod, set_weight_attrs
from pytgi.utils.math import cdiv

TILE = 16  # output columns per packed tile (the kernel's register tile)


def pack_column_tiles(weight: torch.Tensor, tile: int = TILE) -> torch.Tensor:
    """[N, K] -> [ceil(N / tile), K, tile], zero-padded past N."""
    n, k = weight.shape
    num_tiles = cdiv(n, tile)
    padded = weight.new_zeros(num_tiles * tile, k)
    padded[:n] = weight
    return padded.view(num_tiles, tile, k).transpose(1, 2).contiguous()


def packed_matmul(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None, kernels=None
) -> torch.Tensor:
    """x [M, K] @ packed [C, K, n] (+ bias [C * n]) -> [M, C * n]: the compiled kernel when given
    (n = TILE), else one batched torch matmul over the tiles (any tile width)."""
    if kernels is not None:
        return kernels.linear_packed(x, packed, bias)
    num_tiles, _, width = packed.shape
    y = torch.matmul(x.unsqueeze(0), packed).transpose(0, 1).reshape(-1, num_tiles * width)
    return y if bias is None else y + bias


class UnquantizedLinearMethod(LinearMethod):
    def __init__(self, kernels=None):
        self.kernels = kernels  # the platform's compiled kernels for the model's dtype, or None

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
        layer.weight_packed = None  # [ceil(out/16), in, 16] once packed (CPU fp32 kernels)
        layer.bias_packed = None  # [ceil(out/16) * 16]

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        weight = layer.weight
        out_features, in_features = weight.shape
        if weight.device.type != "cpu" or weight.dtype != torch.float32:
            return
        if self.kernels is not None:
            layer.weight_packed = pack_column_tiles(weight.data)
            layer.packed_out_features = out_features
            bias = getattr(layer, "bias", None)
            if bias is not None:
                width = layer.weight_packed.shape[0] * TILE
                layer.bias_packed = torch.cat([bias.data, bias.new_zeros(width - out_features)])
            weight.data = weight.data.new_empty(0, in_features)  # the tiles hold it now
        elif out_features >= in_features and weight.is_contiguous():
            weight.data = weight.data.t().contiguous().t()  # [out, in], strides (1, out)

    def fused_decode_tensors(self, layer: torch.nn.Module, name: str) -> dict | None:
        if layer.weight_packed is None:  # not fp32, or without the kernels
            return None
        tensors = {name: layer.weight_packed}  # [ceil(out/16), in, 16]
        if layer.bias_packed is not None:
            tensors[f"{name}_bias"] = layer.bias_packed
        return tensors

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        packed = layer.weight_packed
        if packed is None:
            return F.linear(x, layer.weight, bias)
        tiled_bias = layer.bias_packed if bias is not None else None
        y = packed_matmul(x, packed, tiled_bias, self.kernels)  # [T, in] -> [T, ceil(out/16)*16]
        out_features = layer.packed_out_features
        return y if y.shape[-1] == out_features else y[..., :out_features]
