"""GGUFCheckpoint's tensors: a tiny Llama written as GGUF against its safetensors checkpoint and
against transformers' own GGUF loading; refusals of what pytgi cannot serve."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from fixtures.gguf_files import Q, random_blocks
from safetensors.torch import load_file

from pytgi.errors import ModelLoadError
from pytgi.layers.quantization.quantized_weight import QuantizedWeight
from pytgi.models.gguf.checkpoint import GGUFCheckpoint


def as_float(value) -> torch.Tensor:
    return value.dequantize() if isinstance(value, QuantizedWeight) else value.float()


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(torch.int32)


@pytest.mark.parametrize("arch", ["llama", "llama_tied"])
def test_f32_gguf_equals_the_safetensors_checkpoint(gguf_factory, arch):
    path, model_dir = gguf_factory(arch)
    expected = load_file(str(model_dir / "model.safetensors"))
    weights = dict(GGUFCheckpoint(path).iter_weights())
    assert weights.keys() == expected.keys()  # tied: no lm_head in either
    for name, tensor in weights.items():
        assert tensor.dtype == torch.float32
        assert torch.equal(tensor, expected[name]), name


def test_tied_embeddings_follow_the_missing_output_tensor(gguf_factory):
    assert GGUFCheckpoint(gguf_factory("llama_tied")[0]).hf_config.tie_word_embeddings
    assert not GGUFCheckpoint(gguf_factory("llama")[0]).hf_config.tie_word_embeddings


def test_every_type_equals_transformers_gguf_loading(mixed_gguf):
    """Dequantised, each tensor (q/k un-permuted on the codes) is bit for bit what
    `AutoModelForCausalLM.from_pretrained(..., gguf_file=...)` loads."""
    from transformers import AutoModelForCausalLM

    path, _ = mixed_gguf
    checkpoint = GGUFCheckpoint(path)
    assert set(checkpoint.tensor_types()) >= {
        "Q8_0",
        "Q4_0",
        "Q4_1",
        "Q5_0",
        "Q5_1",
        "Q4_K",
        "Q5_K",
        "Q6_K",
        "F16",
        "BF16",
        "F32",
    }
    reference = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    state = reference.state_dict()
    weights = dict(checkpoint.iter_weights())
    assert weights.keys() == state.keys()
    for name, value in weights.items():
        assert torch.equal(bits(as_float(value)), bits(state[name])), name


def test_quantized_tensors_stay_quantized(mixed_gguf):
    weights = dict(GGUFCheckpoint(mixed_gguf[0]).iter_weights())
    q_proj = weights["model.layers.0.self_attn.q_proj.weight"]
    assert isinstance(q_proj, QuantizedWeight) and q_proj.source == "Q4_K"
    assert weights["model.embed_tokens.weight"].dtype == torch.bfloat16
    assert weights["lm_head.weight"].dtype == torch.float16
    assert weights["model.norm.weight"].dtype == torch.float32


def test_tensors_are_read_one_at_a_time(tiny_gguf, monkeypatch):
    from pytgi.models.gguf import checkpoint as module

    reads = []
    monkeypatch.setattr(module, "read_tensor", lambda t: reads.append(t.name) or module.np.ones(1))
    iterator = GGUFCheckpoint(tiny_gguf[0]).iter_weights()
    assert reads == []
    next(iterator)
    assert len(reads) == 1


def _write(path, arch="llama", tensors=(), fields=None):
    writer = gguf.GGUFWriter(path, arch=arch)
    writer.add_block_count(1)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    for key, value in (fields or {}).items():
        writer.add_uint32(key, value)
    for name, data, qtype in tensors:
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("arch", ["qwen2", "gpt2", "phi3"])
def test_other_architectures_are_refused_by_name(tmp_path, arch):
    path = _write(tmp_path / "m.gguf", arch=arch)
    with pytest.raises(ModelLoadError, match=f"GGUF architecture `{arch}` is not supported"):
        GGUFCheckpoint(path)


def test_unsupported_tensor_type_is_named(tmp_path):
    raw = np.zeros((4, 84), dtype=np.uint8)  # Q2_K: 84 bytes per 256 elements
    path = _write(tmp_path / "m.gguf", tensors=[("blk.0.attn_q.weight", raw, Q.Q2_K)])
    checkpoint = GGUFCheckpoint(path)
    with pytest.raises(ModelLoadError, match="`blk.0.attn_q.weight` has type Q2_K"):
        list(checkpoint.iter_weights())


def test_unknown_tensor_is_named(tmp_path):
    raw = random_blocks(Q.Q8_0, 2, 32)
    path = _write(tmp_path / "m.gguf", tensors=[("blk.0.ffn_gate_exps.weight", raw, Q.Q8_0)])
    with pytest.raises(ModelLoadError, match="`blk.0.ffn_gate_exps.weight` has no counterpart"):
        list(GGUFCheckpoint(path).iter_weights())


def test_rope_freqs_go_into_the_config_not_the_weights(tmp_path):
    factors = np.array([1.0, 1.5, 4.0, 8.0], dtype=np.float32)
    path = _write(tmp_path / "m.gguf", tensors=[("rope_freqs.weight", factors, None)])
    checkpoint = GGUFCheckpoint(path)
    assert list(checkpoint.iter_weights()) == []
    scaling = checkpoint.hf_config.rope_scaling
    assert scaling == {"rope_type": "freq_factors", "freq_factors": [1.0, 1.5, 4.0, 8.0]}


def test_missing_shape_metadata_is_named(tmp_path):
    writer = gguf.GGUFWriter(tmp_path / "m.gguf", arch="llama")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match="no `llama.feed_forward_length` metadata"):
        GGUFCheckpoint(tmp_path / "m.gguf")


def test_split_files_are_refused(tmp_path):
    path = _write(tmp_path / "m.gguf", fields={"split.count": 3})
    with pytest.raises(ModelLoadError, match="one of 3 split files"):
        GGUFCheckpoint(path)


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelLoadError, match="Cannot read GGUF file"):
        GGUFCheckpoint(path)


def test_truncated_file(tiny_gguf, tmp_path):
    data = tiny_gguf[0].read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="Cannot read GGUF file"):
        GGUFCheckpoint(path)
