"""The base of the quantized CPU linear methods: load shards, pack them, multiply.

Loading: the method registers a placeholder `weight` parameter whose loader hands the layer's own
`weight_loader` a `ShardCollector` in place of the weight tensor. The layer's code then slices
exactly as it does for dense tensors (TP rank, fused q/k/v and gate/up offsets) and `copy_`s each
piece into the collector: a float tensor is quantised on arrival (so at most one checkpoint
tensor is ever held in float), a `QuantizedWeight` / `CodebookWeight` is kept as it is (its
`narrow` does the TP slicing: rows exact, columns on block boundaries). Once every row of the
layer has arrived the platform packs the pieces into its kernels' layout for the `layout` the
method declares, and they are dropped.

Multiplying: the platform's `QuantOps` (chosen once at start-up, kernel table included; the
pure-torch reference when it has no kernels), int8 or fp32 activations by the method's
`ActivationPolicy`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pytgi.backends.base import QuantOps
from pytgi.errors import ModelLoadError
from pytgi.layers.quantization.base import LinearMethod, set_weight_attrs
from pytgi.layers.quantization.quantized_weight import CodebookWeight, QuantizedWeight

logger = logging.getLogger(__name__)

Piece = QuantizedWeight | CodebookWeight


@dataclass(frozen=True)
class ActivationPolicy:
    """Which activation mode a layer runs at M rows: int8 from `int8_from_rows` rows on (None:
    never). int8 activations are exact integer products of rounded activations; fp32 activations
    use the weights' exact values (docs/PERFORMANCE.md, "Quantized kernels", has the trade-off)."""

    int8_from_rows: int | None = 1

    def int8_acts(self, rows: int) -> bool:
        return self.int8_from_rows is not None and rows >= self.int8_from_rows


FP32_ACTIVATIONS = ActivationPolicy(None)


class CollectedRows:
    """A layer's local weight [N, K] as it arrives, piece by piece: each piece (a float tensor is
    quantised by `quantize`) is kept at its row offset, and `on_complete(pieces)` runs once all
    N rows are in."""

    def __init__(self, n: int, k: int, quantize: Callable, on_complete: Callable):
        self.n, self.k = n, k
        self.quantize, self._on_complete = quantize, on_complete
        self._pieces: dict[int, Piece] = {}

    def add(self, offset: int, piece: Piece) -> None:
        self._pieces[offset] = piece
        if self.missing == 0:
            pieces = [self._pieces[o] for o in sorted(self._pieces)]
            self._pieces.clear()
            self._on_complete(pieces)

    @property
    def missing(self) -> int:
        return self.n - sum(p.shape[0] for p in self._pieces.values())


class ShardCollector:
    """Stands in for rows [offset, offset + length) of a layer's local weight in its weight
    loader: `narrow(0, ...)` selects rows (another view of the same `CollectedRows`), and
    `copy_(piece)` hands a piece over at its row offset."""

    def __init__(self, rows: CollectedRows, offset: int = 0, length: int | None = None):
        self.rows = rows
        self.offset, self.length = offset, rows.n if length is None else length

    @property
    def shape(self) -> torch.Size:
        return torch.Size([self.length, self.rows.k])

    def narrow(self, dim: int, start: int, length: int) -> ShardCollector:
        assert dim == 0, "the layers narrow their weight along output features only"
        return ShardCollector(self.rows, self.offset + start, length)

    def copy_(self, src) -> None:
        if tuple(src.shape) != (self.length, self.rows.k):
            raise ModelLoadError(
                f"shard {tuple(src.shape)} does not fit rows of {tuple(self.shape)}"
            )
        piece = self.rows.quantize(src) if isinstance(src, torch.Tensor) else src  # else a piece
        self.rows.add(self.offset, piece)


class PackedLinearMethod(LinearMethod):
    """A quantized linear layer on the platform's `QuantOps`. Subclasses give `quantize`
    (on-the-fly, from a float tensor) and the `layout` their pieces pack into ("int8", "int4",
    "auto": int4 when every piece fits it, "codebook")."""

    family = "quantized"
    layout = "auto"

    def __init__(self, ops: QuantOps, policy: ActivationPolicy = ActivationPolicy()):
        self.ops = ops
        self.policy = policy

    def quantize(self, weight: torch.Tensor) -> Piece:
        raise ModelLoadError(f"the {self.family} method loads pre-quantized weights only")

    def pack(self, pieces: list[Piece]) -> Any:
        return self.ops.pack(pieces, self.layout)

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes,
                       params_dtype, weight_loader) -> None:  # fmt: skip
        n, k = sum(output_partition_sizes), input_size_per_partition

        def finish(pieces: list[Piece]) -> None:
            layer.quant_packed = self._pack_logged(pieces, getattr(layer, "prefix", ""))

        collector = ShardCollector(CollectedRows(n, k, self.quantize, finish))
        placeholder = nn.Parameter(torch.empty(0), requires_grad=False)
        stand_in = _LoaderParam(collector)

        def load(param, loaded, shard_id=None) -> None:
            args = (stand_in, loaded) if shard_id is None else (stand_in, loaded, shard_id)
            weight_loader(*args)

        set_weight_attrs(placeholder, weight_loader=load, output_dim=0, input_dim=1)
        layer.register_parameter("weight", placeholder)
        layer.quant_collector = collector
        layer.quant_packed = None

    def _pack_logged(self, pieces: list[Piece], prefix: str) -> Any:
        packed = self.pack(pieces)
        kinds = {p.layout_key() for p in pieces}
        if len(kinds) > 1 or not isinstance(pieces[0], QuantizedWeight) or pieces[0].bits > 4:
            logger.debug(
                "%s: %s -> %s kernel (scale block %s)", prefix or "linear", packed.source,
                packed.format_name, packed.scale_block or "per column",
            )  # fmt: skip
        if len(kinds) > 1:
            logger.info("%s: converted %s to one %s kernel", prefix, packed.source,
                        packed.format_name)  # fmt: skip
        return packed

    def process_weights_after_loading(self, layer) -> None:
        if layer.quant_packed is None:
            raise ModelLoadError(
                f"{getattr(layer, 'prefix', '') or 'a quantized linear'}: "
                f"{layer.quant_collector.rows.missing} output rows were never loaded"
            )

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        x = x if x.stride(-1) == 1 else x.contiguous()  # [T, in]
        int8 = self.policy.int8_acts(x.shape[0]) and self.ops.compiled
        return self.ops.linear(x, layer.quant_packed, bias, int8)  # [T, out]

    def fused_decode_tensors(self, layer, name: str) -> dict | None:
        """The packed weight for the fused decode stack, which runs int8 activations at every row
        count: only when this method does too (and the format has an int8 kernel)."""
        packed = layer.quant_packed
        if not (self.ops.compiled and self.policy.int8_acts(1) and packed.takes_int8_activations):
            return None
        if getattr(packed, "kernel_family", None) == "kquant":
            return None  # native K-quants (Q4_K / Q6_K) are not in the decode stack yet
        layout = (packed.format, packed.n, packed.k, packed.scale_block)
        tensors = {
            f"{name}.codes": packed.codes,
            f"{name}.scales": packed.scales,
            f"{name}.layout": torch.tensor(layout, dtype=torch.int64),
        }
        if packed.mins is not None:
            tensors[f"{name}.mins"] = packed.mins
        if packed.table is not None:
            tensors[f"{name}.table"] = packed.table
        if getattr(layer, "bias", None) is not None:
            tensors[f"{name}_bias"] = layer.bias.data
        return tensors

    def rows(self, layer, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of the dequantised weight [T, K] (a tied embedding's lookup)."""
        return self.ops.rows(ids, layer.quant_packed)


class _LoaderParam:
    """What a layer's weight_loader reads from its parameter: data, output_dim, input_dim."""

    def __init__(self, collector: ShardCollector):
        self.data = collector
        self.output_dim, self.input_dim = 0, 1
