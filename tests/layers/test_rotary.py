"""Rotary embeddings: inverse frequencies of every scaling variant against transformers'
ROPE_INIT_FUNCTIONS, cos/sin against LlamaRotaryEmbedding (dynamic NTK beyond the trained length
included), and the rotate-half application against apply_rotary_pos_emb."""

from __future__ import annotations

import pytest
import torch
from fixtures.tiny_models import make_hf_config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from pytgi.errors import ModelLoadError
from pytgi.layers.build_context import BuildContext, build_context
from pytgi.layers.rotary import ROPE_SCALINGS, ApplyRotary, apply_rotary, get_rope
from pytgi.models.config import decoder_spec_from_hf

EXTRA_SCALINGS = {
    "yarn_mscale": {
        "rope_type": "yarn",
        "factor": 8.0,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 64,
        "beta_fast": 16.0,
    },
    "yarn_attention_factor": {
        "rope_type": "yarn",
        "factor": 2.0,
        "attention_factor": 1.3,
        "truncate": False,
    },
    "llama3_wide": {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 128,
    },
    "old_type_key": {"type": "linear", "factor": 4.0},
}

CASES = {
    "default": make_hf_config("llama"),
    "llama3": make_hf_config("llama3_rope"),
    "linear": make_hf_config("llama_linear_rope"),
    "dynamic": make_hf_config("llama_dynamic_rope"),
    "yarn": make_hf_config("llama_yarn_rope"),
    **{name: make_hf_config("llama", rope_scaling=s) for name, s in EXTRA_SCALINGS.items()},
}


def ours(config, seq_len=None):
    spec = decoder_spec_from_hf(config, "LlamaForCausalLM")
    scaling = spec.rope_scaling or {"rope_type": "default"}
    fn = ROPE_SCALINGS[scaling["rope_type"]]
    args = (spec.rotary_size, spec.rope_theta, spec.max_position_embeddings, scaling)
    return fn(*args, seq_len) if seq_len is not None else fn(*args)


@pytest.mark.parametrize("name", list(CASES))
def test_inv_freq_matches_transformers(name):
    config = CASES[name]
    rope_type = (config.rope_scaling or {}).get("rope_type", "default")
    expected, expected_factor = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")
    inv_freq, factor = ours(config)
    torch.testing.assert_close(inv_freq, expected, rtol=1e-6, atol=0)
    assert factor == pytest.approx(expected_factor, rel=1e-9)


@pytest.mark.parametrize("seq_len", [64, 65, 100, 300])
def test_dynamic_inv_freq_for_long_sequences(seq_len):
    config = CASES["dynamic"]
    expected, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, "cpu", seq_len=seq_len)
    torch.testing.assert_close(ours(config, seq_len)[0], expected, rtol=1e-6, atol=0)


def rope_for(config, max_model_len: int = 1024):
    """The model's rotary table, sized for max_model_len positions (past max_position_embeddings
    when a server serves longer sequences)."""
    spec = decoder_spec_from_hf(config, "LlamaForCausalLM")
    with build_context(BuildContext(max_model_len=max_model_len)):
        return get_rope(
            spec.head_dim,
            spec.rotary_size,
            spec.max_position_embeddings,
            spec.rope_theta,
            spec.rope_scaling,
        )


@pytest.mark.parametrize("name", list(CASES))
def test_cos_sin_match_llama_rotary_embedding(name):
    config = CASES[name]
    positions = torch.tensor([0, 1, 5, 63, 200, 511, 700])  # 700: past max_position_embeddings
    cos, sin = rope_for(config)(positions, torch.float32)  # [T, 1, D]
    hf = LlamaRotaryEmbedding(config)
    x = torch.zeros(1)
    for i, p in enumerate(positions.tolist()):
        # per position, as transformers' decode step with a KV cache sees it (dynamic: seq_len p+1)
        hf_cos, hf_sin = hf(x, torch.tensor([[p]]))
        torch.testing.assert_close(cos[i, 0], hf_cos[0, 0], rtol=1e-5, atol=1e-6)
        half = hf_sin.shape[-1] // 2
        torch.testing.assert_close(sin[i, 0, half:], hf_sin[0, 0, half:], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(sin[i, 0, :half], -hf_sin[0, 0, :half], rtol=1e-5, atol=1e-6)


def test_apply_rotary_matches_transformers(cpu_kernels):
    config = CASES["llama3"]
    positions = torch.arange(9) * 7
    cos, sin = rope_for(config)(positions, torch.float32)
    hf_cos, hf_sin = LlamaRotaryEmbedding(config)(torch.zeros(1), positions.unsqueeze(0))
    q, k = torch.randn(9, 4, 16), torch.randn(9, 2, 16)  # [T, heads, D]
    hf_q, hf_k = apply_rotary_pos_emb(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], hf_cos, hf_sin
    )
    torch.testing.assert_close(apply_rotary(q, cos, sin), hf_q[0].transpose(0, 1))
    torch.testing.assert_close(apply_rotary(k, cos, sin), hf_k[0].transpose(0, 1))
    # the op (in place with the kernels) on a strided view of a fused qkv row (the model's call)
    qkv = torch.cat([q, k, torch.randn(9, 2, 16)], dim=1)  # [T, 8, D]
    rotate = ApplyRotary()
    assert (rotate.kernels is not None) == (cpu_kernels == "compiled")
    rotated = rotate(qkv[:, :6], cos, sin)
    torch.testing.assert_close(rotated[:, :4], hf_q[0].transpose(0, 1))
    torch.testing.assert_close(rotated[:, 4:], hf_k[0].transpose(0, 1))


def test_partial_rotary_leaves_the_tail():
    rope = get_rope(head_dim=16, rotary_dim=8, max_position=32, base=10000.0, scaling=None)
    cos, sin = rope(torch.arange(4), torch.float32)
    x = torch.randn(4, 2, 16)
    out = apply_rotary(x, cos, sin)
    torch.testing.assert_close(out[..., 8:], x[..., 8:])
    torch.testing.assert_close(out[0], x[0])  # position 0 is the identity


def test_unknown_rope_type_is_a_load_error():
    with pytest.raises(ModelLoadError, match="unsupported rope_scaling type .made_up."):
        get_rope(16, 16, 32, 10000.0, {"rope_type": "made_up", "factor": 2.0})


def test_longrope_matches_phi3_per_position():
    """Phi-3's LongRoPE: short factors below original_max_position_embeddings, long ones from it
    on (what transformers' Phi3RotaryEmbedding computes for a sequence of that length), and the
    attention factor of max_position / original on both."""
    from transformers import Phi3Config
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    scaling = {"type": "longrope", "short_factor": [1.0, 1.2, 1.5, 2.0]}
    scaling["long_factor"] = [2.0, 3.0, 5.0, 9.0]
    config = Phi3Config(
        hidden_size=64,
        num_attention_heads=4,
        partial_rotary_factor=0.5,
        max_position_embeddings=512,
        original_max_position_embeddings=64,
        rope_scaling=scaling,
    )
    ours = get_rope(
        16,
        8,
        512,
        config.rope_theta,
        {**scaling, "rope_type": "longrope", "original_max_position_embeddings": 64},
    )
    positions = torch.tensor([0, 5, 63, 64, 100, 511])
    cos, sin = ours(positions, torch.float32)
    for i, p in enumerate(positions.tolist()):
        hf_cos, hf_sin = Phi3RotaryEmbedding(config)(torch.zeros(1), torch.tensor([[p]]))
        torch.testing.assert_close(cos[i, 0], hf_cos[0, 0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(sin[i, 0, 4:], hf_sin[0, 0, 4:], rtol=1e-5, atol=1e-6)
    short, factor = ROPE_SCALINGS["longrope"](8, config.rope_theta, 512, ours.scaling)
    expected, expected_factor = ROPE_INIT_FUNCTIONS["longrope"](config, "cpu")
    torch.testing.assert_close(short, expected, rtol=1e-6, atol=0)
    assert factor == pytest.approx(expected_factor)


@pytest.mark.parametrize("family", ["gptj", "cohere"])
def test_interleaved_rotary_matches_transformers(family, cpu_kernels):
    """GPT-J's and Cohere's pairwise layout (feature 2i with 2i + 1), on part of the head (GPT-J)
    and on the whole head (Cohere), through the op on a strided view as the model calls it."""
    positions = torch.arange(7) * 5
    q = torch.randn(7, 4, 16)  # [T, heads, D]
    if family == "gptj":
        from transformers.models.gptj.modeling_gptj import (
            apply_rotary_pos_emb as gptj_apply,
        )
        from transformers.models.gptj.modeling_gptj import create_sinusoidal_positions

        rotary_dim = 8
        sincos = create_sinusoidal_positions(64, rotary_dim)[positions]  # [T, rd]
        sin, cos = sincos[None].chunk(2, dim=-1)  # [1, T, rd / 2]
        rotated = gptj_apply(q[None, :, :, :rotary_dim], sin, cos)[0]
        expected = torch.cat([rotated, q[..., rotary_dim:]], dim=-1)
    else:
        from transformers import CohereConfig
        from transformers.models.cohere.modeling_cohere import (
            CohereRotaryEmbedding,
            apply_rotary_pos_emb,
        )

        rotary_dim = 16
        config = CohereConfig(hidden_size=64, num_attention_heads=4)
        hf_cos, hf_sin = CohereRotaryEmbedding(config)(torch.zeros(1), positions[None])
        expected = apply_rotary_pos_emb(
            q.transpose(0, 1)[None], q.transpose(0, 1)[None], hf_cos, hf_sin
        )[0][0].transpose(0, 1)
    rope = get_rope(16, rotary_dim, 64, 10000.0, None, interleaved=True)
    cos, sin = rope(positions, torch.float32)
    torch.testing.assert_close(apply_rotary(q, cos, sin, interleaved=True), expected)
    qkv = torch.cat([q, torch.randn(7, 2, 16)], dim=1)  # [T, 6, D]
    rotate = ApplyRotary(interleaved=True)
    torch.testing.assert_close(rotate(qkv[:, :4], cos, sin), expected)
