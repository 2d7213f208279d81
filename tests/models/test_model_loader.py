"""Model building: the registry's architectures, and load errors that name the offending tensor."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from pytgi.config import ModelConfig
from pytgi.errors import ModelLoadError
from pytgi.models.loader import build_model
from pytgi.models.registry import resolve_architecture, supported_architectures

ARCH_NAMES = [
    "GraniteForCausalLM",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
]


@pytest.fixture
def model_copy(tiny_model_factory, tmp_path):
    src = tiny_model_factory("llama")
    dst = tmp_path / "model"
    shutil.copytree(src, dst)
    return dst


def build(model_dir):
    return build_model(
        ModelConfig(model_id=str(model_dir)), model_dir, torch.float32, torch.device("cpu")
    )


def edit_weights(model_dir, edit) -> None:
    path = model_dir / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_registry_lists_and_resolves():
    assert set(ARCH_NAMES) <= set(supported_architectures())
    name, entry = resolve_architecture(["SomethingElse", "Qwen3ForCausalLM"])
    assert name == "Qwen3ForCausalLM" and entry.flags == {"qk_norm": True}


def test_unknown_architecture_lists_supported(model_copy):
    config = json.loads((model_copy / "config.json").read_text())
    config["architectures"] = ["FalconMambaForCausalLM"]
    (model_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="FalconMambaForCausalLM") as e:
        build(model_copy)
    assert all(name in e.value.message for name in ARCH_NAMES)


def test_shape_mismatch_names_tensor_and_shapes(model_copy):
    name = "model.layers.1.mlp.up_proj.weight"
    edit_weights(model_copy, lambda t: t.update({name: torch.zeros(100, 64)}))
    with pytest.raises(ModelLoadError, match=rf"{name}.*\(100, 64\).*\(128, 64\)"):
        build(model_copy)


def test_missing_tensor(model_copy):
    edit_weights(model_copy, lambda t: t.pop("model.layers.0.self_attn.k_proj.weight"))
    with pytest.raises(ModelLoadError, match=r"missing 1 tensor.*layers\.0\.self_attn\.qkv_proj"):
        build(model_copy)


def test_unexpected_tensor(model_copy):
    edit_weights(model_copy, lambda t: t.update({"model.extra.weight": torch.zeros(2)}))
    with pytest.raises(ModelLoadError, match="unexpected tensor 'model.extra.weight'"):
        build(model_copy)


def test_sharded_checkpoint_and_tied_head(tiny_model_factory):
    model, spec = build(tiny_model_factory("llama", shards=3))
    assert spec.num_layers == 2 and not spec.tie_word_embeddings
    model, spec = build(tiny_model_factory("llama_tied"))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.lm_head.blocks is model.model.embed_tokens.blocks  # CPU fp32: held once
