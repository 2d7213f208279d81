"""The CPU decode-step accelerator: a decode step's whole decoder stack in one kernel call
(csrc/decode_stack.cpp), the CPU's counterpart of a captured CUDA graph. It takes decode-only
steps and steps whose every row is decode-like (a speculative verify step's k + 1 rows, a short
continuation: each query runs as a decode row on the layer-by-layer path as well, so the stack
runs each token as one stack row with its own visible length). It stores and reads the
KV cache in any `--kv-cache-dtype` format in place (csrc/attention.h), with each layer's scales.

The model runner owns it and asks it per step (`for_step`). A model opts in by returning its
layers' tensors (`CausalLM.fused_decode_layers`: fp32 packed tiles, or quantized weights in their
kernel layout, which the stack multiplies with int8 activations exactly as the layers do); the
stack then checks the model's spec against what the kernel implements: every spec field must have
a role, every size the kernel takes is one it reads, and every feature is either at its (Llama)
default or listed in `SUPPORTED_FEATURES`. Anything else keeps the model on the layer-by-layer
path, with a log line saying why.

Mixture-of-experts layers run in the stack (csrc/moe_stack.h) when their routing rule is one the
kernel computes (`moe_unsupported`: softmax top-k, renormalised or not, with or without a gated
shared expert: Mixtral, Qwen2-MoE, Qwen3-MoE) and their experts are fp32 tiles; quantized experts
and the other rules (DeepSeek's grouped / sigmoid routing, PhiMoE's sparsemixer, Llama 4's sigmoid
top-1, DBRX's p-norm) keep the model layer by layer.

LoRA: the stack takes each adapted linear's A and packed B per adapter slot (handed over with the
layers' tensors) and, per step, each row's adapter slot; a row's delta is computed from that row
alone. A step whose adapters the stack does not hold in full (an adapter on a linear outside the
stack) runs layer by layer, logged once.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import torch

from pytgi.backends.base import AttentionBatch, DecodeAccelerator, FusedLayers, KVCache, KVScales
from pytgi.backends.cpu.attention import DECODE_LIKE_ROWS

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
    "moe": lambda moe: not moe_unsupported(moe),
}

# the kernel's encodings of `hidden_act` and of `DecoderSpec.block` (models/config.py BLOCKS)
ACTIVATIONS = {"silu": 0, "gelu": 1, "gelu_new": 2, "gelu_pytorch_tanh": 2, "gelu_fast": 2}
BLOCKS = ("sequential", "parallel", "parallel_two_norms", "sandwich")
# the MoE routing rule the stack's MoE MLP computes, by its name in layers/moe/config.py (backends
# sit below layers: the spec's MoE config arrives as a value, its module is not imported here)
MOE_ROUTER = "softmax_topk"


def moe_unsupported(moe) -> list[str]:
    """What in an MoE config the stack's MoE MLP (csrc/moe_stack.h) does not compute."""
    reasons = []
    if moe.router != MOE_ROUTER:
        reasons.append(f"router {moe.router}")
    if moe.renormalize and moe.renormalize_p != 1.0:
        reasons.append(f"p-norm renormalisation (p={moe.renormalize_p})")
    if moe.scaling_factor != 1.0:
        reasons.append(f"routed scaling factor {moe.scaling_factor}")
    if moe.scale_input:
        reasons.append("expert inputs scaled by the router weight")
    if moe.hidden_act not in ACTIVATIONS:
        reasons.append(f"expert activation {moe.hidden_act}")
    return reasons


def moe_config(moe) -> torch.Tensor:
    """The kernel's `moe.config`: int64 [experts, top_k, intermediate, renormalize, activation,
    shared_intermediate]."""
    values = (
        moe.num_experts,
        moe.top_k,
        moe.intermediate_size,
        int(moe.renormalize),
        ACTIVATIONS[moe.hidden_act],
        moe.shared_intermediate_size,
    )
    return torch.tensor(values, dtype=torch.int64)


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
                if f.name == "moe":
                    reasons.append(f"moe ({', '.join(moe_unsupported(value))})")
                else:
                    reasons.append(f"{f.name}={value!r}")
        else:
            reasons.append(f"{f.name} (no accelerator role declared)")
    return reasons


class FusedDecodeStack(DecodeAccelerator):
    name = "cpu-fused-decode"

    def __init__(
        self,
        stack,
        layer_names: list[str],
        num_adapters: int = 0,
        lora_off: str = "",
        kv_scales: list[KVScales] | None = None,
    ):
        self.stack = stack  # the compiled DecodeStack over the layers' packed weights
        self.layer_names = layer_names  # attention layer names, in layer order
        self.num_adapters = num_adapters  # LoRA slots 1..num_adapters the stack holds
        self.lora_off = lora_off  # why steps with adapter rows run layer by layer ("": they don't)
        self._lora_off_logged = False
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
        spec = model.spec
        reasons = unsupported_features(spec)
        if reasons:
            logger.info("fused decode stack off for %s: %s", spec.architecture, ", ".join(reasons))
            return None
        layers = model.fused_decode_layers()
        if layers is None:
            logger.info(
                "fused decode stack off: a layer's weights are in no layout it runs (fp32 tiles, "
                "or quantized codes with int8 activations; MoE experts: fp32 tiles only)"
            )
            return None
        if spec.moe is not None:  # the MoE layers' rule, for the kernel
            config = moe_config(spec.moe)
            layers = [
                (name, tensors | {"moe.config": config} if "moe.gate_up" in tensors else tensors)
                for name, tensors in layers
            ]
        num_adapters, lora_off = _lora_coverage(model, layers)
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
            num_adapters=num_adapters,
        )
        quantized = sum(key.endswith(".codes") for _, tensors in layers for key in tensors)
        logger.info(
            "fused decode stack on (%d layers%s%s)", spec.num_layers,
            f", {quantized} quantized linears on the {stack.isa} kernels" if quantized else "",
            f", LoRA rows of {num_adapters} adapter(s)" if num_adapters else "",
        )  # fmt: skip
        if lora_off:
            logger.info("fused decode stack: steps with adapter rows run layer by layer: %s",
                        lora_off)  # fmt: skip
        names = [name for name, _ in layers]
        return cls(stack, names, num_adapters, lora_off, _applied_kv_scales(model, names))

    def for_step(
        self,
        batch: AttentionBatch,
        metadata,
        kv_caches: dict[str, KVCache],
        adapter_slots: torch.Tensor | None = None,
    ) -> FusedLayers | None:
        if not batch.is_decode_only and not _decode_like(batch):
            return None
        if adapter_slots is not None and self.lora_off:
            if not self._lora_off_logged:
                logger.info("%s: steps with adapter rows run layer by layer: %s",
                            self.name, self.lora_off)  # fmt: skip
                self._lora_off_logged = True
            return None
        caches = [kv_caches[name] for name in self.layer_names]
        # one stack row per token: its block table and visible length (seq_lens [T])
        rows = None if batch.is_decode_only else _row_of_token(batch)  # None: one token per row
        seq_lens = batch.seq_lens if rows is None else _token_seq_lens(batch, rows)
        if self.layer_groups is None or batch.num_groups == 1:
            tables = metadata.decode_tables[0] if rows is None else batch.block_table[rows]
            slots, tables = [batch.slot_mapping], [tables]  # every layer's: [T], [T, W]
        else:  # each layer's KV group's slots [T] and block table [T, W]
            groups = [batch.group(g) for g in range(batch.num_groups)]
            per_group = [g.block_table if rows is None else g.block_table[rows] for g in groups]
            slots = [groups[g].slot_mapping for g in self.layer_groups]
            tables = [per_group[g] for g in self.layer_groups]

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
                adapter_slots,
                self.k_scales,
                self.v_scales,
            )

        return run


def _decode_like(batch: AttentionBatch) -> bool:
    """Whether every row's queries run as decode rows on the layer-by-layer path too (a verify
    step's k + 1 rows, a short continuation: at most DECODE_LIKE_ROWS queries after cached keys,
    no bidirectional span), so the stack computes what that path computes, row by row."""
    if batch.bidirectional_spans is not None:
        return False
    rest = slice(batch.num_decode_rows, None)
    num_q, start = batch.num_queries[rest], batch.start_positions[rest]
    return bool((num_q <= DECODE_LIKE_ROWS).all() and (start > 0).all())


def _row_of_token(batch: AttentionBatch) -> torch.Tensor:
    """The batch row of each flat token [T] int64."""
    return torch.repeat_interleave(torch.arange(batch.num_rows), batch.num_queries)


def _token_seq_lens(batch: AttentionBatch, rows: torch.Tensor) -> torch.Tensor:
    """Each token's visible length [T]: its position + 1 (its row's earlier tokens are stored
    before attention runs, its later ones are past its length)."""
    index = torch.arange(rows.shape[0]) - batch.query_start_loc[rows]  # query index in its row
    return batch.start_positions[rows] + index + 1


def _lora_coverage(model: torch.nn.Module, layers) -> tuple[int, str]:
    """(the adapter slots the stack takes, why adapter rows cannot run in it, or ""): every
    adapted linear of the model must be one of the stack's (its LoRA in the layers' tensors)."""
    adapted = [len(m.lora_adapters) for m in model.modules() if getattr(m, "lora_adapters", None)]
    if not adapted:
        return 0, ""
    taken = sum(key.endswith(".a") and ".lora" in key for _, t in layers for key in t)
    if taken != sum(adapted):
        return 0, "LoRA adapters on linear layers outside the fused stack"
    slots = [s for m in model.modules() for s in getattr(m, "lora_adapters", {})]
    return max(slots), ""


def _applied_kv_scales(model: torch.nn.Module, names: list[str]) -> list[KVScales]:
    """The KV scales each named attention layer's implementation stores and reads its cache
    with (CpuAttentionImpl.scales: the checkpoint's for an fp8_e4m3fn cache, else 1.0)."""
    impls = {m.layer_name: m.impl for m in model.modules() if hasattr(m, "layer_name")}
    return [getattr(impls.get(name), "scales", KVScales()) for name in names]
