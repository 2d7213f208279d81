"""Gated activations on a fused [gate | up] projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pytgi.layers.custom_op import CustomOp


class SiluAndMul(CustomOp):
    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)  # [T, I] each
        return F.silu(gate) * up  # [T, I]

    def forward_cpu(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or not x.is_contiguous():
            return self.forward_native(x)
        return self.kernels.silu_and_mul(x)  # one pass instead of two strided ops (and outputs)

    def forward_cuda(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.stride(-1) != 1:
            return self.forward_native(x)
        return self.kernels.silu_and_mul(x)  # one Triton kernel instead of three launches


class GeluAndMul(CustomOp):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)  # [T, I] each
        return F.gelu(gate, approximate=self.approximate) * up  # [T, I]


ACTIVATIONS = {
    "silu": SiluAndMul,
    "gelu": GeluAndMul,
    "gelu_pytorch_tanh": lambda: GeluAndMul("tanh"),
}
