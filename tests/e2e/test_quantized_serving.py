"""Quantized models through the real server: a GGUF file (every block type, picked in its
directory with --model-gguf), a checkpoint quantized on the fly with --quantize, and the real
SmolLM2-135M-Instruct Q4_1 GGUF answering a chat. `/info` and the logs name the weights; the
server's greedy tokens are the offline engine's on the same model; refused combinations end the
launcher with one line before any engine starts.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from openai import OpenAI
from text_generation import Client

from e2e.server import ServerProcess, free_port
from pytgi.backends.cpu import kernels
from pytgi.runtime.llm import LLM

PROMPTS = ["Hello world", "The quick brown fox", "1 2 3"]
NEW_TOKENS = 12


def offline_greedy(model_id: str, **options) -> dict[str, list[int]]:
    llm = LLM(model_id, **options)
    try:
        outputs = llm.generate(PROMPTS, max_new_tokens=NEW_TOKENS)
    finally:
        llm.close()
    return {p: out.token_ids for p, out in zip(PROMPTS, outputs, strict=True)}


def served_greedy(server: ServerProcess) -> dict[str, list[int]]:
    client = Client(server.url, timeout=60)
    tokens = {}
    for text in PROMPTS:
        out = client.generate(text, max_new_tokens=NEW_TOKENS)
        tokens[text] = [t.id for t in out.details.tokens]
    return tokens


def start(model_id, *flags: str, log_dir) -> ServerProcess:
    server = ServerProcess(model_id, *flags, log_path=log_dir / "server.log")
    try:
        server.wait_healthy(timeout_s=300)
    except Exception:
        server.stop()
        raise
    return server


@pytest.fixture(scope="module")
def gguf_dir(mixed_gguf, tmp_path_factory):
    """A directory holding two GGUF files: the mixed-type tiny Llama and an all-F32 one."""
    directory = tmp_path_factory.mktemp("two-ggufs")
    shutil.copy(mixed_gguf[0], directory / "mixed.gguf")
    (directory / "sub").mkdir()
    shutil.copy(mixed_gguf[0], directory / "sub" / "copy.gguf")
    return directory


@pytest.fixture(scope="module")
def gguf_server(gguf_dir, tmp_path_factory):
    server = start(gguf_dir, "--model-gguf", "mixed.gguf",
                   log_dir=tmp_path_factory.mktemp("gguf-server"))  # fmt: skip
    yield server
    server.stop()


def test_gguf_server_names_its_weights_and_serves_the_file(gguf_server, gguf_dir):
    info = httpx.get(f"{gguf_server.url}/info").json()
    assert info["model_architecture"] == "LlamaForCausalLM"
    assert info["quantize"] == "gguf"
    types = dict(item.split(" x") for item in info["weight_types"].split(", "))
    assert {k: int(v) for k, v in types.items()} == {
        "F32": 5, "BF16": 1, "F16": 1, "Q4_K": 2, "Q5_K": 2, "Q6_K": 2, "Q8_0": 2, "Q4_0": 2,
        "Q4_1": 2, "Q5_0": 1, "Q5_1": 1,
    }  # fmt: skip
    logs = gguf_server.logs()
    assert "Serving LlamaForCausalLM (native implementation), GGUF weights" in logs
    assert "GGUF Q6_K x2 -> int8 kernel (no Q6_K kernel: converted losslessly)" in logs
    assert "GGUF Q4_0 x2 -> int4 kernel" in logs
    assert "fused decode stack on (2 layers, 8 quantized linears" in logs
    assert served_greedy(gguf_server) == offline_greedy(str(gguf_dir / "mixed.gguf"))


def test_q4_k_m_file_runs_the_native_k_quant_kernels(q4_k_m_gguf, tmp_path, monkeypatch):
    """Q4_K and Q6_K layers keep their super-blocks (a fused q/k/v mixing them included; the
    quantized embedding's rows and the Q6_K head too). With fp32 activations (the exact weights)
    the server's greedy tokens are transformers' own on the same file dequantised; the int8
    kernels are held to the float64 reference in tests/backends/test_cpu_kquant.py."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, _ = q4_k_m_gguf
    monkeypatch.setenv("PYTGI_NATIVE_KQUANTS", "1")
    server = start(str(path), "--quantize-activations", "fp32", log_dir=tmp_path)
    try:
        types = httpx.get(f"{server.url}/info").json()["weight_types"]
        assert "Q4_K x11" in types and "Q6_K x5" in types
        logs = server.logs()
        assert "GGUF Q4_K / Q6_K layers on the native K-quant kernels" in logs
        served = served_greedy(server)
    finally:
        server.stop()
    reference = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for prompt, tokens in served.items():
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        out = reference.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
        assert tokens == out[0, ids.shape[1] :].tolist(), prompt


def test_openai_chat_on_a_gguf_model(gguf_server):
    client = OpenAI(base_url=f"{gguf_server.url}/v1", api_key="-")
    out = client.chat.completions.create(
        model="tgi", messages=[{"role": "user", "content": "Hi"}], max_tokens=5
    )
    choice = out.choices[0]  # a random-weight model may pick its end-of-sequence token early
    assert choice.message.role == "assistant" and 1 <= out.usage.completion_tokens <= 5
    assert choice.finish_reason == ("length" if out.usage.completion_tokens == 5 else "stop")


def test_a_forced_kernel_table_serves_the_same_tokens(gguf_dir, tmp_path, monkeypatch):
    """PYTGI_QUANT_ISA=avx2 on a CPU whose best table is another (AVX-512 VNNI): the server
    runs the AVX2 kernels, and its greedy tokens are the offline engine's on the best table (the
    tables' int8-activation results are bit-identical)."""
    module = kernels.load_cpu_kernels()
    if module is None or module.quant_isas()[0] == "avx2" or "avx2" not in module.quant_isas():
        pytest.skip("needs a CPU with AVX2 and a better table (AVX-512 VNNI) to switch between")
    monkeypatch.setenv("PYTGI_QUANT_ISA", "avx2")
    server = start(gguf_dir, "--model-gguf", "mixed.gguf", log_dir=tmp_path)
    try:
        assert "8 quantized linears on the avx2 kernels" in server.logs()
        tokens = served_greedy(server)
    finally:
        server.stop()
    monkeypatch.delenv("PYTGI_QUANT_ISA")
    assert module.quant_isa() == module.quant_isas()[0]  # this process: the best table
    assert tokens == offline_greedy(str(gguf_dir / "mixed.gguf"))


@pytest.fixture(scope="module")
def nf4_server(tiny_llama_dir, tmp_path_factory):
    server = start(tiny_llama_dir, "--quantize", "bitsandbytes-nf4",
                   log_dir=tmp_path_factory.mktemp("nf4-server"))  # fmt: skip
    yield server
    server.stop()


def test_on_the_fly_quantization_is_served_and_named(nf4_server, tiny_llama_dir):
    info = httpx.get(f"{nf4_server.url}/info").json()
    assert info["quantize"] == "bitsandbytes-nf4" and "weight_types" not in info
    assert "weights quantized with bitsandbytes-nf4" in nf4_server.logs()
    expected = offline_greedy(str(tiny_llama_dir), quantize="bitsandbytes-nf4")
    assert served_greedy(nf4_server) == expected


def launcher(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pytgi", "serve", "--hostname", "127.0.0.1",
               "--port", str(free_port()), *args]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ([], "holds several GGUF files"),
        (["--model-gguf", "mixed.gguf", "--quantize", "eetq"],
         "--quantize eetq cannot re-quantize a GGUF model"),
        (["--model-gguf", "absent.gguf"], "GGUF file `absent.gguf` not found"),
    ],
)  # fmt: skip
def test_refusals_are_one_line_before_any_engine(gguf_dir, flags, message):
    result = launcher("--model-id", str(gguf_dir), *flags)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and message in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert "Engine" not in result.stderr  # refused before the engine process started


def test_smollm2_answers_a_chat(smollm2_gguf, tmp_path):
    """The real model, served from its GGUF file, answers a question. (Not France's capital: there
    the reference's two best first tokens are 0.09 logits apart, and int8 activations, like
    llama.cpp's own server on this file, start "L'Étoile, ..." instead of "The capital ...".)"""
    server = start(smollm2_gguf, log_dir=tmp_path)
    try:
        info = httpx.get(f"{server.url}/info").json()
        assert (info["quantize"], info["weight_types"]) == ("gguf", "Q4_1 x210, F32 x61, Q8_0 x1")
        client = OpenAI(base_url=f"{server.url}/v1", api_key="-")
        out = client.chat.completions.create(
            model="tgi",
            messages=[{"role": "user", "content": "What is the capital of Germany?"}],
            max_tokens=24,
            temperature=0,
        )
        assert out.choices[0].message.content == "The capital of Germany is Berlin."
        # concurrent requests share steps (several rows per linear: the multi-row kernels, and
        # batched prefill) and still get the tokens each gets alone
        tgi = Client(server.url, timeout=120)
        prompts = [*PROMPTS, "Count to five:", "Name a colour:", "Once upon a time"]

        def greedy(text: str) -> list[int]:
            out = tgi.generate(text, max_new_tokens=NEW_TOKENS)
            return [t.id for t in out.details.tokens]

        alone = [greedy(p) for p in prompts]
        with ThreadPoolExecutor(len(prompts)) as pool:
            assert list(pool.map(greedy, prompts)) == alone
    finally:
        server.stop()


def test_tgi_form_serves_the_gguf_with_the_model_id_tokenizer(tiny_gguf, tiny_llama_dir, tmp_path):
    """`--model-id MODEL --model-gguf FILE` (TGI's llama.cpp backend): the weights of FILE, the
    tokenizer and chat template of MODEL."""
    import json

    model = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = "MODEL-ID TEMPLATE {{ messages[0]['content'] }}"
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    server = start(model, "--model-gguf", str(tiny_gguf[0]), log_dir=tmp_path)
    try:
        assert httpx.get(f"{server.url}/info").json()["quantize"] == "gguf"
        messages = [{"role": "user", "content": "hi"}]
        chat = httpx.post(f"{server.url}/chat_tokenize", json={"messages": messages}).json()
        assert chat["templated_text"] == "MODEL-ID TEMPLATE hi"
        assert served_greedy(server) == offline_greedy(str(tiny_gguf[0]))
    finally:
        server.stop()


def test_llama32_gguf_from_llama_cpp_serves_transformers_tokens_past_1000(llama32_gguf, tmp_path):
    """A Llama-3.2-shaped GGUF converted by llama.cpp (llama3 rope scaling as its rope_freqs
    tensor), served: a 1,100-token prompt's greedy continuation is transformers' on the HF
    checkpoint."""
    from models.gguf.test_llama3_rope import NEW_TOKENS, transformers_greedy

    path, model_dir = llama32_gguf
    server = start(path, "--max-input-tokens", "2000", "--max-total-tokens", "2100",
                   log_dir=tmp_path)  # fmt: skip
    try:
        text = " ".join(f"w{i % 97}x{i % 13}" for i in range(260))
        ids = [t["id"] for t in httpx.post(f"{server.url}/tokenize", json={"inputs": text}).json()]
        assert len(ids) > 1000
        out = Client(server.url, timeout=120).generate(
            text, max_new_tokens=NEW_TOKENS, decoder_input_details=False
        )
    finally:
        server.stop()
    expected, logprobs = transformers_greedy(model_dir, ids)
    assert [t.id for t in out.details.tokens] == expected
    assert [t.logprob for t in out.details.tokens] == pytest.approx(logprobs, abs=1e-3)


def test_mixtral_gguf_from_llama_cpp_q8_0_is_served_as_transformers_on_its_weights(
    llamacpp_mixtral, tmp_path
):
    """A tiny Mixtral converted by llama.cpp's convert_hf_to_gguf.py --outtype q8_0, served with
    full-precision activations: /info names Mixtral and the file's types, and a prompt's greedy
    continuation is transformers' on the file's dequantized tensors."""
    from fixtures.gguf_files import mixtral_from_gguf
    from models.test_parity import hf_greedy

    path, model_dir = llamacpp_mixtral("q8_0")
    server = start(path, "--quantize-activations", "fp32", log_dir=tmp_path)
    try:
        info = httpx.get(f"{server.url}/info").json()
        text = "The quick brown fox jumps over the lazy dog"
        ids = [t["id"] for t in httpx.post(f"{server.url}/tokenize", json={"inputs": text}).json()]
        out = Client(server.url, timeout=60).generate(text, max_new_tokens=NEW_TOKENS)
    finally:
        server.stop()
    assert (info["model_architecture"], info["quantize"]) == ("MixtralForCausalLM", "gguf")
    assert info["weight_types"] == "Q8_0 x18, F32 x5"
    expected, _ = hf_greedy(mixtral_from_gguf(model_dir, path), ids, NEW_TOKENS)
    assert [t.id for t in out.details.tokens] == expected
