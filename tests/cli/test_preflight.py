"""cli/preflight's model checks: what the launcher and `pytgi generate` refuse before an engine
starts, from config.json and the file list alone (no torch)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pytgi.cli.preflight import ModelPlan, check_model_dir
from pytgi.errors import ModelLoadError

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
OLMO2 = {"architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2"}


def model_dir(tmp_path, config, weights=("model.safetensors",)):
    path = tmp_path / "model"
    path.mkdir(parents=True)
    if config is not None:
        text = config if isinstance(config, str) else json.dumps(config)
        (path / "config.json").write_text(text)
    for name in weights:
        (path / name).write_bytes(b"")  # listed, never read
    return path


@pytest.mark.parametrize(
    ("config", "options", "plan"),
    [
        (LLAMA, {}, ModelPlan("LlamaForCausalLM", "native")),
        (OLMO2, {}, ModelPlan("Olmo2ForCausalLM", "transformers")),
        (LLAMA, {"implementation": "transformers"}, ModelPlan("LlamaForCausalLM", "transformers")),
        ({"architectures": ["InternLM2ForCausalLM"],
          "auto_map": {"AutoModelForCausalLM": "modeling_internlm2.InternLM2ForCausalLM"}},
         {"trust_remote_code": True}, ModelPlan("InternLM2ForCausalLM", "transformers")),
    ],
)  # fmt: skip
def test_plans(tmp_path, config, options, plan):
    assert check_model_dir(model_dir(tmp_path, config), **options) == plan


def test_descriptions():
    assert ModelPlan("X", "native").description == "X (native implementation)"
    assert ModelPlan("X", "transformers").description == "X (transformers fallback implementation)"


@pytest.mark.parametrize(
    ("config", "options", "message"),
    [
        (None, {}, "No config.json in"),
        ("{not json", {}, "Cannot read"),
        ("[1, 2]", {}, "is not a JSON object"),
        ({"model_type": "llama"}, {}, r"unsupported model architecture \(none in config.json\)"),
        ({"architectures": ["NoSuchModelForCausalLM"]}, {},
         "unsupported model architecture.*NoSuchModelForCausalLM.*LlamaForCausalLM.* natively"),
        ({"architectures": ["InternLM2ForCausalLM"],
          "auto_map": {"AutoModelForCausalLM": "modeling_internlm2.InternLM2ForCausalLM"}}, {},
         "ships its own modeling code.*--trust-remote-code"),
        (OLMO2, {"num_shard": 2}, "Olmo2ForCausalLM runs on the transformers fallback.*shard"),
        ({**OLMO2, "quantization_config": {"quant_method": "gptq"}}, {},
         "does not run quantized checkpoints \\(gptq\\)"),
        ({"architectures": ["BartForCausalLM"], "is_encoder_decoder": True}, {},
         "decoder-only models"),
        ({"architectures": ["Gemma3nForConditionalGeneration"], "vision_config": {}}, {},
         "text-only models \\(config.json has vision_config\\)"),
        ({"architectures": ["Lfm2ForCausalLM"], "layer_types": ["conv", "full_attention"]}, {},
         "every layer is attention.*layer_types has conv"),
    ],
)  # fmt: skip
def test_refusals(tmp_path, config, options, message):
    with pytest.raises(ModelLoadError, match=message):
        check_model_dir(model_dir(tmp_path, config), **options)


def test_native_models_may_shard(tmp_path):
    assert check_model_dir(model_dir(tmp_path, LLAMA), num_shard=2).implementation == "native"


def test_weight_files(tmp_path):
    with pytest.raises(ModelLoadError, match="No safetensors weights found"):
        check_model_dir(model_dir(tmp_path / "a", LLAMA, weights=()))
    path = model_dir(tmp_path / "b", LLAMA, weights=())
    index = {"weight_map": {"x": "model-00001-of-00002.safetensors",
                            "y": "model-00002-of-00002.safetensors"}}  # fmt: skip
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    (path / "model-00001-of-00002.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="model-00002-of-00002.safetensors.*is missing"):
        check_model_dir(path)
    pickles = model_dir(tmp_path / "c", LLAMA, weights=("pytorch_model.bin",))
    with pytest.raises(ModelLoadError, match="--allow-pickle-weights"):
        check_model_dir(pickles)
    assert check_model_dir(pickles, allow_pickle_weights=True).implementation == "native"


def test_imports_no_torch(tmp_path):
    path = model_dir(tmp_path, OLMO2)
    code = (
        "import sys; from pytgi.cli.preflight import check_model_dir; "
        f"print(check_model_dir({str(path)!r}).implementation); "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "transformers"
