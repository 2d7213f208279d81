"""MLP activations: gated ones on a fused [gate | up] projection (`GATED_ACTIVATIONS`) and plain
ones on a single projection (`ACTIVATIONS`), by their Hugging Face `hidden_act` names.

GELU comes in two spellings: exact (erf, "gelu") and the tanh approximation ("gelu_new",
"gelu_pytorch_tanh", "gelu_fast": the same function, transformers' formulas differ in rounding
only). The compiled CPU kernels fuse a gated activation with its product (one pass instead of two
strided ops and an intermediate) and run the plain tanh GELU (~3x F.gelu); a plain exact GELU
stays F.gelu, faster than the kernel's erf at prefill sizes (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pytgi.errors import ModelLoadError
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

    def forward_cpu(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or not x.is_contiguous():
            return self.forward_native(x)
        return self.kernels.gelu_and_mul(x, self.approximate == "tanh")


class Gelu(CustomOp):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate
        if approximate != "tanh":  # torch's vectorised erf beats the kernel's past ~16 rows
            self._forward = self.forward_native

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate=self.approximate)

    def forward_cpu(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_contiguous():
            return self.forward_native(x)
        return self.kernels.gelu(x, self.approximate == "tanh")


class Silu(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x)


_TANH_GELU = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")

GATED_ACTIVATIONS = {
    "silu": SiluAndMul,
    "gelu": GeluAndMul,
    **{name: (lambda: GeluAndMul("tanh")) for name in _TANH_GELU},
}
ACTIVATIONS = {
    "silu": Silu,
    "gelu": Gelu,
    **{name: (lambda: Gelu("tanh")) for name in _TANH_GELU},
}


def get_activation(name: str, gated: bool) -> torch.nn.Module:
    """The activation module for HF `hidden_act` `name`; ModelLoadError when pytgi has none."""
    table = GATED_ACTIVATIONS if gated else ACTIVATIONS
    if name not in table:
        raise ModelLoadError(
            f"unsupported hidden_act '{name}' (supported: {', '.join(sorted(table))})"
        )
    return table[name]()
