"""A DeepSeek-V3-style block-wise FP8 checkpoint (`weight_scale_inv` per 128 x 128 block, as
DeepSeek ships V3 / R1) on the tiny DeepSeek-V3: its quantized experts (and attention
projections) load through the pre-quantized FP8 path, one quantized pair per expert, and the
logits equal transformers' on the dequantized weights."""

from __future__ import annotations

import json
import shutil

import torch
from models.runner_utils import BlockAllocator, load_hf, make_runner, prompt, scheduled, step

QUANTIZED = (".experts.", ".q_proj.", ".o_proj.")  # kv_b_proj stays in full precision


def fp8_blockwise(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [n, k] -> (e4m3 codes [n, k], weight_scale_inv [ceil(n/128), ceil(k/128)])."""
    n, k = w.shape
    blocks = torch.nn.functional.pad(w, (0, -k % 128, 0, -n % 128)).unflatten(0, (-1, 128))
    blocks = blocks.unflatten(2, (-1, 128))  # [N/128, 128, K/128, 128]
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0  # [N/128, K/128]
    expanded = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
    return (w / expanded).to(torch.float8_e4m3fn), scale


def test_deepseek_fp8_checkpoint_matches_transformers_on_dequantized_weights(
    tiny_model_factory, tmp_path
):
    from safetensors.torch import load_file, save_file

    torch.set_num_threads(1)
    model_dir = tmp_path / "deepseek-fp8"
    shutil.copytree(tiny_model_factory("deepseek_v3"), model_dir)
    tensors = load_file(model_dir / "model.safetensors")
    out, dequantized = {}, {}
    for name, w in tensors.items():
        if name.endswith(".weight") and w.dim() == 2 and any(q in name for q in QUANTIZED):
            codes, scale = fp8_blockwise(w.float())
            out[name], out[name.replace(".weight", ".weight_scale_inv")] = codes, scale
            expanded = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)
            dequantized[name] = codes.float() * expanded[: w.shape[0], : w.shape[1]]
        else:
            out[name] = w
    save_file(out, model_dir / "model.safetensors", {"format": "pt"})
    config = json.loads((model_dir / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    }
    (model_dir / "config.json").write_text(json.dumps(config))

    runner = make_runner(model_dir)
    experts = runner.model.model.layers[-1].mlp.experts
    assert "Prequantized" in type(experts[0].gate_up_proj.quant_method).__name__
    hf = load_hf(tiny_model_factory("deepseek_v3"))
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if name in dequantized:
                param.copy_(dequantized[name])
    blocks = BlockAllocator()
    prompts = [prompt(n, seed=n) for n in (5, 19)]
    logits = runner.forward(
        step(
            *(scheduled(f"r{i}", p, 0, len(p), blocks.take(len(p))) for i, p in enumerate(prompts))
        )
    )
    for row, p in zip(logits, prompts, strict=True):
        with torch.no_grad():
            expected = hf(torch.tensor([p])).logits[0, -1]
        assert (row - expected).abs().max() < 1e-3
