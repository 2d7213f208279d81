"""One linear module's checkpoint tensors in a pre-quantized format -> the piece its layer loads
(`QuantizedWeight`, `GroupIndexedWeight` or an e4m3 `CodebookWeight`), without dequantizing.

Per format, the tensor suffixes of a quantized module (`parts`), the one whose presence marks a
module as quantized (`marker`), and `assemble(parts) -> piece`. Activation scales
(`input_scale`, fbgemm's `input_scale_ub`) are read and dropped: on CPU these methods keep
full-precision activations (docs/QUANTIZATION.md).
"""

from __future__ import annotations

import torch

from pytgi.errors import ModelLoadError
from pytgi.layers.quantization.detect import CheckpointQuant, ct_weight_bits
from pytgi.layers.quantization.int_packing import (
    GroupIndexedWeight,
    awq_unorder,
    groups_to_blocks,
    integer_piece,
    unpack_stream,
)
from pytgi.layers.quantization.quantized_weight import CodebookWeight
from pytgi.layers.quantization.quantizers import e4m3_table
from pytgi.utils.math import cdiv

ACTIVATION_PARTS = ("input_scale", "input_zero_point", "input_scale_ub")


class PrequantizedFormat:
    name: str
    parts: tuple[str, ...]
    marker: str | tuple[str, ...]

    def __init__(self, quant: CheckpointQuant):
        self.quant = quant

    def is_marker(self, part: str) -> bool:
        markers = (self.marker,) if isinstance(self.marker, str) else self.marker
        return part in markers

    def assemble(self, module: str, parts: dict[str, torch.Tensor]):
        raise NotImplementedError


def _group_size(group: int, k: int, groups: int) -> int:
    if group <= 0 or groups == 1:
        return k
    if cdiv(k, group) != groups:
        raise ModelLoadError(f"{groups} scale groups do not cover {k} inputs in groups of {group}")
    return group


def _is_trivial(g_idx: torch.Tensor, group: int) -> bool:
    return torch.equal(g_idx.long(), torch.arange(g_idx.numel()) // group)


def _piece(codes, zeros, scales, g_idx, group, bits, source):
    """[N, K] unsigned codes, [N, G] zeros and scales -> the layer's piece."""
    k = codes.shape[1]
    group = _group_size(group, k, scales.shape[1])
    if g_idx is not None and not _is_trivial(g_idx, group):
        return GroupIndexedWeight(codes, zeros, scales.float(), g_idx.long(), bits, source)
    scales, block = groups_to_blocks(scales, group, k)
    zeros, _ = groups_to_blocks(zeros, group, k)
    return integer_piece(codes, zeros, scales, block, bits, source)


class GPTQFormat(PrequantizedFormat):
    """w[:, k] = scales[g] * (q - z[g]), g = g_idx[k]; checkpoint format v1 stores z - 1."""

    name = "gptq"
    parts = ("qweight", "qzeros", "scales", "g_idx")
    marker = "qweight"

    def assemble(self, module, parts):
        bits = self.quant.bits
        qweight, qzeros, scales = parts["qweight"], parts["qzeros"], parts["scales"]
        n = qweight.shape[1]
        k = qweight.shape[0] * 32 // bits
        codes = unpack_stream(qweight, bits, k, dim=0).t()  # [N, K]
        zeros = unpack_stream(qzeros, bits, n, dim=1).t()  # [N, G]
        if self.quant.checkpoint_format != "gptq_v2":
            zeros = zeros + 1  # v1 stores z - 1: every v1 kernel adds the 1 back
        source = f"gptq {bits}-bit"
        return _piece(codes, zeros, scales.t(), parts.get("g_idx"), self.quant.group_size, bits,
                      source)  # fmt: skip


class AWQFormat(PrequantizedFormat):
    """GEMM packing along N in AWQ's nibble order; w = scales[g] * (q - z[g]) (no offset)."""

    name = "awq"
    parts = ("qweight", "qzeros", "scales")
    marker = "qweight"

    def assemble(self, module, parts):
        qweight, qzeros, scales = parts["qweight"], parts["qzeros"], parts["scales"]
        n = scales.shape[1]
        codes = awq_unorder(unpack_stream(qweight, 4, n, dim=1)).t()  # [N, K]
        zeros = awq_unorder(unpack_stream(qzeros, 4, n, dim=1)).t()  # [N, G]
        return _piece(codes, zeros, scales.t(), None, self.quant.group_size, 4, "awq 4-bit")


def fp8_piece(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None, source):
    """e4m3 weight [N, K] and its scale (per tensor [1] / [], per channel [N, 1], per group
    [N, K / g], or per block [ceil(N / bn), ceil(K / bk)]) -> CodebookWeight (w = s * e4m3)."""
    if weight.dtype != torch.float8_e4m3fn:
        raise ModelLoadError(f"{source}: fp8 weights must be float8_e4m3fn, got {weight.dtype}")
    n, k = weight.shape
    scale = scale.float()
    if scale.numel() == 1:
        scales, width = scale.reshape(1, 1).expand(n, 1), k
    elif block is not None:
        bn, bk = block
        if tuple(scale.shape) != (cdiv(n, bn), cdiv(k, bk)):
            raise ModelLoadError(f"{source}: block scales {tuple(scale.shape)} do not fit "
                                 f"[{n}, {k}] in {bn}x{bk} blocks")  # fmt: skip
        scales, width = scale.repeat_interleave(bn, dim=0)[:n], bk
    else:
        scales = scale.reshape(n, -1)
        width = k if scales.shape[1] == 1 else cdiv(k, scales.shape[1])
    codes = weight.contiguous().view(torch.uint8)
    return CodebookWeight(codes, e4m3_table(), 8, width, scales.contiguous(), source=source)


class FP8Format(PrequantizedFormat):
    """`weight` e4m3 with `weight_scale` (per tensor, fbgemm's per row) or block-wise
    `weight_scale_inv` (DeepSeek / transformers' FineGrainedFP8: multiplied in, despite the
    name)."""

    name = "fp8"
    parts = ("weight", "weight_scale", "weight_scale_inv", *ACTIVATION_PARTS)
    marker = ("weight_scale", "weight_scale_inv")

    def assemble(self, module, parts):
        block = self.quant.config.get("weight_block_size")
        if "weight_scale_inv" in parts:
            block = tuple(block or (128, 128))
            return fp8_piece(parts["weight"], parts["weight_scale_inv"], block, "fp8 block")
        return fp8_piece(parts["weight"], parts["weight_scale"], None, "fp8")


class CompressedTensorsFormat(PrequantizedFormat):
    """compressed-tensors: `pack-quantized` (`weight_packed`, `weight_shape`, `weight_scale`,
    optional packed `weight_zero_point` and `weight_g_idx`), `int-quantized` / `naive-quantized`
    (int8 `weight`, `weight_scale`, optional `weight_zero_point`) and `float-quantized` (e4m3
    `weight`, `weight_scale` per tensor, channel, group or block)."""

    name = "compressed-tensors"
    parts = ("weight_packed", "weight_shape", "weight_scale", "weight_zero_point",
             "weight_g_idx", "weight", *ACTIVATION_PARTS)  # fmt: skip
    marker = "weight_scale"

    def __init__(self, quant: CheckpointQuant):
        super().__init__(quant)
        groups = [g for g in (quant.config.get("config_groups") or {}).values() if g]
        weights = [g.get("weights") or {} for g in groups]
        sizes = {w.get("group_size") for w in weights if w.get("group_size")}
        self.group_size = sizes.pop() if len(sizes) == 1 else -1
        blocks = {tuple(w["block_structure"]) for w in weights if w.get("block_structure")}
        self.block = blocks.pop() if len(blocks) == 1 else (128, 128)
        self.bits = ct_weight_bits(quant.config)

    def assemble(self, module, parts):
        scale = parts["weight_scale"]
        if "weight_packed" in parts:
            return self._packed(parts)
        weight = parts["weight"]
        n, k = weight.shape
        if weight.dtype == torch.float8_e4m3fn:
            is_block = scale.dim() == 2 and scale.shape[0] != n and scale.numel() > 1
            return fp8_piece(weight, scale, self.block if is_block else None, "fp8")
        if weight.dtype != torch.int8:
            raise ModelLoadError(f"{module}: compressed-tensors weight of dtype {weight.dtype}")
        codes = weight.to(torch.int16) + 128
        scales = scale.float().reshape(1, 1).expand(n, 1) if scale.numel() == 1 else scale
        scales = scales.reshape(n, -1)
        zeros = _signed_zeros(parts.get("weight_zero_point"), scales.shape, 8)
        return _piece(codes, zeros, scales, parts.get("weight_g_idx"), self.group_size, 8,
                      "int8")  # fmt: skip

    def _packed(self, parts):
        n, k = (int(v) for v in parts["weight_shape"].tolist())
        packed, scale = parts["weight_packed"], parts["weight_scale"]
        bits = _packed_bits(packed.shape[1], k)
        codes = unpack_stream(packed, bits, k, dim=1)  # [N, K], signed + 2**(bits-1)
        scales = scale.float().reshape(1, 1).expand(n, 1) if scale.numel() == 1 else scale
        scales = scales.reshape(n, -1)
        zp = parts.get("weight_zero_point")
        if zp is not None and zp.dtype == torch.int32 and tuple(zp.shape) != tuple(scales.shape):
            zeros = unpack_stream(zp, bits, n, dim=0)  # [N, G] stored + 2**(bits-1)
        else:
            zeros = _signed_zeros(zp, scales.shape, bits)
        return _piece(codes, zeros, scales, parts.get("weight_g_idx"), self.group_size, bits,
                      f"int{bits} packed")  # fmt: skip


def _packed_bits(words: int, k: int) -> int:
    for bits in range(1, 9):
        if cdiv(k * bits, 32) == words:
            return bits
    raise ModelLoadError(f"{words} packed words per row do not hold {k} codes of <= 8 bits")


def _signed_zeros(zp: torch.Tensor | None, shape, bits: int) -> torch.Tensor:
    """Signed zero points (None: symmetric, 0) -> unsigned, offset by 2 ** (bits - 1)."""
    mid = 1 << (bits - 1)
    if zp is None:
        return torch.full(tuple(shape), mid, dtype=torch.int16)
    return (zp.to(torch.int16).reshape(shape) + mid).to(torch.int16)


FORMATS = {
    "gptq": GPTQFormat,
    "awq": AWQFormat,
    "fp8": FP8Format,
    "compressed-tensors": CompressedTensorsFormat,
}


def format_for(quant: CheckpointQuant) -> PrequantizedFormat:
    return FORMATS[quant.method](quant)
