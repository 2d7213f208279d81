"""The CPU decode-step accelerator: a decode-only step's whole decoder stack in one kernel call
(csrc/decode_stack.cpp), the CPU's counterpart of a captured CUDA graph. It stores and reads the
KV cache in any `--kv-cache-dtype` format in place (csrc/attention.h), with each layer's scales.

The model runner owns it and asks it per step (`for_step`). A model opts in by returning its
layers' tensors (`CausalLM.fused_decode_layers`: fp32 packed tiles, or quantized weights in their
kernel layout, which the stack multiplies with int8 activations exactly as the layers do); the
stack then checks the model's spec against what the kernel implements: every spec field must have
a role, every size the kernel takes is one it reads, and every feature is either at its (Llama)
default or listed in `SUPPORTED_FEATURES`. Anything else keeps the model on the layer-by-layer
path, with a log line saying why.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import torch

from pytgi.backends.base import AttentionBatch, DecodeAccelerator, FusedLayers, KVCache, KVScales

logger = logging.getLogger(__name__)

# sizes the kernel takes as parameters (the spec's SHAPE fields it reads)
SIZES = (
    "hidden_size",
    "num_layers",
    "intermediate_size",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "norm_eps",
    "attention_scale",
    "residual_multiplier",
)


def _any(value) -> bool:
    return True


# feature field -> which values the kernel computes (a feature at its default always runs)
SUPPORTED_FEATURES: dict[str, Callable[[Any], bool]] = {
    "hidden_act": lambda act: act in ACTIVATIONS,
    "mlp_gated": _any,
    "norm": _any,  # rms or layer
    "norm_bias": _any,
    "norm_weight_offset": _any,  # folded into the norm weights after loading
    "block": lambda block: block in BLOCKS,
    "position_encoding": _any,  # rope, learned (outside the stack: no rotation) or alibi
    "alibi_slope_scale": _any,  # in the slopes the layers hand over
    "rotary_dim": _any,  # the cos / sin width
    "rotary_interleaved": _any,
    "local_rope_theta": _any,  # a second rotary table, picked per layer
    "attn_logit_softcap": _any,
    "sliding_windows": _any,  # per layer, the kernel's decode attention takes a window
    "qkv_bias": _any,
    "o_bias": _any,
    "mlp_bias": _any,
    "qk_norm": _any,
}

# the kernel's encodings of `hidden_act` and of `DecoderSpec.block` (models/config.py BLOCKS)
ACTIVATIONS = {"silu": 0, "gelu": 1, "gelu_new": 2, "gelu_pytorch_tanh": 2, "gelu_fast": 2}
BLOCKS = ("sequential", "parallel", "parallel_two_norms", "sandwich")


def unsupported_features(spec) -> list[str]:
    """What in `spec` the fused kernel would not compute (empty: it runs the model exactly)."""
    reasons = []
    for f in dataclasses.fields(spec):
        role, value = f.metadata.get("role"), getattr(spec, f.name)
        if role in ("outside", "load"):
            continue
        if role == "shape":
            if f.name not in SIZES:
                reasons.append(f"size {f.name} (not a parameter of the kernel)")
        elif role == "feature":
            supported = SUPPORTED_FEATURES.get(f.name)
            if value != f.default and (supported is None or not supported(value)):
                reasons.append(f"{f.name}={value!r}")
        else:
            reasons.append(f"{f.name} (no accelerator role declared)")
    return reasons


class FusedDecodeStack(DecodeAccelerator):
    name = "cpu-fused-decode"

    def __init__(self, stack, layer_names: list[str], kv_scales: list[KVScales] | None = None):
        self.stack = stack  # the compiled DecodeStack over the layers' packed weights
        self.layer_names = layer_names  # attention layer names, in layer order
        # the scales each layer's cache is stored and read with (fp8_e4m3fn's checkpoint scales)
        scales = kv_scales or [KVScales()] * len(layer_names)
        self.k_scales = [s.k_scale for s in scales]
        self.v_scales = [s.v_scale for s in scales]
        # each layer's KV group (None: one block table for every layer), set with the caches
        self.layer_groups: list[int] | None = None

    def set_kv_groups(self, layer_groups: dict[str, int]) -> None:
        """The KV group of each attention layer (a model whose windowed and full layers keep
        separate block tables: each layer reads its group's table and slots)."""
        self.layer_groups = [layer_groups[name] for name in self.layer_names]

    @classmethod
    def for_model(
        cls, model: torch.nn.Module, kernels, quant_isa: str = "auto"
    ) -> FusedDecodeStack | None:
        layers = model.fused_decode_layers()
        if layers is None:
            logger.info(
                "fused decode stack off: a layer's weights are in no layout it runs (fp32 tiles, "
                "or quantized codes with int8 activations)"
            )
            return None
        spec = model.spec
        reasons = unsupported_features(spec)
        if reasons:
            logger.info("fused decode stack off for %s: %s", spec.architecture, ", ".join(reasons))
            return None
        stack = kernels.DecodeStack(
            hidden_size=spec.hidden_size,
            num_heads=spec.num_heads,
            num_kv_heads=spec.num_kv_heads,
            head_dim=spec.head_dim,
            intermediate_size=spec.intermediate_size,
            eps=spec.norm_eps,
            scale=spec.attention_scale,
            residual_multiplier=spec.residual_multiplier,
            layer_norm=spec.norm == "layer",  # the spec's str-valued Norm
            block=BLOCKS.index(spec.block),
            activation=ACTIVATIONS[spec.hidden_act],
            gated=spec.mlp_gated,
            rotary_interleaved=spec.rotary_interleaved,
            softcap=spec.attn_logit_softcap or 0.0,
            layers=[tensors for _, tensors in layers],
            windows=[spec.sliding_window(i) or 0 for i in range(spec.num_layers)],
            rope_tables=[spec.rope_table(i) for i in range(spec.num_layers)],
            isa=quant_isa,
        )
        quantized = sum(key.endswith(".codes") for _, tensors in layers for key in tensors)
        logger.info(
            "fused decode stack on (%d layers%s)", spec.num_layers,
            f", {quantized} quantized linears on the {stack.isa} kernels" if quantized else "",
        )  # fmt: skip
        names = [name for name, _ in layers]
        return cls(stack, names, _applied_kv_scales(model, names))

    def for_step(
        self, batch: AttentionBatch, metadata, kv_caches: dict[str, KVCache]
    ) -> FusedLayers | None:
        if not batch.is_decode_only:
            return None
        caches = [kv_caches[name] for name in self.layer_names]
        if self.layer_groups is None or batch.num_groups == 1:
            tables, seq_lens = metadata.decode_tables  # [B, W], [B]
            slots, tables = [batch.slot_mapping], [tables]  # every layer's
        else:  # each layer's KV group's slots [B] and block table [B, W]
            seq_lens = batch.seq_lens
            groups = [batch.group(g) for g in range(batch.num_groups)]
            slots = [groups[g].slot_mapping for g in self.layer_groups]
            tables = [groups[g].block_table for g in self.layer_groups]

        def run(hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
            return self.stack.forward(
                hidden.contiguous(),
                cos.squeeze(2),  # [R, B, 1, rotary_dim] -> [R, B, rotary_dim]
                sin.squeeze(2),
                slots,
                tables,
                seq_lens,
                batch.block_size,
                [k for k, _ in caches],
                [v for _, v in caches],
                self.k_scales,
                self.v_scales,
            )

        return run


def _applied_kv_scales(model: torch.nn.Module, names: list[str]) -> list[KVScales]:
    """The KV scales each named attention layer's implementation stores and reads its cache
    with (CpuAttentionImpl.scales: the checkpoint's for an fp8_e4m3fn cache, else 1.0)."""
    impls = {m.layer_name: m.impl for m in model.modules() if hasattr(m, "layer_name")}
    return [getattr(impls.get(name), "scales", KVScales()) for name in names]
