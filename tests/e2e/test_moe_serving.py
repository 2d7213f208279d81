"""The real server on tiny mixture-of-experts checkpoints (Mixtral; DeepSeek-V3 with latent
attention and its latent cache; Llama 4's text model): served natively (`/info` names the
architecture, the log the native implementation), greedy tokens through TGI's client equal
transformers' generate in one continuous batch, on one rank and with DeepSeek's experts and
latent-attention heads (and Llama 4's) sharded over two ranks (each rank holds its slice of
every expert); and DeepSeek-V3 stored as DeepSeek ships V3 / R1 (every linear block-wise FP8
with `weight_scale_inv`, kv_b_proj included) over two ranks, equal to transformers on the
dequantized weights."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from models.runner_utils import hf_greedy_texts
from text_generation import Client

from e2e.server import ServerProcess

PROMPTS = ["The quick brown fox", "Hello world! How are you", "def main():"]
NEW_TOKENS = 12
CASES = {
    "mixtral": ("mixtral", "MixtralForCausalLM", ()),
    "mixtral-gguf": ("mixtral", "MixtralForCausalLM", ()),  # llama.cpp's stacked-expert file
    "deepseek_v3-tp2": ("deepseek_v3", "DeepseekV3ForCausalLM", ("--num-shard", "2")),
    # DeepSeek's FP8 layout as a real V3 / R1 is served: sharded (one rank: test_moe_fp8.py)
    "deepseek_v3-fp8-tp2": ("deepseek_v3", "DeepseekV3ForCausalLM", ("--num-shard", "2")),
    # chunked attention, no-rope layers, sigmoid router; heads and experts over two ranks
    "llama4-tp2": ("llama4", "Llama4ForCausalLM", ("--num-shard", "2")),
}


@pytest.fixture(scope="module", params=list(CASES))
def served(request, tiny_model_factory, tmp_path_factory):
    arch, architecture, extra = CASES[request.param]
    model_dir = tiny_model_factory(arch)
    served_path = model_dir
    if request.param.endswith("-gguf"):  # full-precision tensors: the reference is the checkpoint
        from fixtures.gguf_files import write_llama_gguf

        served_path = tmp_path_factory.mktemp("moe-gguf") / f"tiny-{arch}.gguf"
        write_llama_gguf(model_dir, served_path)
    if "-fp8" in request.param:  # the reference holds the dequantized weights
        from fixtures.prequantized import DEEPSEEK_FP8_OVERRIDES, write_deepseek_fp8

        source = tiny_model_factory(arch, **DEEPSEEK_FP8_OVERRIDES)  # q_lora, multi-block
        served_path, model_dir = write_deepseek_fp8(source, tmp_path_factory.mktemp("moe-fp8"))
    log = tmp_path_factory.mktemp(f"moe-{request.param}") / "server.log"
    server = ServerProcess(served_path, *extra, log_path=log)
    try:
        server.wait_healthy(timeout_s=240)
        yield server, model_dir, architecture
    finally:
        server.stop()


def _reference(model_dir) -> dict[str, list[int]]:
    return hf_greedy_texts(model_dir, PROMPTS, NEW_TOKENS)


def test_served_natively_with_transformers_greedy_tokens(served):
    server, model_dir, architecture = served
    info = httpx.get(f"{server.url}/info").json()
    assert info["model_architecture"] == architecture
    assert info["model_implementation"] == "native"
    assert f"loaded {architecture} (native implementation" in server.logs()
    reference = _reference(model_dir)
    client = Client(server.url, timeout=120)

    def generate(prompt: str):
        return client.generate(prompt, max_new_tokens=NEW_TOKENS, decoder_input_details=True)

    with ThreadPoolExecutor(len(PROMPTS)) as pool:  # one continuous batch
        responses = list(pool.map(generate, PROMPTS))
    for prompt, resp in zip(PROMPTS, responses, strict=True):
        ids = [t.id for t in resp.details.tokens]
        assert ids == reference[prompt][: len(ids)], prompt
        assert len(ids) == NEW_TOKENS or ids[-1] == 2  # length, or the tiny model's EOS


def test_mixtral_decode_steps_run_on_the_fused_stack(served, request):
    """One rank, fp32 safetensors: the MoE layers are in the fused CPU decode stack (the greedy
    tokens above came through it)."""
    if request.node.callspec.params["served"] != "mixtral":
        pytest.skip("the fused stack serves one rank with fp32 experts (and int8-ready linears)")
    server, _, _ = served
    assert "fused decode stack on (2 layers" in server.logs()
