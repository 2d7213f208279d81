"""A Mixtral GGUF in llama.cpp's layout (`llama` architecture with expert_count, router
`ffn_gate_inp`, experts stacked in `ffn_{gate,up,down}_exps`, here Q8_0): served natively as
Mixtral, with the same greedy tokens and close logits as transformers' Mixtral holding the same
(dequantized) weights; the older one-tensor-per-expert layout is refused in one line.

The same for files llama.cpp's own tools wrote from a tiny random Mixtral checkpoint:
convert_hf_to_gguf.py at f32 and q8_0 (its own quantizer; it also writes the router as
`ffn_gate`, quantized), and llama-quantize's Q4_0 from the f32 file; the reference is
transformers' Mixtral holding every tensor of the file as gguf-py dequantizes it, pytgi runs
with full-precision activations.
"""

from __future__ import annotations

import os

import gguf
import pytest
import torch
from fixtures.gguf_files import mixtral_from_gguf, write_llama_gguf
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
    assert_greedy_matches(runner, hf)


def assert_greedy_matches(runner, hf) -> None:
    """8 greedy steps after a 14-token prompt: the same tokens, logits within the parity ATOL."""
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


# the types llama.cpp's tools store a tiny Mixtral's tensors in (64-wide rows: no K-quants)
LLAMACPP_TYPES = {
    "f32": {"F32": 23},
    "q8_0": {"Q8_0": 18, "F32": 5},  # norms stay F32; the router (`ffn_gate`) is quantized
    "Q4_0": {"Q4_0": 17, "Q8_0": 1, "F32": 5},  # the output: Q6_K falls back to Q8_0
}


@pytest.mark.parametrize("outtype", list(LLAMACPP_TYPES))
def test_llamacpp_mixtral_matches_transformers_on_its_weights(llamacpp_mixtral, outtype):
    torch.set_num_threads(1)
    path, model_dir = llamacpp_mixtral(outtype)
    reader = gguf.GGUFReader(path)
    types = {}
    for tensor in reader.tensors:
        types[tensor.tensor_type.name] = types.get(tensor.tensor_type.name, 0) + 1
    assert types == LLAMACPP_TYPES[outtype]
    names = {t.name for t in reader.tensors}
    assert "blk.0.ffn_gate_exps.weight" in names and "blk.0.ffn_up.weight" not in names
    hf = mixtral_from_gguf(model_dir, path)
    directory = prepared_dir(path, os.environ["PYTGI_CACHE_DIR"])
    assert_greedy_matches(make_runner(directory, quantize_activations="fp32"), hf)


def test_per_expert_gguf_layout_is_refused():
    from pytgi.models.gguf.names import hf_name, llama_name_map

    with pytest.raises(ModelLoadError, match="one tensor per expert") as err:
        hf_name(llama_name_map(1, 2), "blk.0.ffn_gate.0.weight")
    assert "\n" not in str(err.value)
