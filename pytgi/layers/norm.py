"""RMSNorm with an optional fused residual add (computed in fp32, as transformers does)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pytgi.backends.cpu.kernels import cpu_kernels_for


class RMSNorm(nn.Module):
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

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """norm(x), or with `residual`: (norm(residual + x), residual + x) for pre-norm blocks.
        The compiled CPU kernel writes residual + x into `residual` (its owner, the decoder
        stack, never reads the old value again)."""
        ops = cpu_kernels_for(x)
        if ops is not None and x.is_contiguous() and self.weight.dtype == torch.float32:
            if residual is None:
                return ops.rms_norm(x, self.weight, self.eps)
            if residual.is_contiguous():
                return ops.add_rms_norm_(x, residual, self.weight, self.eps), residual
        if residual is None:
            return self._norm(x)
        x = residual + x
        return self._norm(x), x
