"""The quantized linear methods, one per CPU kernel family (csrc/quant.h), and the on-the-fly
quantisation each uses for full-precision checkpoints.

- `Int8LinearMethod`: int8 codes, any scale block (16, 32, 64, per column), symmetric or affine:
  eetq, bitsandbytes LLM.int8 (with its outlier columns), and every uniform code up to 8 bits
  (GGUF Q8_0, Q5_x, Q6_K, and mixes of them with 4-bit shards);
- `Int4LinearMethod`: 4-bit codes with 32-multiple blocks, symmetric or affine (Q4_0, Q4_1, Q4_K);
- `CodebookLinearMethod`: 4-bit table codes (bitsandbytes NF4 / FP4) through a lookup kernel;
- `Fp8LinearMethod`: e4m3 bytes with per-channel scales, fp32 activations only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pytgi.backends.base import QuantOps
from pytgi.layers.quantization.packed import (
    FP32_ACTIVATIONS,
    ActivationPolicy,
    PackedLinearMethod,
    Piece,
)
from pytgi.layers.quantization.quantizers import quantize_codebook, quantize_fp8

Quantizer = Callable[[torch.Tensor], Piece]


class _OnTheFly(PackedLinearMethod):
    def __init__(
        self,
        ops: QuantOps,
        policy: ActivationPolicy = ActivationPolicy(),
        quantizer: Quantizer | None = None,
    ):
        super().__init__(ops, policy)
        self.quantizer = quantizer

    def quantize(self, weight: torch.Tensor) -> Piece:
        if self.quantizer is None:
            return super().quantize(weight)
        return self.quantizer(weight)


class Int8LinearMethod(_OnTheFly):
    """int8 codes. With `outlier_threshold` > 0 (LLM.int8), each token row's outlier features
    (|x| >= threshold in that row) skip the int8 activation path: they multiply the dequantised
    weight columns in fp32 (bitsandbytes' mixed decomposition). bitsandbytes picks the outlier
    columns per batch (a feature is an outlier for every row when any row has it there); here
    each row picks its own, so a row's numbers never depend on its neighbours: equal to
    bitsandbytes for one row, and every outlier of every row still in full precision."""

    family = layout = "int8"

    def __init__(self, ops, policy=ActivationPolicy(), quantizer=None, outlier_threshold=0.0):
        super().__init__(ops, policy, quantizer)
        self.outlier_threshold = outlier_threshold

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.outlier_threshold <= 0 or not self._int8(x):
            return super().apply(layer, x, bias)
        mask = x.abs() >= self.outlier_threshold  # [T, in]: each row's own outliers
        outliers = mask.any(dim=0).nonzero().squeeze(1)  # [C]: the union, to gather once
        if outliers.numel() == 0:
            return super().apply(layer, x, bias)
        y = super().apply(layer, x.masked_fill(mask, 0.0), bias)  # [T, out]
        return y.add_(outlier_product(x, mask, outliers, layer.quant_packed.columns(outliers)))

    def fused_decode_tensors(self, layer, name: str) -> dict | None:
        if self.outlier_threshold > 0:  # the outlier columns' fp32 product runs here only
            return None
        return super().fused_decode_tensors(layer, name)

    def _int8(self, x: torch.Tensor) -> bool:
        return self.ops.compiled and self.policy.int8_acts(x.shape[0])


def outlier_product(
    x: torch.Tensor, mask: torch.Tensor, outliers: torch.Tensor, columns: torch.Tensor
) -> torch.Tensor:
    """sum_j x[t, j] w[:, j] over row t's outlier features j, in increasing j: [T, out].
    x, mask [T, in]; outliers [C] the union of the rows' outlier features; columns [out, C]
    their dequantised weight columns. One fp32 multiply-add per feature, in feature order, and
    exact zeros for a row's non-outliers: a row's sum is the same whoever shares the batch."""
    values = x.index_select(1, outliers) * mask.index_select(1, outliers)  # [T, C]
    acc = x.new_zeros(x.shape[0], columns.shape[0])  # [T, out]
    for c in range(outliers.numel()):
        acc.addcmul_(values[:, c : c + 1], columns[:, c].unsqueeze(0))
    return acc


class Int4LinearMethod(_OnTheFly):
    family = layout = "int4"


class CodebookLinearMethod(_OnTheFly):
    """bitsandbytes NF4 / FP4: 64-wide blocks, absmax scales, the format's code table."""

    family = layout = "codebook"

    def __init__(self, ops, policy=ActivationPolicy(), name: str = "nf4", block_size=64):
        super().__init__(ops, policy, lambda w: quantize_codebook(w, name, block_size))


class Fp8LinearMethod(_OnTheFly):
    """e4m3 codes, one scale per output feature; the kernels dequantise to fp32 panels."""

    family = "fp8"
    layout = "codebook"

    def __init__(self, ops, policy=FP32_ACTIVATIONS):
        super().__init__(ops, FP32_ACTIVATIONS, quantize_fp8)
