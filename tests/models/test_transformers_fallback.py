"""The transformers fallback: which architectures resolve to it, what it builds (pytgi attention
layers with their own KV cache specs on transformers' modules, the checkpoint's parameter names),
and the models it refuses, each with its reason. Its parity with transformers is in
test_parity.py / engine/test_llm_parity.py (FALLBACK_ARCHS and the `@transformers` rows).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from fixtures.tiny_models import BASE, make_hf_config
from safetensors import safe_open

from pytgi.backends.base import FullAttentionSpec, SlidingWindowSpec
from pytgi.config import ModelConfig
from pytgi.distributed.parallel_state import TPInfo
from pytgi.errors import ModelLoadError
from pytgi.layers.attention import Attention
from pytgi.layers.build_context import BuildContext, build_context
from pytgi.models import weights
from pytgi.models.causal_lm_table import causal_lm_table
from pytgi.models.loader import build_model
from pytgi.models.registry import NATIVE, TRANSFORMERS, resolve_architecture
from pytgi.models.transformers_fallback import TransformersCausalLM


def build(model_dir, implementation: str = "auto"):
    config = ModelConfig(model_id=str(model_dir), implementation=implementation)
    return build_model(config, model_dir, BuildContext(), torch.device("cpu"))[0]


def build_from_config(hf_config) -> TransformersCausalLM:
    """The fallback model of an in-memory config (no weights: what the constructor refuses)."""
    arch = hf_config.architectures[0]
    spec = TransformersCausalLM.spec_from_hf(hf_config, arch, {})
    with build_context(BuildContext()):
        return TransformersCausalLM(spec)


def test_table_read_from_source_is_transformers_table():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    assert causal_lm_table() == dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def test_resolution_native_first_then_fallback():
    assert resolve_architecture(["LlamaForCausalLM"])[1].implementation == NATIVE
    assert resolve_architecture(["Olmo2ForCausalLM"])[1].implementation == TRANSFORMERS
    name, entry = resolve_architecture(["LlamaForCausalLM"], "transformers")
    assert (name, entry.implementation) == ("LlamaForCausalLM", TRANSFORMERS)
    # the checkpoint's own code only when asked (--trust-remote-code with an auto_map)
    with pytest.raises(ModelLoadError, match="unsupported model architecture"):
        resolve_architecture(["InternLM2ForCausalLM"])
    name, entry = resolve_architecture(["InternLM2ForCausalLM"], remote_code=True)
    assert entry.implementation == TRANSFORMERS and entry.flags == {"trust_remote_code": True}


@pytest.mark.parametrize(
    ("arch", "implementation"), [("olmo2", "auto"), ("mistral", "transformers")]
)
def test_fallback_attaches_paged_attention_per_layer(arch, implementation, tiny_model_factory):
    model_dir = tiny_model_factory(arch)
    model = build(model_dir, implementation)
    assert isinstance(model, TransformersCausalLM)
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    assert [m.layer_name for m in layers] == [
        f"model.layers.{i}.self_attn.pytgi_attention" for i in range(BASE["num_hidden_layers"])
    ]
    window = 24 if arch == "mistral" else None  # fixtures: Mistral's sliding_window
    spec_type = SlidingWindowSpec if window else FullAttentionSpec
    assert all(type(m.kv_cache_spec()) is spec_type for m in layers)
    assert {(m.num_heads, m.num_kv_heads, m.head_dim, m.sliding_window) for m in layers} == {
        (4, 2, 16, window)
    }
    assert model.fused_decode_layers() is None
    with safe_open(model_dir / "model.safetensors", "pt") as f:  # the checkpoint's own names
        assert {n for n, _ in model.named_parameters()} == set(f.keys())


def test_tied_head_under_another_name(tiny_model_factory):
    model = build(tiny_model_factory("gpt_neox"))  # tied: embed_out is not in the checkpoint
    assert model.embed_out.weight is model.gpt_neox.embed_in.weight


def test_missing_tensor_is_refused_before_any_tensor_is_read(
    tiny_model_factory, tmp_path, monkeypatch
):
    from safetensors.torch import load_file, save_file

    model_dir = tmp_path / "olmo2"
    shutil.copytree(tiny_model_factory("olmo2"), model_dir)
    tensors = load_file(model_dir / "model.safetensors")
    del tensors["model.layers.1.self_attn.q_norm.weight"]
    save_file(tensors, model_dir / "model.safetensors", metadata={"format": "pt"})

    def no_reads(*args):
        raise AssertionError("a tensor was read")

    monkeypatch.setattr(weights, "_get_tensor", no_reads)
    with pytest.raises(ModelLoadError, match=r"missing 1 tensor.*layers\.1\.self_attn\.q_norm"):
        build(model_dir)


@pytest.mark.parametrize(
    ("config_class", "arch", "overrides", "reason"),
    [
        ("DeepseekV3Config", "DeepseekV3ForCausalLM",  # value heads narrower than the keys'
         {"q_lora_rank": None, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
          "v_head_dim": 8, "n_routed_experts": 4, "num_experts_per_tok": 2,
          "moe_intermediate_size": 16},
         "attention backend does not support head_size_v != head_size"),
        ("MambaConfig", "MambaForCausalLM", {"state_size": 4},
         "does not take custom attention functions"),
        # OPT builds its own causal mask: fine, unless the config has a window it would apply
        ("OPTConfig", "OPTForCausalLM", {"ffn_dim": 128, "sliding_window": 8},
         "applies its sliding window \\(8\\) in a mask it builds itself"),
    ],
)  # fmt: skip
def test_refuses_what_paged_attention_cannot_run(config_class, arch, overrides, reason):
    import transformers

    config = getattr(transformers, config_class)(**BASE, **overrides)
    config.architectures = [arch]
    with pytest.raises(ModelLoadError, match=reason):
        build_from_config(config)


def test_plain_causal_masks():
    from pytgi.models.transformers_attention import is_plain_causal

    causal = torch.tensor([[True, False], [True, True]])
    assert is_plain_causal(causal[None, None])
    additive = torch.zeros(1, 1, 2, 3).masked_fill_(
        ~torch.tensor([[1, 0, 0], [1, 1, 0]]).bool(), -1e30
    )
    assert is_plain_causal(additive)  # a padding column beyond the keys (Persimmon)
    alibi = additive.clone()
    alibi[..., 1, 0] = -0.5  # a distance bias on a visible key
    assert not is_plain_causal(alibi)
    assert not is_plain_causal(torch.ones(1, 1, 2, 2, dtype=torch.bool))  # not causal


def test_refuses_tensor_parallelism():
    arch = make_hf_config("olmo2").architectures[0]
    spec = TransformersCausalLM.spec_from_hf(make_hf_config("olmo2"), arch, {})
    with build_context(BuildContext(tp=TPInfo(0, 2))):
        with pytest.raises(ModelLoadError, match="does not shard"):
            TransformersCausalLM(spec)


def test_model_type_must_fit_the_architecture(tiny_model_factory, tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_factory("llama"), model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config["architectures"] = ["Olmo2ForCausalLM"]  # model_type stays llama
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="model_type 'llama' does not fit"):
        build(model_dir)


CUSTOM_CONFIG = """from transformers import LlamaConfig


class TinyCustomConfig(LlamaConfig):
    model_type = "tiny-custom"
"""
CUSTOM_MODEL = """from transformers import LlamaForCausalLM

from .configuration_tiny_custom import TinyCustomConfig


class TinyCustomForCausalLM(LlamaForCausalLM):
    config_class = TinyCustomConfig
"""


def test_checkpoint_code_runs_only_when_trusted(tiny_model_factory, tmp_path):
    """A checkpoint shipping its own modeling code (auto_map): refused without
    --trust-remote-code, served through the fallback with it, with the same logits."""
    from models.runner_utils import BlockAllocator, hf_logits, load_hf, prompt, scheduled, step

    from pytgi.backends.selector import select_platform
    from pytgi.config import EngineConfig
    from pytgi.worker.model_runner import ModelRunner

    model_dir = tmp_path / "custom"
    shutil.copytree(tiny_model_factory("llama"), model_dir)
    (model_dir / "configuration_tiny_custom.py").write_text(CUSTOM_CONFIG)
    (model_dir / "modeling_tiny_custom.py").write_text(CUSTOM_MODEL)
    config = json.loads((model_dir / "config.json").read_text())
    config.update(
        model_type="tiny-custom",
        architectures=["TinyCustomForCausalLM"],
        auto_map={
            "AutoConfig": "configuration_tiny_custom.TinyCustomConfig",
            "AutoModelForCausalLM": "modeling_tiny_custom.TinyCustomForCausalLM",
        },
    )
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError):
        build(model_dir)
    config = EngineConfig(model=ModelConfig(model_id=str(model_dir), trust_remote_code=True))
    runner = ModelRunner(config, select_platform())
    runner.load_model(model_dir)
    runner.allocate_kv_cache(8)
    assert isinstance(runner.model, TransformersCausalLM)
    assert type(runner.model._hf_model[0]).__name__ == "TinyCustomForCausalLM"
    ids = prompt(20, 1)
    logits = runner.forward(step(scheduled("r", ids, 0, len(ids), BlockAllocator().take(20))))
    reference = hf_logits(load_hf(tiny_model_factory("llama")), ids)[-1]
    assert (logits[0] - reference).abs().max() < 1e-4
