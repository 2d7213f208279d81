"""Model specs: what a model family reads from a Hugging Face config, in one spelling.

`ModelSpec` holds what every family has (the runner and the loader read it); a family's own spec
subclasses it, and the family builds it from the HF config (`CausalLM.spec_from_hf`). The shared
decoder blocks (models/blocks.py) read `DecoderSpec`; architectures that differ from Llama only by
a flag get it from the registry (`ModelEntry.flags`).

Every spec field has a role for decode-step accelerators, which run a model's decoder stack
outside its Python modules (the fused CPU decode stack): `SHAPE` (a size the accelerator takes
as a parameter), `OUTSIDE` (used by the model outside its decoder stack: embedding, rotary
tables, LM head) or `FEATURE` (changes what the layers compute; its default is Llama's behaviour).
An accelerator runs a model only when it knows every non-default feature and the field has a
role at all, so a flag added later is refused until someone teaches the accelerator about it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from pytgi.errors import ModelLoadError

SHAPE = {"role": "shape"}
OUTSIDE = {"role": "outside"}
FEATURE = {"role": "feature"}


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    architecture: str = field(metadata=OUTSIDE)
    vocab_size: int = field(metadata=OUTSIDE)
    hidden_size: int = field(metadata=SHAPE)
    num_layers: int = field(metadata=SHAPE)
    max_position_embeddings: int = field(metadata=OUTSIDE)
    tie_word_embeddings: bool = field(default=False, metadata=OUTSIDE)
    checkpoint_dtype: str | None = field(default=None, metadata=OUTSIDE)


@dataclass(frozen=True, kw_only=True)
class DecoderSpec(ModelSpec):
    """The shared pre-norm decoder blocks: RMSNorm, rotary attention, gated MLP, and the flags
    that Llama's relatives (Mistral, Qwen2/3, Granite) set."""

    intermediate_size: int = field(metadata=SHAPE)
    num_heads: int = field(metadata=SHAPE)
    num_kv_heads: int = field(metadata=SHAPE)
    head_dim: int = field(metadata=SHAPE)
    rms_norm_eps: float = field(metadata=SHAPE)
    attention_scale: float = field(metadata=SHAPE)
    residual_multiplier: float = field(default=1.0, metadata=SHAPE)  # Granite
    rope_theta: float = field(default=10000.0, metadata=OUTSIDE)
    rope_scaling: dict | None = field(default=None, metadata=OUTSIDE)
    embedding_multiplier: float = field(default=1.0, metadata=OUTSIDE)  # Granite
    logits_scaling: float = field(default=1.0, metadata=OUTSIDE)  # logits are divided by it
    hidden_act: str = field(default="silu", metadata=FEATURE)
    rotary_dim: int | None = field(default=None, metadata=FEATURE)  # None: the whole head_dim
    sliding_windows: tuple[int | None, ...] = field(default=(), metadata=FEATURE)  # per layer
    qkv_bias: bool = field(default=False, metadata=FEATURE)
    o_bias: bool = field(default=False, metadata=FEATURE)
    mlp_bias: bool = field(default=False, metadata=FEATURE)
    qk_norm: bool = field(default=False, metadata=FEATURE)  # Qwen3: per-head q/k RMSNorm

    @property
    def rotary_size(self) -> int:
        return self.head_dim if self.rotary_dim is None else self.rotary_dim

    def sliding_window(self, layer_idx: int) -> int | None:
        return self.sliding_windows[layer_idx] if self.sliding_windows else None


def field_role(spec_type: type, name: str) -> str | None:
    for f in dataclasses.fields(spec_type):
        if f.name == name:
            return f.metadata.get("role")
    return None


def read_model_type(model_dir: Path) -> str | None:
    """config.json's `model_type` (None when absent or unreadable: the loader reports those)."""
    try:
        return json.loads((Path(model_dir) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def load_hf_config(model_dir: Path, trust_remote_code: bool = False):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(f"cannot read the model config in {model_dir}: {e}") from e


def has_remote_causal_lm(hf_config) -> bool:
    """Whether the config maps AutoModelForCausalLM to code in the checkpoint's repository."""
    auto_map = getattr(hf_config, "auto_map", None) or {}
    return "AutoModelForCausalLM" in auto_map


def require(hf_config, name: str):
    value = getattr(hf_config, name, None)
    if value is None:
        raise ModelLoadError(f"config.json has no '{name}'")
    return value


def rope_scaling(hf_config) -> dict | None:
    scaling = getattr(hf_config, "rope_scaling", None)
    if not scaling:
        return None
    scaling = dict(scaling)
    scaling["rope_type"] = scaling.get("rope_type", scaling.get("type", "default"))
    return scaling


def sliding_windows(hf_config, num_layers: int) -> tuple[int | None, ...]:
    window = getattr(hf_config, "sliding_window", None)
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types is None:
        return (window,) * num_layers
    return tuple(window if t == "sliding_attention" else None for t in layer_types)


def attention_heads(hf_config) -> tuple[int, int, int]:
    """(num_heads, num_kv_heads, head_dim), checked."""
    num_heads = require(hf_config, "num_attention_heads")
    num_kv_heads = getattr(hf_config, "num_key_value_heads", None) or num_heads
    if num_heads % num_kv_heads:
        raise ModelLoadError(
            f"num_attention_heads ({num_heads}) is not a multiple of "
            f"num_key_value_heads ({num_kv_heads})"
        )
    head_dim = (
        getattr(hf_config, "head_dim", None) or require(hf_config, "hidden_size") // num_heads
    )
    return num_heads, num_kv_heads, head_dim


def common_fields(hf_config, architecture: str) -> dict:
    """The `ModelSpec` fields, read the same way for every family."""
    dtype = getattr(hf_config, "dtype", None)  # transformers >= 4.56 name of `torch_dtype`
    return dict(
        architecture=architecture,
        vocab_size=require(hf_config, "vocab_size"),
        hidden_size=require(hf_config, "hidden_size"),
        num_layers=require(hf_config, "num_hidden_layers"),
        max_position_embeddings=require(hf_config, "max_position_embeddings"),
        tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        checkpoint_dtype=str(dtype).removeprefix("torch.") if dtype is not None else None,
    )


def decoder_spec_from_hf(hf_config, architecture: str, flags: dict | None = None) -> DecoderSpec:
    """The Llama-family spec; `flags` (from the registry) override fields for aliases."""
    common = common_fields(hf_config, architecture)
    num_heads, num_kv_heads, head_dim = attention_heads(hf_config)
    attention_bias = bool(getattr(hf_config, "attention_bias", False))
    partial = getattr(hf_config, "partial_rotary_factor", 1.0)
    spec = DecoderSpec(
        **common,
        intermediate_size=require(hf_config, "intermediate_size"),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rms_norm_eps=getattr(hf_config, "rms_norm_eps", 1e-6),
        attention_scale=getattr(hf_config, "attention_multiplier", None) or head_dim**-0.5,
        residual_multiplier=getattr(hf_config, "residual_multiplier", 1.0),
        rope_theta=float(getattr(hf_config, "rope_theta", 10000.0)),
        rope_scaling=rope_scaling(hf_config),
        embedding_multiplier=getattr(hf_config, "embedding_multiplier", 1.0),
        logits_scaling=getattr(hf_config, "logits_scaling", 1.0),
        hidden_act=getattr(hf_config, "hidden_act", "silu"),
        rotary_dim=None if partial == 1.0 else int(head_dim * partial),
        sliding_windows=sliding_windows(hf_config, common["num_layers"]),
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        mlp_bias=bool(getattr(hf_config, "mlp_bias", False)),
    )
    return dataclasses.replace(spec, **(flags or {}))
