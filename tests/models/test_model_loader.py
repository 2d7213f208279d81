"""Model building: the registry's architectures, and load errors that name the offending tensor."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from pytgi.config import ModelConfig
from pytgi.errors import ModelLoadError
from pytgi.layers.build_context import BuildContext
from pytgi.models.base import CausalLM
from pytgi.models.loader import build_model, load_weights
from pytgi.models.registry import resolve_architecture, supported_architectures

ARCH_NAMES = [
    "BaiChuanForCausalLM",
    "BaichuanForCausalLM",
    "CohereForCausalLM",
    "FalconForCausalLM",
    "GPT2LMHeadModel",
    "GPTBigCodeForCausalLM",
    "GPTJForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "GemmaForCausalLM",
    "GraniteForCausalLM",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Phi3ForCausalLM",
    "PhiForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Starcoder2ForCausalLM",
]


@pytest.fixture
def model_copy(tiny_model_factory, tmp_path):
    src = tiny_model_factory("llama")
    dst = tmp_path / "model"
    shutil.copytree(src, dst)
    return dst


def build(model_dir):
    return build_model(
        ModelConfig(model_id=str(model_dir)), model_dir, BuildContext(), torch.device("cpu")
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
    config["architectures"] = ["NoSuchModelForCausalLM"]  # neither native nor in transformers
    (model_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="NoSuchModelForCausalLM") as e:
        build(model_copy)
    assert all(name in e.value.message for name in ARCH_NAMES)
    assert "transformers fallback" in e.value.message


def test_architecture_that_does_not_fit_the_config(model_copy):
    config = json.loads((model_copy / "config.json").read_text())
    config["architectures"] = ["FalconMambaForCausalLM"]  # a transformers class; model_type llama
    (model_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="model_type 'llama' does not fit.*FalconMamba"):
        build(model_copy)


def test_shape_mismatch_names_tensor_and_shapes(model_copy):
    name = "model.layers.1.mlp.up_proj.weight"
    edit_weights(model_copy, lambda t: t.update({name: torch.zeros(100, 64)}))
    with pytest.raises(ModelLoadError, match=rf"{name}.*\(100, 64\).*\(128, 64\)"):
        build(model_copy)


def test_missing_tensor(model_copy):
    edit_weights(model_copy, lambda t: t.pop("model.layers.0.self_attn.k_proj.weight"))
    # named as the checkpoint names it: the missing shard of the fused qkv_proj
    with pytest.raises(ModelLoadError, match=r"missing 1 tensor.*layers\.0\.self_attn\.k_proj"):
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


class ToyExperts(torch.nn.Module):
    """Experts stacked into one parameter [E, 2 * I, D] (gate and up of each expert), the layout
    MoE kernels want; the checkpoint has one tensor per expert and projection."""

    def __init__(self, num_experts: int, dim: int, inner: int):
        super().__init__()
        self.w13 = torch.nn.Parameter(torch.zeros(num_experts, 2 * inner, dim), requires_grad=False)
        self.w13.weight_loader = self.load
        self.inner = inner

    def load(self, param, loaded, shard_id, expert_id):
        offset = 0 if shard_id == "w1" else self.inner
        param.data[expert_id, offset : offset + self.inner].copy_(loaded)


class ToyModel(CausalLM):
    """Declares every loader hook: a rename, a transposed (Conv1D-style) weight, stacked experts."""

    weight_renames = ((r"^transformer\.", "model."),)
    transposed_weights = (r"\.c_fc\.weight$",)

    def __init__(self, num_experts: int = 3):
        super().__init__()
        self.spec = SimpleNamespace(tie_word_embeddings=False)
        self.model = torch.nn.Module()
        self.model.c_fc = torch.nn.Linear(4, 6, bias=False)
        self.model.experts = ToyExperts(num_experts, dim=4, inner=2)
        self.num_experts = num_experts

    def expert_weight_mapping(self):
        return [
            ("experts.w13", f"experts.{e}.{name}_proj.weight", e, shard)
            for e in range(self.num_experts)
            for name, shard in (("gate", "w1"), ("up", "w3"))
        ]


def toy_checkpoint(num_experts: int = 3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    tensors = {"transformer.c_fc.weight": torch.randn(4, 6, generator=g)}  # stored [in, out]
    for e in range(num_experts):
        for name in ("gate", "up"):
            tensors[f"transformer.experts.{e}.{name}_proj.weight"] = torch.randn(2, 4, generator=g)
    return tensors


def test_loader_renames_transposes_and_stacks_experts():
    model, tensors = ToyModel(), toy_checkpoint()
    load_weights(model, tensors.items())
    torch.testing.assert_close(model.model.c_fc.weight, tensors["transformer.c_fc.weight"].t())
    for e in range(3):
        stacked = model.model.experts.w13[e]
        torch.testing.assert_close(
            stacked[:2], tensors[f"transformer.experts.{e}.gate_proj.weight"]
        )
        torch.testing.assert_close(stacked[2:], tensors[f"transformer.experts.{e}.up_proj.weight"])


def test_a_missing_expert_is_named_as_in_the_checkpoint():
    tensors = toy_checkpoint()
    del tensors["transformer.experts.2.up_proj.weight"]
    with pytest.raises(ModelLoadError, match=r"missing 1 tensor.*model\.experts\.2\.up_proj"):
        load_weights(ToyModel(), tensors.items())


@pytest.mark.parametrize(
    ("arch", "overrides", "message"),
    [
        ("cohere", {"use_qk_norm": True}, "use_qk_norm"),
        ("gpt2", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
        ("gemma3", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ],
)
def test_family_options_pytgi_does_not_compute_are_refused(arch, overrides, message):
    from fixtures.tiny_models import make_hf_config

    from pytgi.models.registry import get_model_class

    config = make_hf_config(arch, **overrides)
    _, entry = resolve_architecture(config.architectures)
    with pytest.raises(ModelLoadError, match=message):
        get_model_class(entry).spec_from_hf(config, config.architectures[0], entry.flags)
