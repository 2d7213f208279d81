"""Normalisation layers with an optional fused residual add: RMSNorm (Llama; Gemma's (1 + w)
variant) and LayerNorm with or without a bias. Both compute in fp32, as transformers does; one
compiled kernel each on CPU (fp32), a Triton kernel for Llama's RMSNorm on CUDA.

Contract of both (the decoder blocks carry the residual stream separately): `norm(x)` returns the
normalised x; `norm(x, residual)` returns (norm(residual + x), residual + x). The compiled CPU
kernels write residual + x into `residual` in place (its owner, the decoder stack, never reads the
old value again): use the returned tensors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pytgi.layers.custom_op import CustomOp


class _ResidualNorm(CustomOp):
    """A norm that can take the residual stream: norm(x), or (norm(residual + x), residual + x).
    Subclasses define `_norm` (the reference); their kernels fuse the add the same way."""

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward_native(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return self._norm(x)
        x = residual + x
        return self._norm(x), x


class RMSNorm(_ResidualNorm):
    """weight * x / sqrt(mean(x^2) + eps). With `weight_offset` (Gemma: 1.0) the scale is
    offset + w: `process_weights_after_loading` folds the offset into an fp32 weight once, and the
    product is taken in fp32 before the cast (Gemma's order; Llama casts first)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, params_dtype=None, weight_offset=0.0):
        super().__init__()
        self.eps = eps
        self.weight_offset = weight_offset
        dtype = params_dtype or torch.get_default_dtype()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)
        if weight_offset:
            self.native_on("cuda")  # the Triton kernel rounds before the weight, Llama's order

    def process_weights_after_loading(self) -> None:
        if self.weight_offset:
            self.weight.data = self.weight.data.float() + self.weight_offset  # [D] fp32

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        shape = (x.shape[-1],)
        if x.dtype == torch.float32:  # one fused op; bitwise equal to the unfused fp32 formula
            return F.rms_norm(x, shape, self.weight.float(), self.eps)
        normed = F.rms_norm(x.float(), shape, None, self.eps)  # [..., D]
        if self.weight_offset:
            return (normed * self.weight).to(x.dtype)
        return self.weight * normed.to(x.dtype)

    def forward_cpu(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if not x.is_contiguous() or (residual is not None and not residual.is_contiguous()):
            return self.forward_native(x, residual)
        if residual is None:
            return self.kernels.rms_norm(x, self.weight, self.eps)
        return self.kernels.add_rms_norm_(x, residual, self.weight, self.eps), residual

    def forward_cuda(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """The Triton kernel, which (like the CPU one) writes residual + x into `residual`."""
        if x.stride(-1) != 1 or (residual is not None and not residual.is_contiguous()):
            return self.forward_native(x, residual)
        if residual is None:
            return self.kernels.rms_norm(x, self.weight, self.eps)
        return self.kernels.add_rms_norm_(x, residual, self.weight, self.eps), residual


class LayerNorm(_ResidualNorm):
    """(x - mean) / sqrt(var + eps) * weight (+ bias), over the last dimension."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, bias: bool = True, params_dtype=None):
        super().__init__()
        self.eps = eps
        dtype = params_dtype or torch.get_default_dtype()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.zeros(hidden_size, dtype=dtype), requires_grad=False)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        shape = (x.shape[-1],)
        if x.dtype == torch.float32:
            return F.layer_norm(x, shape, self.weight, self.bias, self.eps)
        bias = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), shape, self.weight.float(), bias, self.eps).to(x.dtype)

    def forward_cpu(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if not x.is_contiguous() or (residual is not None and not residual.is_contiguous()):
            return self.forward_native(x, residual)
        if residual is None:
            return self.kernels.layer_norm(x, self.weight, self.bias, self.eps)
        return self.kernels.add_layer_norm_(x, residual, self.weight, self.bias, self.eps), residual
