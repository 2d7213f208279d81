"""Mixture-of-experts (and latent-attention) families against transformers' eager forward, through
the ModelRunner: the same steps as test_parity.py (mixed prompts, chunked prefill mixed with
decodes, prefix-cache hits, 32 greedy decode steps) on tiny random checkpoints with several
experts, top-k >= 2, shared experts and dense layers."""

from __future__ import annotations

import pytest
import torch
from fixtures.tiny_models import MOE_ARCHS
from models.runner_utils import BlockAllocator, load_hf, make_runner, scheduled, step
from models.test_parity import (  # noqa: F401 (collected here with this module's `pair`)
    test_chunked_prefill_mixed_with_decode,
    test_greedy_decode_matches_generate,
    test_mixed_prompts_in_one_step,
    test_prefix_cache_hit,
)


@pytest.fixture(scope="module", params=list(MOE_ARCHS))
def pair(request, tiny_model_factory):
    torch.set_num_threads(1)
    model_dir = tiny_model_factory(request.param)
    runner = make_runner(model_dir)
    assert runner.model.__class__.__module__.startswith("pytgi.models."), "not native"
    return request.param, runner, load_hf(model_dir)


@pytest.mark.parametrize("arch", ["mixtral", "deepseek_v3", "qwen2_moe"])
def test_quantized_experts_close_to_fp32(arch, tiny_model_factory):
    """--quantize on an MoE model quantizes every expert (and the other linears): logits close
    to its fp32 self (the int8 bound of test_quantized_models.py)."""
    from models.test_quantized_models import PROMPTS, quantized_runner

    torch.set_num_threads(1)
    model_dir = tiny_model_factory(arch)
    fp32 = make_runner(model_dir)
    runner = quantized_runner(model_dir, "eetq")
    experts = runner.model.model.layers[-1].mlp.experts
    assert experts[0].gate_up_proj.quant_method.__class__.__name__ != "UnquantizedLinearMethod"
    blocks = BlockAllocator()
    out = step(
        *(scheduled(f"r{i}", p, 0, len(p), blocks.take(len(p))) for i, p in enumerate(PROMPTS))
    )
    reference, logits = fp32.forward(out), runner.forward(out)
    error = (logits - reference).abs().max() / reference.abs().max()
    cosine = torch.nn.functional.cosine_similarity(logits, reference, dim=-1).min()
    assert error < 0.03 and cosine > 0.999, (float(error), float(cosine))


@pytest.mark.parametrize("arch", ["dbrx", "llama4"])
def test_quantized_stacked_experts_are_refused_in_one_line(arch, tiny_model_factory):
    from pytgi.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="stacked checkpoint experts") as err:
        make_runner(tiny_model_factory(arch), quantize="eetq")
    assert "\n" not in str(err.value)


def test_deepseek_skips_multi_token_prediction_layers(tiny_model_factory, tmp_path, caplog):
    """A DeepSeek-V3 checkpoint's MTP layer (model.layers.{num_hidden_layers}.*) is ignored with
    a log line."""
    import shutil

    from safetensors.torch import load_file, save_file

    source = tiny_model_factory("deepseek_v3")
    model_dir = tmp_path / "with-mtp"
    shutil.copytree(source, model_dir)
    tensors = load_file(model_dir / "model.safetensors")
    extra = {
        k.replace("layers.2.", "layers.3."): v.clone()
        for k, v in tensors.items()
        if "layers.2." in k
    }
    save_file({**tensors, **extra}, model_dir / "model.safetensors", {"format": "pt"})
    with caplog.at_level("INFO"):
        runner = make_runner(model_dir, num_blocks=8)
    assert runner.spec.num_layers == 3
    assert "multi-token-prediction layer(s) (model.layers.3 and beyond)" in caplog.text
