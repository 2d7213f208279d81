"""RMSNorm with an optional fused residual add (computed in fp32, as transformers does); one
compiled kernel on CPU (fp32), one Triton kernel on CUDA."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pytgi.layers.custom_op import CustomOp


class RMSNorm(CustomOp):
    def __init__(self, hidden_size: int, eps: float = 1e-6, params_dtype=None):
        super().__init__()
        self.eps = eps
        dtype = params_dtype or torch.get_default_dtype()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        shape = (x.shape[-1],)
        if x.dtype == torch.float32:  # one fused op; bitwise equal to the unfused fp32 formula
            return F.rms_norm(x, shape, self.weight, self.eps)
        normed = F.rms_norm(x.float(), shape, None, self.eps)  # [..., D]
        return self.weight * normed.to(x.dtype)

    def forward_native(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """norm(x), or with `residual`: (norm(residual + x), residual + x) for pre-norm blocks."""
        if residual is None:
            return self._norm(x)
        x = residual + x
        return self._norm(x), x

    def forward_cpu(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """The compiled kernel writes residual + x into `residual` (its owner, the decoder stack,
        never reads the old value again)."""
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
