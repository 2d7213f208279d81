"""`GGUFCheckpoint`: one open GGUF file, its metadata parsed once, its tensors read one at a time.

gguf's `GGUFReader` memory-maps the file; a tensor's bytes are read when `iter_weights` reaches
it, decoded (quantized types: straight to a `QuantizedWeight`; F32/F16/BF16: a plain tensor in
that dtype, copied out of the mapping) and renamed to its HF name, q/k rows back in HF's order.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.gguf_reader import ReaderTensor

from pytgi.errors import ModelLoadError
from pytgi.layers.quantization.quantized_weight import QuantizedWeight
from pytgi.models.gguf.blocks import DECODERS, decode_blocks
from pytgi.models.gguf.metadata import field_value, hf_config, read_metadata
from pytgi.models.gguf.names import (
    CONFIG_TENSORS,
    hf_name,
    llama_name_map,
    split_expert_names,
    unpermute_rows,
)
from pytgi.models.gguf.tokenizer import GGUFTokenizer, build_tokenizer, write_hf_files

logger = logging.getLogger(__name__)

Q = GGMLQuantizationType
_PLAIN = {Q.F32: torch.float32, Q.F16: torch.float16, Q.BF16: torch.bfloat16}
_LARGE_FIELD_ITEMS = 1024


class GGUFCheckpoint:
    """A GGUF file of a supported architecture (else `ModelLoadError` naming it)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.reader = _open_reader(self.path)
        self.metadata = read_metadata(self.reader)
        _drop_large_fields(self.reader)

    @cached_property
    def hf_config(self):
        """The transformers config (e.g. `LlamaConfig`, `architectures` set)."""
        return hf_config(self.metadata, self._freq_factors())

    @cached_property
    def tokenizer(self) -> GGUFTokenizer:
        return build_tokenizer(self.metadata)

    def _freq_factors(self) -> list[float] | None:
        """The `rope_freqs` tensor (Llama 3.1-3.3's rope frequency factors), if the file has one."""
        for tensor in self.reader.tensors:
            if tensor.name in CONFIG_TENSORS:
                return [float(v) for v in read_tensor(tensor).float().flatten().tolist()]
        return None

    def write_hf_files(self, out_dir: str | Path) -> Path:
        """Write config.json, generation_config.json and the tokenizer files into `out_dir`."""
        return write_hf_files(self.metadata, self.tokenizer, Path(out_dir), self.hf_config)

    def tensor_types(self) -> dict[str, int]:
        """How many tensors of each GGML type the file holds, e.g. {"Q4_1": 210, "F32": 61}."""
        return dict(Counter(t.tensor_type.name for t in self.reader.tensors))

    @property
    def num_experts(self) -> int:
        return int(self.metadata.config.get("num_local_experts", 0))

    def _name_map(self) -> dict[str, str]:
        return llama_name_map(int(self.metadata.config["num_hidden_layers"]), self.num_experts)

    def hf_tensor_types(self) -> dict[str, str]:
        """HF name -> GGML type name of every tensor `iter_weights` yields (no data is read);
        experts, split and dequantized, are F32."""
        names = self._name_map()
        types = {}
        for tensor in self.reader.tensors:
            name = hf_name(names, tensor.name)
            if name is None:
                continue
            experts = split_expert_names(name, self.num_experts)
            for expert in experts or []:
                types[expert] = "F32"
            if experts is None:
                types[name] = (
                    "F32" if ".gate." in name and self.num_experts else tensor.tensor_type.name
                )
        return types

    def close(self) -> None:
        """Drop the memory mapping (its pages leave the resident set); the checkpoint is unusable
        afterwards."""
        self.reader = None

    def iter_weights(self) -> Iterator[tuple[str, torch.Tensor | QuantizedWeight]]:
        """`(HF name, tensor or QuantizedWeight)` per GGUF tensor, in file order, one at a time."""
        config = self.metadata.config
        names = self._name_map()
        num_heads = int(config["num_attention_heads"])
        rotary_heads = {
            "self_attn.q_proj": num_heads,
            "self_attn.k_proj": int(config.get("num_key_value_heads", num_heads)),
        }
        for tensor in self.reader.tensors:
            name = hf_name(names, tensor.name)
            if name is None:
                continue
            experts = split_expert_names(name, self.num_experts)
            if experts is not None:
                yield from zip(experts, _dequantized_experts(tensor, self.num_experts), strict=True)
                continue
            value = read_tensor(tensor)
            if self.num_experts and ".gate." in name and isinstance(value, QuantizedWeight):
                value = value.dequantize()  # the router runs in full precision
            heads = next((n for module, n in rotary_heads.items() if f".{module}." in name), None)
            if heads is not None:
                value = unpermute_rows(value, heads)
            yield name, value


def _dequantized_experts(tensor: ReaderTensor, num_experts: int) -> torch.Tensor:
    """A stacked expert tensor [E, N, K] as fp32 (quantized blocks decoded, then dequantized:
    the experts run on the fp32 path, pytgi has no quantized expert kernels yet)."""
    shape = [int(d) for d in reversed(tensor.shape.tolist())]
    if len(shape) != 3 or shape[0] != num_experts:
        raise ModelLoadError(f"GGUF tensor `{tensor.name}` is not {num_experts} stacked experts")
    if tensor.tensor_type in _PLAIN:
        data = torch.from_numpy(np.array(tensor.data))
        return data.reshape(shape).float()
    if tensor.tensor_type not in DECODERS:
        raise ModelLoadError(
            f"GGUF tensor `{tensor.name}` has type {tensor.tensor_type.name}, which is not "
            "supported"
        )
    rows = shape[0] * shape[1]
    weight = decode_blocks(tensor.data.reshape(rows, -1), tensor.tensor_type, tensor.name)
    return weight.dequantize().float().reshape(shape)


def read_tensor(tensor: ReaderTensor) -> torch.Tensor | QuantizedWeight:
    """One GGUF tensor in HF's shape order ([N, K] for a linear weight)."""
    qtype = tensor.tensor_type
    shape = [int(d) for d in reversed(tensor.shape.tolist())]
    if qtype in _PLAIN:
        data = np.array(tensor.data)  # the only copy: out of the memory mapping
        if qtype == Q.BF16:
            return torch.from_numpy(data.view(np.int16)).view(torch.bfloat16).reshape(shape)
        return torch.from_numpy(data).reshape(shape)
    if qtype not in DECODERS:
        raise ModelLoadError(
            f"GGUF tensor `{tensor.name}` has type {qtype.name}, which is not supported "
            f"(supported: F32, F16, BF16, {', '.join(t.name for t in DECODERS)})"
        )
    if len(shape) != 2:
        raise ModelLoadError(
            f"GGUF tensor `{tensor.name}` is a {len(shape)}-D {qtype.name} tensor: only 2-D "
            "weights can be quantized"
        )
    weight = decode_blocks(tensor.data.reshape(shape[0], -1), qtype, tensor.name)
    if tuple(weight.codes.shape) != tuple(shape):
        raise ModelLoadError(f"GGUF tensor `{tensor.name}` decodes to the wrong shape")
    return weight


def _drop_large_fields(reader: GGUFReader) -> None:
    """Free the reader's per-element views of long metadata arrays (the vocabulary: ~150 MB for
    49k tokens and merges); `read_metadata` has copied what it needs into Python lists."""
    for key in [k for k, f in reader.fields.items() if len(f.data) > _LARGE_FIELD_ITEMS]:
        del reader.fields[key]


def _open_reader(path: Path) -> GGUFReader:
    try:
        reader = GGUFReader(path)
    except (ValueError, OSError, IndexError, KeyError, TypeError) as err:
        raise ModelLoadError(f"Cannot read GGUF file `{path}`: {err}") from err
    if reader.byte_order != "I":
        raise ModelLoadError(f"GGUF file `{path}` is big-endian, which is not supported")
    splits = field_value(reader, "split.count")
    if splits is not None and int(splits) > 1:
        raise ModelLoadError(
            f"GGUF file `{path}` is one of {splits} split files, which are not supported: merge "
            "them into one file first (llama.cpp's `llama-gguf-split --merge`)"
        )
    return reader
