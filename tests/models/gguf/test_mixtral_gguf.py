"""A Mixtral GGUF in llama.cpp's layout (`llama` architecture with expert_count, router
`ffn_gate_inp`, experts stacked in `ffn_{gate,up,down}_exps`, here Q8_0): served natively as
Mixtral, with the same greedy tokens and close logits as transformers' Mixtral holding the same
(dequantized) weights; the older one-tensor-per-expert layout is refused in one line."""

from __future__ import annotations

import os

import gguf
import pytest
import torch
from fixtures.gguf_files import write_llama_gguf
from models.runner_utils import load_hf, make_runner
from models.test_parity import assert_close, hf_greedy, prompt, scheduled, step

from pytgi.errors import ModelLoadError
from pytgi.models.gguf.prepared import prepared_dir

Q = gguf.GGMLQuantizationType


def experts_q8(hf_name: str):
    return Q.Q8_0 if ".experts." in hf_name else Q.F32


def _q8_roundtrip(weight: torch.Tensor) -> torch.Tensor:
    data = gguf.quants.quantize(weight.numpy(), Q.Q8_0)
    return torch.from_numpy(gguf.quants.dequantize(data, Q.Q8_0)).reshape(weight.shape)


@pytest.fixture(scope="module")
def mixtral_gguf(tiny_model_factory, tmp_path_factory):
    model_dir = tiny_model_factory("mixtral")
    path = tmp_path_factory.mktemp("mixtral-gguf") / "tiny-mixtral.gguf"
    write_llama_gguf(model_dir, path, experts_q8)
    hf = load_hf(model_dir)
    with torch.no_grad():  # the reference holds what the file holds
        for name, param in hf.named_parameters():
            if ".experts." in name:
                param.copy_(_q8_roundtrip(param))
    return path, hf


def test_mixtral_gguf_matches_transformers_on_its_weights(mixtral_gguf):
    torch.set_num_threads(1)
    path, hf = mixtral_gguf
    runner = make_runner(prepared_dir(path, os.environ["PYTGI_CACHE_DIR"]))
    assert runner.spec.architecture == "MixtralForCausalLM"
    assert runner.spec.moe.num_experts == 4 and runner.spec.moe.top_k == 2
    ids = prompt(14, seed=3)
    blocks = list(range(4))
    tokens, ref_logits = hf_greedy(hf, ids, 8)
    ours = []
    for i in range(8):
        seq = ids + ours
        start = 0 if i == 0 else len(seq) - 1
        logits = runner.forward(step(scheduled("a", seq, start, len(seq), blocks, num_prompt=14)))
        assert_close(logits[0], ref_logits[i], f"mixtral gguf step {i}")
        ours.append(int(logits[0].argmax()))
    assert ours == tokens


def test_per_expert_gguf_layout_is_refused():
    from pytgi.models.gguf.names import hf_name, llama_name_map

    with pytest.raises(ModelLoadError, match="one tensor per expert") as err:
        hf_name(llama_name_map(1, 2), "blk.0.ffn_gate.0.weight")
    assert "\n" not in str(err.value)
