"""Building an engine: its configuration from keyword options, and the `EngineCore` with the
executor that runs its steps (one rank in this process, or tensor-parallel ranks)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from pytgi import envs
from pytgi.config import (
    CacheConfig,
    EngineConfig,
    GrammarConfig,
    LoRAAdapter,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    default_max_batch_prefill_tokens,
    parse_lora_adapters,
)
from pytgi.engine.engine_core import EngineCore


def build_engine_core(
    config: EngineConfig, on_rank_death: Callable[[str], None] | None = None
) -> EngineCore:
    """Load the model on every rank, warm up, size the KV cache and return the engine.

    `on_rank_death(message)`: called once, from another thread, if a tensor-parallel rank dies (at
    start-up too), so the caller can report it before the next step fails."""
    from pytgi.models.resolve import resolve_model
    from pytgi.worker.executor import create_executor  # torch: not in the API process

    # a GGUF file (the offline API takes its path) has its tokenizer in its prepared directory
    model_dir = partial(resolve_model, config.model)
    return EngineCore.start(config, create_executor(config, on_rank_death), model_dir)


def engine_config(
    model_id: str | None = None,
    *,
    dtype: str | None = None,
    revision: str | None = None,
    block_size: int = 16,
    num_blocks: int | None = None,
    enable_prefix_caching: bool = True,
    max_batch_prefill_tokens: int | None = None,
    max_batch_total_tokens: int | None = None,
    max_batch_size: int | None = None,
    num_shard: int = 1,
    num_threads: int | None = None,
    speculate: int = 0,
    speculation_policy: str = "adaptive",
    grammar: GrammarConfig | bool = True,
    implementation: str = "auto",
    trust_remote_code: bool = False,
    allow_pickle_weights: bool = False,
    quantize: str | None = None,
    gguf_file: str | None = None,
    quantize_activations: str | None = None,
    kv_cache_dtype: str | None = None,
    lora_adapters: str | tuple[LoRAAdapter, ...] = (),
) -> EngineConfig:
    """An EngineConfig from keyword options (the offline API's defaults match `pytgi serve`).

    `grammar`: constrained decoding (`SamplingParams.grammar`) with these limits, or the defaults
    (True), or off (False: no vocabulary is built; grammar requests fail).
    `max_batch_prefill_tokens`: None = `pytgi serve`'s default for the device (smaller on CPU).
    `lora_adapters`: `--lora-adapters`' syntax (`id=path,...`) or `LoRAAdapter`s; a request picks
    one with `EngineRequest.adapter_id` (`LLM.generate(..., adapter_ids=...)`).
    A Medusa / MLP-speculator checkpoint serves its base model with its heads drafting (`speculate`
    0: as many drafts as heads); `speculation_policy` as `--speculation-policy` (adaptive or
    always)."""
    from pytgi.models.resolve import resolve_speculator

    if model_id is None:
        from pytgi.demo_model import demo_model_path

        model_id = demo_model_path()
    if isinstance(lora_adapters, str):
        lora_adapters = parse_lora_adapters(lora_adapters)
    model = ModelConfig(
        model_id=model_id,
        revision=revision,
        dtype=dtype,
        implementation=implementation,
        trust_remote_code=trust_remote_code,
        allow_pickle_weights=allow_pickle_weights,
        quantize=quantize,
        gguf_file=gguf_file,
        lora_adapters=tuple(lora_adapters),
        **{
            **envs.model_fields(),
            "quantize_activations": quantize_activations or envs.quant_activations(),
        },
    )
    model, speculate = resolve_speculator(model, speculate or None)
    device = envs.device_config()
    if max_batch_prefill_tokens is None:
        max_batch_prefill_tokens = default_max_batch_prefill_tokens(_platform(device.device))
    return EngineConfig(
        model=model,
        cache=CacheConfig(
            block_size=block_size,
            num_blocks=num_blocks,
            enable_prefix_caching=enable_prefix_caching,
            kv_cache_dtype=kv_cache_dtype,
        ),
        scheduler=SchedulerConfig(
            max_batch_prefill_tokens=max_batch_prefill_tokens,
            max_batch_total_tokens=max_batch_total_tokens,
            max_batch_size=max_batch_size,
            num_speculative_tokens=speculate or 0,
            model_drafts=model.speculator is not None,
            speculation_policy=speculation_policy,
        ),
        grammar=GrammarConfig() if grammar is True else grammar or None,
        parallel=ParallelConfig(num_shard=num_shard, **envs.parallel_fields()),
        device=device,
        num_threads=num_threads,
    )


def _platform(device: str) -> str:
    """The platform the engine will pick (backends/selector.py)."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
