"""Normalises a Hugging Face config into `ModelSpec`: the fields the shared blocks need, one
spelling.

Architectures that differ from Llama only by a flag get it from the registry (`flags`), e.g. Qwen2's
q/k/v bias or Qwen3's per-head q/k RMSNorm. Granite's multipliers are read when the config has them
and are neutral (1.0 / the usual 1/sqrt(head_dim) scale) otherwise.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from pytgi.errors import ModelLoadError


@dataclass(frozen=True)
class ModelSpec:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    hidden_act: str
    rope_theta: float
    rope_scaling: dict | None
    rotary_dim: int
    tie_word_embeddings: bool
    sliding_windows: tuple[int | None, ...]  # per layer; None = full attention
    attention_scale: float
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0  # logits are divided by it
    checkpoint_dtype: str | None = None


def load_hf_config(model_dir: Path, trust_remote_code: bool = False):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(f"cannot read the model config in {model_dir}: {e}") from e


def _require(hf_config, name: str):
    value = getattr(hf_config, name, None)
    if value is None:
        raise ModelLoadError(f"config.json has no '{name}'")
    return value


def _rope_scaling(hf_config) -> dict | None:
    scaling = getattr(hf_config, "rope_scaling", None)
    if not scaling:
        return None
    scaling = dict(scaling)
    scaling["rope_type"] = scaling.get("rope_type", scaling.get("type", "default"))
    return scaling


def _sliding_windows(hf_config, num_layers: int) -> tuple[int | None, ...]:
    window = getattr(hf_config, "sliding_window", None)
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types is None:
        return (window,) * num_layers
    return tuple(window if t == "sliding_attention" else None for t in layer_types)


def model_spec_from_hf(hf_config, architecture: str, flags: dict | None = None) -> ModelSpec:
    """Build the spec; `flags` (from the registry) override fields for architecture aliases."""
    num_heads = _require(hf_config, "num_attention_heads")
    hidden_size = _require(hf_config, "hidden_size")
    num_kv_heads = getattr(hf_config, "num_key_value_heads", None) or num_heads
    if num_heads % num_kv_heads:
        raise ModelLoadError(
            f"num_attention_heads ({num_heads}) is not a multiple of "
            f"num_key_value_heads ({num_kv_heads})"
        )
    head_dim = getattr(hf_config, "head_dim", None) or hidden_size // num_heads
    num_layers = _require(hf_config, "num_hidden_layers")
    attention_bias = bool(getattr(hf_config, "attention_bias", False))
    dtype = getattr(hf_config, "dtype", None)  # transformers >= 4.56 name of `torch_dtype`
    spec = ModelSpec(
        architecture=architecture,
        vocab_size=_require(hf_config, "vocab_size"),
        hidden_size=hidden_size,
        intermediate_size=_require(hf_config, "intermediate_size"),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=_require(hf_config, "max_position_embeddings"),
        rms_norm_eps=getattr(hf_config, "rms_norm_eps", 1e-6),
        hidden_act=getattr(hf_config, "hidden_act", "silu"),
        rope_theta=float(getattr(hf_config, "rope_theta", 10000.0)),
        rope_scaling=_rope_scaling(hf_config),
        rotary_dim=int(head_dim * getattr(hf_config, "partial_rotary_factor", 1.0)),
        tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        sliding_windows=_sliding_windows(hf_config, num_layers),
        attention_scale=getattr(hf_config, "attention_multiplier", None) or head_dim**-0.5,
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        mlp_bias=bool(getattr(hf_config, "mlp_bias", False)),
        embedding_multiplier=getattr(hf_config, "embedding_multiplier", 1.0),
        residual_multiplier=getattr(hf_config, "residual_multiplier", 1.0),
        logits_scaling=getattr(hf_config, "logits_scaling", 1.0),
        checkpoint_dtype=str(dtype).removeprefix("torch.") if dtype is not None else None,
    )
    return dataclasses.replace(spec, **(flags or {}))
