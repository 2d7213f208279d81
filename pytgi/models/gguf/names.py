"""llama.cpp tensor names to Hugging Face names, and the undoing of llama.cpp's q/k row order.

The HF names a Llama checkpoint can hold are listed here and translated to GGUF names by gguf's
own `TensorNameMap` (the table llama.cpp's converter writes with); the inverse of that map is the
GGUF -> HF map. llama.cpp's converter permutes the rows of Llama's q and k projections (per head,
from HF's "two halves" rotary layout to interleaved pairs); `unpermute_rows` restores HF's order.
It is a permutation of output features, so it is exact on a `QuantizedWeight` too.
"""

from __future__ import annotations

import dataclasses
import logging
import re

import gguf
import torch

from pytgi.errors import ModelLoadError
from pytgi.layers.quantization.quantized_weight import QuantizedWeight

logger = logging.getLogger(__name__)

# HF parameters of a Llama: norms and embeddings have a weight, projections may have a bias too
_LLAMA_TOP = ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")
_LLAMA_LAYER = ("input_layernorm.weight", "post_attention_layernorm.weight") + tuple(
    f"{module}.{param}"
    for module in (
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    )
    for param in ("weight", "bias")
)
# GGUF tensors a Llama file may hold that are configuration, not parameters: the rope
# frequency factors of Llama 3.1-3.3 (llama3 rope scaling) go into the config's rope_scaling
# (metadata.hf_config), so the weight loader skips them
CONFIG_TENSORS = ("rope_freqs.weight",)
_IGNORED: dict[str, str] = {}


# llama.cpp's stacked experts of a Mixtral layer -> the per-expert HF module they split into
STACKED_EXPERTS = {"ffn_gate_exps": "w1", "ffn_up_exps": "w3", "ffn_down_exps": "w2"}
_MOE_PREFIX = "block_sparse_moe"
_PER_EXPERT = re.compile(r"^blk\.\d+\.ffn_(gate|up|down)\.\d+\.weight$")


def stacked_expert_name(layer: int, gguf_module: str) -> str:
    """The HF-side name under which a stacked expert tensor is read (split per expert later)."""
    return f"model.layers.{layer}.{_MOE_PREFIX}.experts.{STACKED_EXPERTS[gguf_module]}"


def split_expert_names(name: str, num_experts: int) -> list[str] | None:
    """The per-expert HF names of a stacked expert name, None for any other name."""
    parent, _, module = name.rpartition(".experts.")
    if not parent.endswith(_MOE_PREFIX) or module not in STACKED_EXPERTS.values():
        return None
    return [f"{parent}.experts.{e}.{module}.weight" for e in range(num_experts)]


def llama_name_map(num_layers: int, num_experts: int = 0) -> dict[str, str]:
    """GGUF name -> HF name of every weight and bias a Llama of `num_layers` layers can have
    (with `num_experts`: a Mixtral, its router and stacked experts, no dense MLP).

    A Mixtral's router is `ffn_gate_inp`, or `ffn_gate` [E, H] in files of the converters whose
    tensor map also lists HF's `block_sparse_moe.gate` under FFN_GATE (added there for
    SmallThinker, the later entry wins; llama.cpp 2025-07 onwards, e.g. the converter vendored
    in llama-cpp-python 0.3.16): a Mixtral layer has no dense gate, so the name is unambiguous.
    """
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, num_layers)
    layer_params = [p for p in _LLAMA_LAYER if not (num_experts and p.startswith("mlp."))]
    hf_names = list(_LLAMA_TOP) + [
        f"model.layers.{i}.{param}" for i in range(num_layers) for param in layer_params
    ]
    mapping = {}
    if num_experts:
        for i in range(num_layers):
            router = f"model.layers.{i}.{_MOE_PREFIX}.gate.weight"
            mapping[f"blk.{i}.ffn_gate_inp.weight"] = router
            mapping[f"blk.{i}.ffn_gate.weight"] = router
            for module in STACKED_EXPERTS:
                mapping[f"blk.{i}.{module}.weight"] = stacked_expert_name(i, module)
    for name in hf_names:
        gguf_name = name_map.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, f"gguf's tensor map lost {name}"
        mapping[gguf_name] = name
    return mapping


def hf_name(name_map: dict[str, str], gguf_name: str) -> str | None:
    """The HF name of a GGUF tensor; None for a known tensor without one (logged)."""
    if gguf_name in name_map:
        return name_map[gguf_name]
    if gguf_name in CONFIG_TENSORS:
        return None
    if gguf_name in _IGNORED:
        logger.warning("GGUF tensor %s is skipped: %s", gguf_name, _IGNORED[gguf_name])
        return None
    if _PER_EXPERT.match(gguf_name):
        raise ModelLoadError(
            f"GGUF tensor `{gguf_name}`: a Mixtral GGUF with one tensor per expert (the layout "
            "before llama.cpp stacked them into ffn_*_exps) is not supported; convert the model "
            "again with a current llama.cpp"
        )
    raise ModelLoadError(
        f"GGUF tensor `{gguf_name}` has no counterpart in a Llama model (mixture-of-experts and "
        "other variants of llama.cpp's `llama` architecture are not supported)"
    )


def qk_permutation(num_rows: int, num_heads: int) -> torch.Tensor:
    """Row index that maps llama.cpp's q/k order back to HF's: hf = gguf[index].

    GGUF row h*hd + 2j + t holds HF row h*hd + t*hd/2 + j (head h, pair j, half t).
    """
    head_dim = num_rows // num_heads
    if num_heads <= 0 or num_rows % num_heads or head_dim % 2:
        raise ModelLoadError(f"Cannot split {num_rows} q/k rows into {num_heads} rotary heads")
    rows = torch.arange(num_rows).reshape(num_heads, head_dim // 2, 2)
    return rows.transpose(1, 2).reshape(-1)


def unpermute_rows(
    weight: torch.Tensor | QuantizedWeight, num_heads: int
) -> torch.Tensor | QuantizedWeight:
    """`weight` (q/k projection weight [N, K] or bias [N]) with its rows in HF's order."""
    if isinstance(weight, QuantizedWeight):
        index = qk_permutation(weight.codes.shape[0], num_heads)
        return dataclasses.replace(
            weight,
            codes=weight.codes.index_select(0, index),
            scales=weight.scales.index_select(0, index),
            mins=None if weight.mins is None else weight.mins.index_select(0, index),
        )
    return weight.index_select(0, qk_permutation(weight.shape[0], num_heads))
