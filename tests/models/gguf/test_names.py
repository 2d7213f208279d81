"""llama.cpp -> HF names and the q/k row un-permutation, against llama.cpp's and transformers'."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from fixtures.gguf_files import Q, llama_cpp_permute, random_blocks

from pytgi.errors import ModelLoadError
from pytgi.models.gguf.blocks import decode_blocks
from pytgi.models.gguf.names import llama_name_map, unpermute_rows


@pytest.mark.parametrize(("rows", "heads"), [(64, 4), (48, 2), (576, 9), (192, 3)])
def test_unpermute_inverts_llama_cpp_permute(rows, heads):
    hf = np.random.default_rng(0).standard_normal((rows, 8)).astype(np.float32)
    gguf_rows = torch.from_numpy(llama_cpp_permute(hf, heads))
    assert torch.equal(unpermute_rows(gguf_rows, heads), torch.from_numpy(hf))
    bias = torch.arange(rows, dtype=torch.float32)
    permuted_bias = torch.from_numpy(llama_cpp_permute(bias.numpy(), heads))
    assert torch.equal(unpermute_rows(permuted_bias, heads), bias)


def test_unpermute_matches_transformers():
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    weights = np.random.default_rng(1).standard_normal((96, 16)).astype(np.float32)
    processor = LlamaTensorProcessor({"num_attention_heads": 6, "num_key_value_heads": 2})
    for name, heads in (("blk.0.attn_q.weight", 6), ("blk.0.attn_k.weight", 2)):
        rows = weights if ".attn_q." in name else weights[:32]
        expected = processor.process(weights=rows, name=name).weights
        assert torch.equal(
            unpermute_rows(torch.from_numpy(rows), heads), torch.from_numpy(expected)
        )


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q4_1, Q.Q8_0], ids=lambda t: t.name)
def test_unpermute_is_exact_on_quantized_rows(qtype):
    raw = random_blocks(qtype, 24, 256, seed=2)
    weight = unpermute_rows(decode_blocks(raw, qtype, "w"), 3)
    expected = unpermute_rows(torch.from_numpy(gguf.quants.dequantize(raw, qtype)), 3)
    assert torch.equal(weight.dequantize().view(torch.int32), expected.view(torch.int32))
    assert weight.source == qtype.name


def test_bad_head_count():
    with pytest.raises(ModelLoadError, match="Cannot split 10 q/k rows into 4 rotary heads"):
        unpermute_rows(torch.zeros(10, 2), 4)


def test_name_map_matches_transformers():
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        attention_bias=True,
        mlp_bias=True,
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    expected = get_gguf_hf_weights_map(model)
    ours = llama_name_map(3)
    assert {k: ours[k] for k in expected} == expected
    assert set(ours.values()) == set(model.state_dict())  # every weight and bias, nothing else


def test_llama_cpp_names():
    names = llama_name_map(2)
    assert names["token_embd.weight"] == "model.embed_tokens.weight"
    assert names["output.weight"] == "lm_head.weight"
    assert names["output_norm.weight"] == "model.norm.weight"
    assert names["blk.1.attn_q.weight"] == "model.layers.1.self_attn.q_proj.weight"
    assert names["blk.0.ffn_down.weight"] == "model.layers.0.mlp.down_proj.weight"
    assert names["blk.0.attn_output.bias"] == "model.layers.0.self_attn.o_proj.bias"
