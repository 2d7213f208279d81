"""Quantized linear products on CPU (`CpuQuantOps`, the platform's `QuantOps`): the compiled
kernels (csrc/quant_ops.cpp) on the kernel table chosen at start-up, else the pure-torch
reference path, which always works.

Two activation modes (the caller picks one per layer, see pytgi/layers/quantization/packed.py):
- int8 activations: x quantised per row and 32-wide block to int8 (ties to even), integer dot
  products, float epilogue per block. The kernels only; the torch function
  `int8_acts_reference` computes the same product in float64 for the tests.
- fp32 activations: exact weights (the dequantised values), fp32 math. Kernels: a dequantised
  fp32 panel per 16-column tile under the fp32 packed-tile GEMM; torch: dequantised chunks of
  output features under `torch.matmul`, never the whole matrix at once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import ModuleType

import torch

from pytgi.backends.base import QuantOps
from pytgi.backends.cpu import kquant_layout, quant_packing
from pytgi.backends.cpu.kquant_layout import KQuantStack, PackedKQuantWeight
from pytgi.backends.cpu.quant_layout import (
    GROUP,
    INT4,
    KBLOCK,
    LUT4,
    PackedQuantWeight,
)
from pytgi.utils.math import cdiv

logger = logging.getLogger(__name__)
_LOGGED: list[bool] = []  # the native K-quant line is logged once per process

CHUNK_GROUPS = 256  # the torch path dequantises 2048 output features at a time


@dataclass(frozen=True)
class CpuQuantOps(QuantOps):
    """`module`: the compiled kernels (None: the pure-torch reference); `isa`: the kernel table
    every call names ("auto": the best this build and CPU have; the platform resolves
    DeviceConfig.quant_isa to a table once, at start-up)."""

    module: ModuleType | None
    isa: str = "auto"
    native_kquants: bool = False  # DeviceConfig.native_kquants (PYTGI_NATIVE_KQUANTS)

    @property
    def compiled(self) -> bool:
        return self.module is not None

    def pack(self, pieces: list, layout: str) -> PackedQuantWeight:
        packed = quant_packing.pack(pieces, layout, self.native_kquants)
        if packed.kernel_family == kquant_layout.KERNEL_FAMILY and not _LOGGED:
            _LOGGED.append(True)
            logger.info("GGUF Q4_K / Q6_K layers on the native K-quant kernels "
                        "(PYTGI_NATIVE_KQUANTS=1)")  # fmt: skip
        return packed

    def linear(
        self, x: torch.Tensor, packed: PackedQuantWeight, bias: torch.Tensor | None, int8_acts: bool
    ) -> torch.Tensor:
        if getattr(packed, "kernel_family", None) == kquant_layout.KERNEL_FAMILY:
            return self._kquant_linear(x, packed, bias, int8_acts)
        if self.module is not None:
            return self.module.quant_linear(x, *packed.kernel_args(), bias, int8_acts, self.isa)
        return torch_linear(x, packed, bias)

    def _kquant_linear(self, x, packed, bias, int8_acts: bool) -> torch.Tensor:
        """Native Q4_K / Q6_K (kquant_layout.py): one kernel call per run of one type."""
        if self.module is None:
            return kquant_layout.torch_linear(x, packed, bias)
        if isinstance(packed, PackedKQuantWeight):
            return self.module.kquant_linear(x, *packed.kernel_args(), bias, int8_acts, self.isa)
        biases = [None] * len(packed.parts) if bias is None else bias.split(
            [p.n for p in packed.parts])  # fmt: skip
        return torch.cat(
            [self.module.kquant_linear(x, *p.kernel_args(), b, int8_acts, self.isa)
             for p, b in zip(packed.parts, biases, strict=True)], dim=1,
        )  # fmt: skip

    def rows(self, ids: torch.Tensor, packed: PackedQuantWeight) -> torch.Tensor:
        if isinstance(packed, KQuantStack):
            return packed.rows(ids)
        if isinstance(packed, PackedKQuantWeight):
            if self.module is None:
                return packed.rows(ids)
            return self.module.kquant_rows(ids.contiguous(), *packed.kernel_args())
        if self.module is not None:
            return self.module.quant_rows(ids.contiguous(), *packed.kernel_args(), self.isa)
        return packed.rows(ids)


def torch_linear(
    x: torch.Tensor, packed: PackedQuantWeight, bias: torch.Tensor | None
) -> torch.Tensor:
    """The reference path: fp32 activations against dequantised chunks of the weight."""
    out = x.new_empty(x.shape[0], packed.n)  # [M, N]
    for g0 in range(0, cdiv(packed.n, GROUP), CHUNK_GROUPS):
        g1 = min(g0 + CHUNK_GROUPS, cdiv(packed.n, GROUP))
        n0, n1 = g0 * GROUP, min(g1 * GROUP, packed.n)
        w = packed.dequantize(g0, g1)[: n1 - n0]  # [n1 - n0, K]
        torch.matmul(x, w.t(), out=out[:, n0:n1])
    return out if bias is None else out + bias


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q [M, Kp] int32 in -127..127, scale [M, KB] float32), exactly as the
    kernels quantise: scale = max|x| / 127 per 32-wide block, q = round(x * (127 / max|x|))."""
    m, k = x.shape
    kp = cdiv(k, KBLOCK) * KBLOCK
    blocks = torch.zeros(m, kp, dtype=torch.float32)
    blocks[:, :k] = x
    blocks = blocks.view(m, -1, KBLOCK)
    amax = blocks.abs().amax(dim=2, keepdim=True)  # [M, KB, 1]
    # a true division, as the kernels do: `127.0 / amax` would be reciprocal(amax) * 127 in torch,
    # two roundings, which moves x * inv across a .5 now and then
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0).div(amax), torch.zeros_like(amax))
    q = torch.round(blocks * inv).int().view(m, kp)
    return q, (amax / 127.0).squeeze(2)


def int8_acts_reference(x: torch.Tensor, packed: PackedQuantWeight) -> torch.Tensor:
    """The int8-activation product in float64: quantised activations times the weights the
    integer kernels use (for 4-bit table codes the int8 table, round(127 t) / 127)."""
    q, scale = quantize_activations(x)
    x_eff = (q.double() * scale.double().repeat_interleave(KBLOCK, dim=1))[:, : packed.k]
    codes, scales, mins = packed.unpack()
    if packed.format == LUT4:
        table_i8 = torch.round(packed.table * 127.0) / 127.0
        values = table_i8.double()[codes.long()]
    elif packed.format == INT4 and mins is None:
        values = (codes - 8).double()
    else:
        values = codes.double()
    w = values * scales.double() + (0.0 if mins is None else mins.double())
    return x_eff @ w[: packed.n, : packed.k].t()
