"""Gated activations on a fused [gate | up] projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pytgi.backends.cpu.kernels import cpu_kernels_for


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ops = cpu_kernels_for(x)
        if ops is not None and x.dim() == 2 and x.is_contiguous():
            return ops.silu_and_mul(x)  # one pass instead of two strided ops (and their outputs)
        gate, up = x.chunk(2, dim=-1)  # [T, I] each
        return F.silu(gate) * up  # [T, I]


class GeluAndMul(nn.Module):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)  # [T, I] each
        return F.gelu(gate, approximate=self.approximate) * up  # [T, I]


ACTIVATIONS = {
    "silu": SiluAndMul,
    "gelu": GeluAndMul,
    "gelu_pytorch_tanh": lambda: GeluAndMul("tanh"),
}
