"""A tiny Llama quantized on the fly each `--quantize` way, through the real ModelRunner (loader,
layers, attention, LM head): close logits to its fp32 self, the same greedy tokens on most
positions, a tied embedding served from the quantized head, int8 and fp32 activations, and one
arithmetic per row (a prompt's logits are the same alone and inside a mixed batch)."""

from __future__ import annotations

import pytest
import torch
from models.runner_utils import BlockAllocator, make_runner, prompt, scheduled, step

from pytgi import envs
from pytgi.backends.selector import select_platform
from pytgi.config import CacheConfig, EngineConfig, ModelConfig
from pytgi.layers.quantization.activations import FP32_ONLY
from pytgi.layers.quantization.registry import SUPPORTED_QUANTIZE
from pytgi.worker.model_runner import ModelRunner

# method -> (max |logit error| / max |fp32 logit|, min cosine similarity of the logits); random
# tiny weights, 2 layers
BOUNDS = {
    "eetq": (0.03, 0.999),
    "bitsandbytes": (0.03, 0.999),
    "fp8": (0.08, 0.99),
    "bitsandbytes-nf4": (0.3, 0.95),
    "bitsandbytes-fp4": (0.4, 0.9),
}
PROMPTS = [prompt(n, seed=n) for n in (1, 7, 16, 33)]


def quantized_runner(model_dir, method: str) -> ModelRunner:
    model = ModelConfig(model_id=str(model_dir), quantize=method, **envs.model_fields())
    config = EngineConfig(model=model,
                          cache=CacheConfig())  # fmt: skip
    runner = ModelRunner(config, select_platform())
    runner.load_model(model_dir)
    runner.allocate_kv_cache(64)
    return runner


def prompt_logits(runner: ModelRunner) -> torch.Tensor:
    blocks = BlockAllocator()
    out = step(
        *(scheduled(f"r{i}", p, 0, len(p), blocks.take(len(p))) for i, p in enumerate(PROMPTS))
    )
    return runner.forward(out)  # [4, V]


@pytest.fixture(scope="module", params=["llama", "llama_tied"])
def model(request, tiny_model_factory):
    """(checkpoint, fp32 logits, quantize the LM head too): the tied model's head is quantized,
    so its embedding rows come from the packed head."""
    torch.set_num_threads(1)
    model_dir = tiny_model_factory(request.param)
    return model_dir, prompt_logits(make_runner(model_dir)), request.param == "llama_tied"


@pytest.mark.parametrize("acts", ["int8", "fp32"])
@pytest.mark.parametrize("method", SUPPORTED_QUANTIZE)
def test_quantized_logits_close_to_fp32(model, method, acts, monkeypatch):
    model_dir, reference, quantize_head = model
    if acts == "int8" and method in FP32_ONLY:
        pytest.skip(f"--quantize-activations int8 is refused for {method}")
    monkeypatch.setenv("PYTGI_QUANT_ACTIVATIONS", acts)
    monkeypatch.setenv("PYTGI_QUANTIZE_LM_HEAD", "1" if quantize_head else "0")
    runner = quantized_runner(model_dir, method)
    quantized = [m for m in runner.model.modules() if getattr(m, "quant_packed", None) is not None]
    assert len(quantized) == 8 + quantize_head  # 2 layers x (qkv, o, gate_up, down) (+ head)
    logits = prompt_logits(runner)
    max_err, min_cos = BOUNDS[method]
    err = ((logits - reference).abs().max() / reference.abs().max()).item()
    assert err < max_err, f"{method}: relative logit error {err:.3f}"
    cos = torch.nn.functional.cosine_similarity(logits, reference, dim=-1).min().item()
    assert cos > min_cos, f"{method}: logits cosine similarity {cos:.4f}"
    if method in ("eetq", "bitsandbytes"):  # 4-bit flips near-tied greedy tokens of random models
        assert torch.equal(logits.argmax(-1), reference.argmax(-1))


@pytest.mark.parametrize("method", ["bitsandbytes", "bitsandbytes-nf4"])
def test_quantized_rows_are_batch_invariant(tiny_model_factory, method, monkeypatch):
    """A prompt alone, then with others and a chunked neighbour: the same logits."""
    monkeypatch.setenv("PYTGI_QUANTIZE_LM_HEAD", "1")
    runner = quantized_runner(tiny_model_factory("llama_tied"), method)
    blocks = BlockAllocator()
    target = PROMPTS[2]
    alone = runner.forward(step(scheduled("t", target, 0, len(target), blocks.take(16))))
    other = PROMPTS[3]
    mixed = runner.forward(
        step(
            scheduled("o", other, 0, 20, blocks.take(len(other)), sample=False),
            scheduled("t", target, 0, len(target), blocks.take(16)),
            scheduled("x", PROMPTS[1], 0, len(PROMPTS[1]), blocks.take(7)),
        )
    )
    torch.testing.assert_close(mixed[0], alone[0], rtol=0, atol=1e-5)
