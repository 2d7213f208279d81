"""Pre-quantized checkpoints (GPTQ, AWQ, compressed-tensors, FP8) on the CPU kernels.

Loading: `PrequantizedTensors` sits between the safetensors files and the model's weight
mapper. It gathers each quantized module's tensors (e.g. `q_proj.qweight`, `.qzeros`,
`.scales`, `.g_idx`), turns them into one piece (prequantized_formats.py) and hands it on as
`q_proj.weight`, so the layers' own loaders do the fused q/k/v and gate/up offsets and the
tensor-parallel slicing: rows exactly, columns on group boundaries (else a one-line error);
act-order pieces slice anywhere and sort their columns at pack time. Every other tensor (norms,
embeddings, an unquantized LM head, biases) passes through.

Computing: `PrequantizedLinearMethod` packs the pieces once into the kernels' layout (4-bit
codes with 32-multiple groups into the 4-bit kernel, other widths into the int8 kernel, e4m3
into the fp8 kernel) and multiplies with full-precision activations: these are weight-only
formats, and each output row depends on its own input row only. An act-order layer first
gathers its input columns into group order (`input_perm`).
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

from pytgi.backends.base import QuantOps
from pytgi.errors import ModelLoadError
from pytgi.layers.quantization.base import LinearMethod, QuantConfig
from pytgi.layers.quantization.detect import CheckpointQuant
from pytgi.layers.quantization.int_packing import GroupIndexedWeight
from pytgi.layers.quantization.packed import FP32_ACTIVATIONS, PackedLinearMethod, Piece
from pytgi.layers.quantization.prequantized_formats import PrequantizedFormat, format_for
from pytgi.layers.quantization.quantized_weight import CodebookWeight

logger = logging.getLogger(__name__)

# attention-output scales of a kv_cache_scheme checkpoint: q_scale has no use here (dropped); the
# KV ones pass through to the loader, which gives them to the attention layers (an fp8_e4m3fn
# cache applies them, as TGI does)
DROPPED_SCALES = ("q_scale",)


class PrequantizedTensors:
    """The checkpoint's tensor names and tensors with each quantized module's parts replaced by
    one `<module>.weight` piece."""

    def __init__(self, fmt: PrequantizedFormat, names: Iterable[str]):
        self.fmt = fmt
        names = list(names)
        marked = {m for m, part in map(_split, names) if fmt.is_marker(part)}
        self.parts: dict[str, set[str]] = defaultdict(set)
        for name in names:
            module, part = _split(name)
            if module in marked and part in fmt.parts:
                self.parts[module].add(part)
        self._names = names
        dropped = [n for n in names if _split(n)[1] in DROPPED_SCALES]
        if dropped:
            logger.info("%d attention q_scale tensors are not applied", len(dropped))

    @property
    def modules(self) -> set[str]:
        """The checkpoint modules stored quantized (e.g. model.layers.0.self_attn.q_proj)."""
        return set(self.parts)

    def names(self) -> list[str]:
        out, seen = [], set()
        for name in self._names:
            module, part = _split(name)
            if part in DROPPED_SCALES:
                continue
            if module in self.parts and part in self.parts[module]:
                if module not in seen:
                    seen.add(module)
                    out.append(f"{module}.weight")
                continue
            out.append(name)
        return out

    def tensors(self, stream: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, object]]:
        pending: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
        for name, tensor in stream:
            module, part = _split(name)
            if part in DROPPED_SCALES:
                continue
            if module not in self.parts or part not in self.parts[module]:
                yield name, tensor
                continue
            pending[module][part] = tensor
            if set(pending[module]) == self.parts[module]:
                parts = pending.pop(module)
                try:
                    piece = self.fmt.assemble(module, parts)
                except (KeyError, RuntimeError, ValueError) as err:
                    raise ModelLoadError(
                        f"{module}: cannot read its {self.fmt.name} tensors ({err})"
                    ) from None
                yield f"{module}.weight", piece


def _split(name: str) -> tuple[str, str]:
    module, _, part = name.rpartition(".")
    return module, part


class PrequantizedLinearMethod(PackedLinearMethod):
    """A layer stored quantized in the checkpoint: its pieces packed once, fp32 activations."""

    family = "prequantized"

    def __init__(self, ops: QuantOps, method: str, policy=FP32_ACTIVATIONS):
        super().__init__(ops, policy)
        self.method = method
        self.input_perm: torch.Tensor | None = None  # [K'] act-order gather (K: a zero column)

    def quantize(self, weight: torch.Tensor) -> Piece:
        raise ModelLoadError(
            f"a full-precision shard ({tuple(weight.shape)}) in a layer the {self.method} "
            "checkpoint stores quantized: mixed fused layers are not supported"
        )

    def pack(self, pieces: list) -> Any:
        if any(isinstance(p, GroupIndexedWeight) for p in pieces):
            pieces = self._sort_act_order(pieces)
        if all(isinstance(p, CodebookWeight) for p in pieces):
            self.policy = FP32_ACTIVATIONS  # e4m3 codes have no int8-activation kernel
            return self.ops.pack(pieces, "codebook")
        if any(isinstance(p, CodebookWeight) for p in pieces):
            raise ModelLoadError("fp8 and integer shards in one fused layer")
        packed = self.ops.pack(pieces, "auto")
        if self.input_perm is not None:  # gathered where the activations are (a GPU's weights)
            self.input_perm = self.input_perm.to(packed.codes.device)
        return packed

    def _sort_act_order(self, pieces: list) -> list:
        """Every shard must share one column order (GPTQ gives fused q/k/v, gate/up the same
        act-order: they see the same inputs)."""
        first = pieces[0]
        for p in pieces:
            if not isinstance(p, GroupIndexedWeight) or not torch.equal(p.g_idx, first.g_idx):
                raise ModelLoadError(
                    "the shards of a fused layer have different act-order column orders (g_idx)"
                )
        sorted_pieces = []
        for p in pieces:
            piece, perm = p.sort_groups()
            sorted_pieces.append(piece)
        self.input_perm = perm
        return sorted_pieces

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.input_perm is not None:  # [T, K] -> [T, K'] in group order (pads read zero)
            x = F.pad(x, (0, 1)).index_select(1, self.input_perm)
        return super().apply(layer, x, bias)  # fp32 activations unless the policy says int8

    def rows(self, layer, ids: torch.Tensor) -> torch.Tensor:
        if self.input_perm is not None:
            raise ModelLoadError("an act-order LM head cannot serve a tied embedding")
        return super().rows(layer, ids)


class PrequantizedQuantConfig(QuantConfig):
    """The layers a pre-quantized checkpoint stores quantized get `PrequantizedLinearMethod`;
    the others (an `ignore` list, an unquantized LM head) stay in full precision."""

    def __init__(self, quant: CheckpointQuant, quantized_params: set[str], policy=FP32_ACTIVATIONS):
        self.name = quant.method
        self.quant = quant
        self.quantized_params = quantized_params  # linear prefixes, e.g. ...self_attn.qkv_proj
        self.policy = policy

    def get_linear_method(self, prefix: str, ops: QuantOps) -> LinearMethod | None:
        if prefix in self.quantized_params:
            return PrequantizedLinearMethod(ops, self.name, self.policy)
        return None

    def get_lm_head_method(self, ops: QuantOps) -> LinearMethod | None:
        if "lm_head" in self.quantized_params:
            return PrequantizedLinearMethod(ops, self.name, self.policy)
        return None


def quantized_params(modules: set[str], model_class) -> set[str]:
    """Checkpoint modules -> the model's linear prefixes they load into (renames, then fused
    q/k/v and gate/up modules), as the weight mapper maps `<module>.weight`."""
    renames = [(re.compile(p), r) for p, r in model_class.weight_renames]
    out = set()
    for module in modules:
        name = f"{module}.weight"
        for pattern, replacement in renames:
            name = pattern.sub(replacement, name)
        for ckpt, (fused, _) in model_class.packed_modules_mapping.items():
            if f".{ckpt}." in name:
                name = name.replace(f".{ckpt}.", f".{fused}.")
                break
        out.add(name.removesuffix(".weight"))
    return out


def prequantized_setup(
    quant: CheckpointQuant, names: list[str], model_class, policy=FP32_ACTIVATIONS
):
    """(PrequantizedTensors, PrequantizedQuantConfig) for a checkpoint with these tensor names."""
    tensors = PrequantizedTensors(format_for(quant), names)
    if not tensors.modules:
        raise ModelLoadError(
            f"the checkpoint declares {quant.method} quantization ({quant.source}) but stores no "
            f"quantized tensors ({' / '.join(_markers(tensors.fmt))})"
        )
    logger.info("%s checkpoint: %d quantized linear modules", quant.method, len(tensors.modules))
    params = quantized_params(tensors.modules, model_class)
    config = PrequantizedQuantConfig(quant, params, policy)
    return tensors, config


def _markers(fmt: PrequantizedFormat) -> list[str]:
    return [fmt.marker] if isinstance(fmt.marker, str) else list(fmt.marker)
