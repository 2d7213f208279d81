"""The only reader of os.environ. TGI's variable names; read when called, never at import time.

The CLI uses `flag_default(name)` as the fallback of each flag (TGI: every flag has an env twin);
other helpers cover variables that are not flags (HF_TOKEN, HF_HUB_OFFLINE, ...). Only the entry
points and the config builders import this module (tests/test_envs_readers.py): everything else
gets the values through the frozen configs.
"""

from __future__ import annotations

import os

_TRUE = {"1", "true", "yes", "on"}
_MAX_TIMEOUT_S = 1e7


def get(name: str) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else None


def get_bool(name: str, default: bool = False) -> bool:
    value = get(name)
    return default if value is None else value.strip().lower() in _TRUE


def hf_token() -> str | None:
    return get("HF_TOKEN") or get("HUGGING_FACE_HUB_TOKEN") or get("HF_API_TOKEN")


def hub_offline() -> bool:
    return get_bool("HF_HUB_OFFLINE")


def hub_cache_dir() -> str | None:
    return get("HUGGINGFACE_HUB_CACHE") or get("HF_HUB_CACHE")


def torch_extensions_dir() -> str | None:
    """Root of the compiled CPU kernels' build directories (torch's variable)."""
    return get("TORCH_EXTENSIONS_DIR")


def cache_dir() -> str:
    """PYTGI_CACHE_DIR: where pytgi keeps files it derives from models (a GGUF file's config and
    tokenizer); default $XDG_CACHE_HOME/pytgi, else ~/.cache/pytgi."""
    explicit = get("PYTGI_CACHE_DIR")
    if explicit is not None:
        return explicit
    base = get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pytgi")


def compute_type() -> str | None:
    """TGI's `x-compute-type` override (the launcher's default is `{num_shard}-{device}`)."""
    return get("COMPUTE_TYPE")


def set_default_threading_env() -> None:
    """OpenMP threads must not spin while waiting (a spinning thread takes the core another
    process's thread needs on a small machine); set before torch loads."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def device_config():
    """The device config from the environment: PYTGI_DEVICE (auto, cpu or cuda; auto picks CUDA
    when torch sees a GPU), PYTGI_CPU_KERNELS=0 (keep the pure-torch path), PYTGI_FUSED_DECODE=0
    (run decode steps layer by layer even where the fused CPU decode stack or CUDA graphs could
    run them, for comparisons), and TGI's CUDA_GRAPHS / CUDA_MEMORY_FRACTION (the launcher's
    --cuda-graphs and --cuda-memory-fraction override them)."""
    from pytgi.config import DEFAULT_CUDA_GRAPHS, DeviceConfig

    graphs = get("CUDA_GRAPHS")
    fraction = get("CUDA_MEMORY_FRACTION")
    return DeviceConfig(
        kernels=get_bool("PYTGI_CPU_KERNELS", default=True),
        decode_accelerator=get_bool("PYTGI_FUSED_DECODE", default=True),
        device=(get("PYTGI_DEVICE") or "auto").strip().lower(),
        cuda_graphs=DEFAULT_CUDA_GRAPHS if graphs is None else parse_cuda_graphs(graphs),
        cuda_memory_fraction=1.0 if fraction is None else float(fraction),
        quant_isa=quant_isa(),
        native_kquants=get_bool("PYTGI_NATIVE_KQUANTS"),
        kernel_build_root=torch_extensions_dir(),
    )


def model_fields() -> dict:
    """The `ModelConfig` fields that come from the environment (PYTGI_CACHE_DIR,
    PYTGI_QUANT_ACTIVATIONS, PYTGI_QUANTIZE_LM_HEAD)."""
    return {
        "cache_dir": cache_dir(),
        "quantize_activations": quant_activations(),
        "quantize_lm_head": quantize_lm_head(),
    }


def parallel_fields() -> dict:
    """The `ParallelConfig` fields that come from the environment (PYTGI_TP_COLLECTIVE_TIMEOUT_S,
    PYTGI_TEST_RANK_FAULT)."""
    return {"collective_timeout_s": tp_collective_timeout_s(), "test_rank_fault": test_rank_fault()}


def cuda_visible_devices() -> str | None:
    """CUDA_VISIBLE_DEVICES as set (an empty value hides every GPU), None when unset."""
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def parse_cuda_graphs(value: str | tuple[int, ...]) -> tuple[int, ...]:
    """TGI's CUDA_GRAPHS / --cuda-graphs: comma-separated batch sizes; 0 entries are dropped, so
    `0` alone disables graphs."""
    sizes = [int(v) for v in value.split(",") if v.strip()] if isinstance(value, str) else value
    return tuple(size for size in sizes if size != 0)


def tp_collective_timeout_s() -> float:
    """PYTGI_TP_COLLECTIVE_TIMEOUT_S (default 60): how long a tensor-parallel rank waits in one
    collective of a step (or in the group's rendezvous) for the other ranks. Past it the engine is
    declared dead: a rank that stops answering ends the server instead of hanging it. Ranks idling
    between steps are not bounded by it."""
    return _positive_float("PYTGI_TP_COLLECTIVE_TIMEOUT_S", 60.0)


def test_rank_fault() -> tuple[int, str] | None:
    """PYTGI_TEST_RANK_FAULT="<rank>:<stage>" (tests only): that tensor-parallel rank raises at the
    named start-up stage (`load`, `warmup`), so fault handling can be tested through the real
    launcher."""
    value = get("PYTGI_TEST_RANK_FAULT")
    if value is None:
        return None
    rank, _, stage = value.partition(":")
    if not rank.strip().isdigit() or not stage.strip():
        raise ValueError(f"PYTGI_TEST_RANK_FAULT must be '<rank>:<stage>', got {value!r}")
    return int(rank), stage.strip()


def _positive_float(name: str, default: float) -> float:
    value = get(name)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 0 < number <= _MAX_TIMEOUT_S:
        raise ValueError(f"{name} must be a number of seconds in (0, 1e7], got {value!r}")
    return number


def quant_activations() -> str | None:
    """PYTGI_QUANT_ACTIVATIONS, the twin of `--quantize-activations`: how quantized linear layers
    take their activations on CPU, "int8" (quantised per row and 32-wide block, integer kernels)
    or "fp32" (exact products with the dequantised weights); unset (None): each method's TGI
    numerics (layers/quantization/registry.py)."""
    value = (get("PYTGI_QUANT_ACTIVATIONS") or "").strip().lower()
    return value or None


def quant_isa() -> str:
    """PYTGI_QUANT_ISA: which compiled quantized-kernel table the layers run: auto (default, the
    best this CPU has), avx512_vnni, avx2 or scalar; a table the CPU lacks fails at startup."""
    return (get("PYTGI_QUANT_ISA") or "auto").strip().lower()


def quantize_lm_head() -> bool:
    """PYTGI_QUANTIZE_LM_HEAD=1 quantizes the LM head (and serves a tied embedding from it) with
    the `--quantize` method too; by default it stays in full precision, as in TGI."""
    return get_bool("PYTGI_QUANTIZE_LM_HEAD")
