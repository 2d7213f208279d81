"""Model specs: what a model family reads from a Hugging Face config, in one spelling.

`ModelSpec` holds what every family has (the runner and the loader read it); a family's own spec
subclasses it, and the family builds it from the HF config (`CausalLM.spec_from_hf`). The shared
decoder blocks (models/blocks.py) read `DecoderSpec`; architectures that differ from Llama only by
a flag get it from the registry (`ModelEntry.flags`).

Every spec field has a role for decode-step accelerators, which run a model's decoder stack
outside its Python modules (the fused CPU decode stack): `SHAPE` (a size the accelerator takes
as a parameter), `OUTSIDE` (used by the model outside its decoder stack: embedding, rotary
tables, LM head), `FEATURE` (changes what the layers compute; its default is Llama's behaviour) or
`LOAD` (how the checkpoint stores a tensor; the loaded layers compute the same either way).
An accelerator runs a model only when it knows every non-default feature and the field has a
role at all, so a flag added later is refused until someone teaches the accelerator about it.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from pytgi.errors import ModelLoadError
from pytgi.layers.moe.config import MoEConfig

logger = logging.getLogger(__name__)

SHAPE = {"role": "shape"}
OUTSIDE = {"role": "outside"}
FEATURE = {"role": "feature"}
LOAD = {"role": "load"}  # read only while loading: the layers compute the same either way


class Block(str, enum.Enum):
    """How a layer composes attention and MLP around the residual stream (the order is the fused
    decode stack's numbering)."""

    SEQUENTIAL = "sequential"  # x + attn(norm1(x)), then + mlp(norm2(.)) (Llama)
    PARALLEL = "parallel"  # x + attn(norm(x)) + mlp(norm(x)) (Phi, GPT-J, Cohere, Falcon-7B)
    PARALLEL_TWO_NORMS = "parallel_two_norms"  # x + attn(norm1(x)) + mlp(norm2(x)) (Falcon-40B)
    SANDWICH = "sandwich"  # x + post1(attn(norm1(x))), then + post2(mlp(norm2(.))) (Gemma 2/3)


class PositionEncoding(str, enum.Enum):
    ROPE = "rope"  # rotary, in the attention layers
    LEARNED = "learned"  # a position embedding added to the token embedding (GPT-2)
    ALIBI = "alibi"  # a per-head distance bias on the scores (Falcon-RW, Baichuan-13B)


class Norm(str, enum.Enum):
    RMS = "rms"
    LAYER = "layer"


class QkvLayout(str, enum.Enum):
    """How a checkpoint that stores q/k/v as one tensor orders it."""

    CONCAT = "concat"  # [q | k | v]
    GROUPED = "grouped"  # per KV head: [its query heads | k | v] (Falcon, GPT-BigCode without MQA)


SEQUENTIAL, PARALLEL, PARALLEL_TWO_NORMS, SANDWICH = Block
BLOCKS = tuple(Block)
ROPE, LEARNED, ALIBI = PositionEncoding


def _check_choice(value, choices: type[enum.Enum], what: str) -> None:
    if value not in choices.__members__.values():
        raise ModelLoadError(f"unknown {what} '{value}'")


@dataclass(frozen=True)
class MLAConfig:
    """DeepSeek's multi-head latent attention: per token, the cache keeps the normalised latent
    (`kv_lora_rank`) and one rotary key (`qk_rope_head_dim`) shared by every head; each head's
    key is [up-projected nope part | rotary part], its value the up-projected `v_head_dim`."""

    kv_lora_rank: int
    q_lora_rank: int | None  # None: one q_proj instead of q_a_proj -> norm -> q_b_proj
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def cache_size(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim


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
    """The shared decoder blocks (models/blocks.py) and their flags. Defaults are Llama's: pre-norm
    RMSNorm, rotary attention, gated SiLU MLP; Mistral, Qwen2/3 and Granite set flags from the
    registry, the other families (models/<family>.py) build the spec from their own config."""

    intermediate_size: int = field(metadata=SHAPE)
    num_heads: int = field(metadata=SHAPE)
    num_kv_heads: int = field(metadata=SHAPE)
    head_dim: int = field(metadata=SHAPE)
    norm_eps: float = field(metadata=SHAPE)  # of every norm, RMS or Layer
    attention_scale: float = field(metadata=SHAPE)
    residual_multiplier: float = field(default=1.0, metadata=SHAPE)  # Granite
    rope_theta: float = field(default=10000.0, metadata=OUTSIDE)
    rope_scaling: dict | None = field(default=None, metadata=OUTSIDE)
    embedding_multiplier: float = field(default=1.0, metadata=OUTSIDE)  # Granite, Gemma
    logits_scaling: float = field(default=1.0, metadata=OUTSIDE)  # logits are divided by it
    logit_scale: float = field(default=1.0, metadata=OUTSIDE)  # logits are multiplied by it
    final_logit_softcap: float | None = field(default=None, metadata=OUTSIDE)  # Gemma 2
    lm_head_bias: bool = field(default=False, metadata=OUTSIDE)  # Phi, GPT-J
    hidden_act: str = field(default="silu", metadata=FEATURE)
    mlp_gated: bool = field(default=True, metadata=FEATURE)  # False: up -> act -> down
    norm: Norm = field(default=Norm.RMS, metadata=FEATURE)
    norm_bias: bool = field(default=False, metadata=FEATURE)  # LayerNorm with a bias
    # RMSNorm scales by (offset + w) (Gemma: 1 + w); folded into the weight after loading
    norm_weight_offset: float = field(default=0.0, metadata=FEATURE)
    block: Block = field(default=Block.SEQUENTIAL, metadata=FEATURE)
    position_encoding: PositionEncoding = field(default=PositionEncoding.ROPE, metadata=FEATURE)
    alibi_slope_scale: float = field(default=1.0, metadata=FEATURE)  # Falcon: head_dim ** -0.5
    rotary_dim: int | None = field(default=None, metadata=FEATURE)  # None: the whole head_dim
    rotary_interleaved: bool = field(default=False, metadata=FEATURE)  # GPT-J, Cohere: pairs
    # sliding-window layers rotate with their own base and no scaling (Gemma 3's local layers)
    local_rope_theta: float | None = field(default=None, metadata=FEATURE)
    attn_logit_softcap: float | None = field(default=None, metadata=FEATURE)  # Gemma 2
    sliding_windows: tuple[int | None, ...] = field(default=(), metadata=FEATURE)  # per layer
    qkv_bias: bool = field(default=False, metadata=FEATURE)
    o_bias: bool = field(default=False, metadata=FEATURE)
    mlp_bias: bool = field(default=False, metadata=FEATURE)
    qkv_clip: float | None = field(default=None, metadata=FEATURE)  # DBRX: q/k/v clamped to +-c
    qk_norm: bool = field(default=False, metadata=FEATURE)  # per-head q/k RMSNorm (Qwen3, Gemma 3)
    # Llama 4: per layer, its attention chunk (None: global); layers without rotary (True); the
    # weightless L2 norm of q and k after the rotary (rope layers only); the attention
    # temperature (floor_scale, attn_scale) that scales the queries of the no-rope layers
    attention_chunk_sizes: tuple[int | None, ...] = field(default=(), metadata=FEATURE)
    nope_layers: tuple[bool, ...] = field(default=(), metadata=FEATURE)
    qk_l2_norm: bool = field(default=False, metadata=FEATURE)
    attn_temperature: tuple[float, float] | None = field(default=None, metadata=FEATURE)
    qkv_checkpoint_layout: QkvLayout = field(default=QkvLayout.CONCAT, metadata=LOAD)
    # mixture-of-experts MLPs (layers/moe/config.py says which layers and how they route)
    moe: MoEConfig | None = field(default=None, metadata=FEATURE)
    # DeepSeek's multi-head latent attention instead of q/k/v heads (models/mla.py)
    mla: MLAConfig | None = field(default=None, metadata=FEATURE)

    def __post_init__(self):
        _check_choice(self.block, Block, "decoder block")
        _check_choice(self.position_encoding, PositionEncoding, "position encoding")
        _check_choice(self.norm, Norm, "norm")
        _check_choice(self.qkv_checkpoint_layout, QkvLayout, "q/k/v checkpoint layout")

    @property
    def rotary_size(self) -> int:
        return self.head_dim if self.rotary_dim is None else self.rotary_dim

    @property
    def uses_rope(self) -> bool:
        return self.position_encoding == ROPE

    def sliding_window(self, layer_idx: int) -> int | None:
        return self.sliding_windows[layer_idx] if self.sliding_windows else None

    def rope_table(self, layer_idx: int) -> int:
        """Which of the model's rotary tables layer `layer_idx` uses: 0, or 1 for a sliding-window
        layer of a model with a local rope base."""
        local = self.local_rope_theta is not None and self.sliding_window(layer_idx) is not None
        return int(local)

    def attention_chunk_size(self, layer_idx: int) -> int | None:
        return self.attention_chunk_sizes[layer_idx] if self.attention_chunk_sizes else None

    def is_nope(self, layer_idx: int) -> bool:
        """Whether layer `layer_idx` skips the rotary (Llama 4's global layers)."""
        return self.nope_layers[layer_idx] if self.nope_layers else False

    @property
    def temperature_table(self) -> int | None:
        """The index of the attention-temperature row after the rotary tables (cos holds each
        token's query scale, sin zeros), or None without temperature tuning."""
        if self.attn_temperature is None:
            return None
        return 1 + int(self.local_rope_theta is not None)


def read_model_type(model_dir: Path) -> str | None:
    """config.json's `model_type` (None when absent or unreadable: the loader reports those)."""
    try:
        return json.loads((Path(model_dir) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def load_hf_config(model_dir: Path, trust_remote_code: bool = False):
    """The checkpoint's config through transformers; for an architecture pytgi implements natively
    that transformers has no class for (Baichuan: remote code on the hub), config.json read as a
    plain `PretrainedConfig` instead, without running any of the checkpoint's code."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
    except ValueError as e:  # an unknown model_type, or remote code that is not trusted
        config = _native_plain_config(model_dir)
        if config is None:
            raise ModelLoadError(f"cannot read the model config in {model_dir}: {e}") from e
        return config
    except (OSError, KeyError) as e:
        raise ModelLoadError(f"cannot read the model config in {model_dir}: {e}") from e


def _native_plain_config(model_dir: Path):
    from transformers import PretrainedConfig

    from pytgi.models.registry import supported_architectures

    try:
        config = PretrainedConfig.from_pretrained(str(model_dir))
    except (OSError, ValueError):
        return None
    native = set(supported_architectures())
    return config if any(a in native for a in config.architectures or []) else None


def has_remote_causal_lm(hf_config) -> bool:
    """Whether the config maps AutoModelForCausalLM to code in the checkpoint's repository."""
    auto_map = getattr(hf_config, "auto_map", None) or {}
    return "AutoModelForCausalLM" in auto_map


def require(hf_config, name: str):
    value = getattr(hf_config, name, None)
    if value is None:
        raise ModelLoadError(f"config.json has no '{name}'")
    return value


def override_rope_scaling(hf_config, kind: str, factor: float) -> None:
    """TGI's --rope-scaling/--rope-factor: config.json's rope_scaling replaced by `{type,
    factor}` (the transformers fallback reads the same config, so both implementations follow)."""
    previous = getattr(hf_config, "rope_scaling", None)
    hf_config.rope_scaling = {"type": kind, "rope_type": kind, "factor": float(factor)}
    logger.info("rope scaling overridden: %s x%g (config.json: %s)", kind, factor, previous)


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


def attention_fields(hf_config) -> dict:
    """num_heads, num_kv_heads, head_dim and the default attention scale, as `DecoderSpec`
    fields."""
    num_heads, num_kv_heads, head_dim = attention_heads(hf_config)
    return dict(
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        attention_scale=head_dim**-0.5,
    )


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
        norm_eps=getattr(hf_config, "rms_norm_eps", 1e-6),
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
