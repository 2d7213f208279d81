"""RMSNorm with an optional fused residual add (computed in fp32, as transformers does)."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6, params_dtype=None):
        super().__init__()
        self.eps = eps
        dtype = params_dtype or torch.get_default_dtype()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x if x.dtype == torch.float32 else x.float()
        variance = x32.pow(2).mean(-1, keepdim=True)  # [..., 1]
        normed = x32 * torch.rsqrt(variance + self.eps)  # [..., D]
        return self.weight * (normed if normed.dtype == x.dtype else normed.to(x.dtype))

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """norm(x), or with `residual`: (norm(residual + x), residual + x) for pre-norm blocks."""
        if residual is None:
            return self._norm(x)
        x = residual + x
        return self._norm(x), x
