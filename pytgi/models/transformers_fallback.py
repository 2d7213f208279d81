"""The transformers fallback: any decoder-only architecture of transformers' causal-LM table that
has no native pytgi file runs transformers' own modeling code on pytgi's paged KV cache and
continuous batching (the way TGI's transformers backend does).

`TransformersCausalLM` builds the transformers model from its config with
`attn_implementation="pytgi_paged"` (models/transformers_attention.py), without initialising
weights (the loader fills every parameter from the checkpoint). One probe forward learns each
attention module's parameters; each module then gets a pytgi `Attention` layer (its own
`AttentionImpl` and `kv_cache_spec`) attached under `PAGED_ATTR`, which the runner finds like any
other attention layer. The transformers model's top-level children are this module's children,
so parameter names are the checkpoint's names and the ordinary loader loads them.

Per step: `forward` runs the base model on the flat batch as one sequence (input_ids and
position_ids [1, T], no transformers cache) and returns its last hidden state; `compute_logits`
runs transformers' own causal-LM head on the rows asked for (its forward with the base model
replaced by a pass-through), so head-specific scaling and soft-capping stay transformers' code.

Not supported here: tensor parallelism (refused), quantization, the fused decode stack, and
models whose attention does not go through the attention-function interface (refused by the
probe with the reason).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from pytgi.errors import ModelLoadError
from pytgi.layers.attention import Attention
from pytgi.layers.build_context import current_build_context
from pytgi.models.base import CausalLM
from pytgi.models.config import OUTSIDE, ModelSpec, common_fields
from pytgi.models.transformers_attention import (
    ATTENTION_NAME,
    PAGED_ATTR,
    AttentionCall,
    probe_attention_calls,
    register_paged_attention,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class TransformersSpec(ModelSpec):
    hf_config: Any = field(default=None, metadata=OUTSIDE, compare=False, repr=False)
    trust_remote_code: bool = field(default=False, metadata=OUTSIDE)


class HiddenStatesPassthrough(nn.Module):
    """Stands in for the base model inside the causal-LM wrapper: its `inputs_embeds` are
    already the final hidden states, returned in the base model's own output type (so that
    heads reading further fields, such as MoE router logits, find them unset)."""

    def __init__(self, output_type: type, child_names: set[str]):
        super().__init__()
        self.output_type = output_type
        self.child_names = child_names  # the head may call a child: OPT's `model.decoder(...)`

    def __getattr__(self, name: str):
        if name != "child_names" and name in self.child_names:
            return self
        return super().__getattr__(name)

    def forward(self, *args, inputs_embeds: torch.Tensor | None = None, **kwargs):
        return self.output_type(last_hidden_state=inputs_embeds)


class TransformersCausalLM(CausalLM):
    ignored_weights = (r"rotary_emb\.inv_freq$", r"\.masked_bias$")

    def __init__(self, spec: TransformersSpec, quant_config=None):
        super().__init__()
        if current_build_context().tp.world_size > 1:
            raise ModelLoadError(
                f"{spec.architecture} runs on the transformers fallback, which does not shard: "
                "use --num-shard 1"
            )
        if quant_config is not None:
            raise ModelLoadError("the transformers fallback does not run quantized weights")
        self.spec = spec
        hf_model = _build_hf_model(spec)
        self.base_prefix = _base_model_name(hf_model, spec.architecture)
        base = getattr(hf_model, self.base_prefix)
        calls, output_type = _probe(base, spec)
        self._attach_paged_attention(base, calls)
        logger.info(
            "transformers fallback: %s (transformers %s) with %d paged attention layers: %s",
            spec.architecture, _transformers_version(), len(calls),
            ", ".join(sorted({_describe(call) for _, call in calls})),
        )  # fmt: skip
        for name, child in hf_model.named_children():
            self.add_module(name, child)
        child_names = {name for name, _ in base.named_children()}
        setattr(hf_model, self.base_prefix, HiddenStatesPassthrough(output_type, child_names))
        self._hf_model = [hf_model]  # a list: its modules are ours already, not a submodule
        self.weight_renames = tuple(getattr(hf_model, "_checkpoint_conversion_mapping", {}).items())
        everything = {n for n, _ in self.named_parameters(remove_duplicate=False)}
        self._tied_names = everything - {n for n, _ in self.named_parameters()}
        self._buffer_names = {n for n, _ in self.named_buffers()}

    @classmethod
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict) -> TransformersSpec:
        return TransformersSpec(
            **common_fields(hf_config, architecture),
            hf_config=hf_config,
            trust_remote_code=bool(flags.get("trust_remote_code", False)),
        )

    def _attach_paged_attention(self, base: nn.Module, calls: list) -> None:
        names = {id(module): name for name, module in base.named_modules()}
        for module, call in calls:
            prefix = f"{self.base_prefix}.{names[id(module)]}.{PAGED_ATTR}"
            setattr(module, PAGED_ATTR, _paged_layer(call, prefix))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        base = getattr(self, self.base_prefix)
        out = base(
            input_ids=input_ids.unsqueeze(0), position_ids=positions.unsqueeze(0), use_cache=False
        )
        return out.last_hidden_state[0]  # [T, hidden]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> logits [N, V] through transformers' head (and its scaling)."""
        return self._hf_model[0](inputs_embeds=hidden.unsqueeze(0), use_cache=False).logits[0]

    def is_ignored_weight(self, name: str) -> bool:
        """Tied copies (the head of a tied embedding, whatever its name) and buffers (rotary
        tables, masks: computed when the model is built) have no parameter to load."""
        if name in self._tied_names or name in self._buffer_names:
            return True
        return any(re.search(p, name) for p in self.ignored_weights)


def _build_hf_model(spec: TransformersSpec) -> nn.Module:
    """The transformers causal LM the config names, uninitialised (every parameter is loaded)."""
    from transformers import AutoModelForCausalLM
    from transformers.modeling_utils import no_init_weights

    register_paged_attention()
    options = {"attn_implementation": ATTENTION_NAME, "dtype": torch.get_default_dtype()}
    try:
        with no_init_weights():
            if spec.trust_remote_code:  # the checkpoint's own class, named by its auto_map
                model = AutoModelForCausalLM.from_config(
                    spec.hf_config, trust_remote_code=True, **options
                )
            else:
                model = _hf_model_class(spec)._from_config(spec.hf_config, **options)
    except (ValueError, KeyError, TypeError, ImportError, AttributeError) as err:
        raise ModelLoadError(
            f"transformers cannot build {spec.architecture}: {str(err).splitlines()[0]}"
        ) from None
    _check_backend_compatible(type(model), spec.architecture)
    model.tie_weights()  # from_pretrained would; init_weights skips it without initialisation
    for param in model.parameters():  # finite values for the probe; the loader fills them
        param.data.zero_()
    return model.eval()


def _base_model_name(hf_model: nn.Module, architecture: str) -> str:
    """The attribute holding the decoder stack under the LM head: `base_model_prefix`, else the
    one child that is itself a transformers model (Gemma 3's prefix names its multimodal twin)."""
    from transformers import PreTrainedModel

    prefix = hf_model.base_model_prefix
    if isinstance(getattr(hf_model, prefix, None), nn.Module):
        return prefix
    names = [n for n, m in hf_model.named_children() if isinstance(m, PreTrainedModel)]
    if len(names) != 1:
        raise ModelLoadError(f"transformers' {architecture} has no base model to run alone")
    return names[0]


def _hf_model_class(spec: TransformersSpec):
    """transformers' class named by the architecture, which must take the config's type and
    custom attention functions."""
    import transformers

    model_class = getattr(transformers, spec.architecture)
    config_class = getattr(model_class, "config_class", None)
    if config_class is not None and not isinstance(spec.hf_config, config_class):
        raise ModelLoadError(
            f"config.json's model_type '{spec.hf_config.model_type}' does not fit its "
            f"architecture {spec.architecture} (which takes {config_class.__name__})"
        )
    _check_backend_compatible(model_class, spec.architecture)
    return model_class


def _check_backend_compatible(model_class, architecture: str) -> None:
    if not model_class.is_backend_compatible():
        raise ModelLoadError(
            f"transformers' {architecture} does not take custom attention functions "
            "(transformers' attention interface), so the transformers fallback cannot run it on "
            "pytgi's paged KV cache"
        )


def _probe(base: nn.Module, spec: TransformersSpec) -> tuple[list, type]:
    """Each attention module and its call ((module, AttentionCall) in call order), and the base
    model's output type, from one two-token forward of the base model."""
    ids = torch.zeros(1, 2, dtype=torch.long)
    with torch.inference_mode(), probe_attention_calls() as calls:
        try:
            out = base(input_ids=ids, position_ids=torch.arange(2).unsqueeze(0), use_cache=False)
        except (RuntimeError, TypeError, ValueError, IndexError, KeyError) as err:
            raise ModelLoadError(
                f"transformers' {spec.architecture} fails a two-token forward as pytgi runs it "
                f"(one flat sequence with position_ids, no cache): {str(err).splitlines()[0]}"
            ) from None
    modules = [module for module, _ in calls]
    if len(set(map(id, modules))) != len(modules):
        raise ModelLoadError(f"{spec.architecture} calls one attention module twice per forward")
    if len(calls) != spec.num_layers:
        raise ModelLoadError(
            f"{spec.architecture} runs {len(calls)} attention layers through transformers' "
            f"attention interface for its {spec.num_layers} layers; the transformers fallback "
            "serves models whose every layer is attention on the KV cache"
        )
    window = getattr(spec.hf_config, "sliding_window", None)
    if window and any(c.own_mask and c.sliding_window is None for _, c in calls):
        raise ModelLoadError(
            f"{spec.architecture} applies its sliding window ({window}) in a mask it builds "
            "itself, which pytgi's paged attention does not take"
        )
    return calls, type(out)


def _describe(call: AttentionCall) -> str:
    window = f", window {call.sliding_window}" if call.sliding_window else ""
    return f"{call.num_heads}/{call.num_kv_heads} heads of {call.head_size}{window}"


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def _paged_layer(call: AttentionCall, prefix: str) -> Attention:
    return Attention(
        call.num_heads,
        call.head_size,
        call.scale,
        call.num_kv_heads,
        call.sliding_window,
        prefix=prefix,
        logits_soft_cap=call.softcap,
        head_size_v=call.head_size_v if call.head_size_v != call.head_size else None,
    )
