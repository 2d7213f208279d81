"""Parsed flags → frozen configs, with TGI's derived defaults and start-up error texts
(TGI_COMPATIBILITY.md §2).
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import replace
from pathlib import Path

from pytgi import envs
from pytgi.cli.flags import CHECKPOINT_QUANTIZE, SERVED_QUANTIZE, check_refused_flags
from pytgi.config import (
    CacheConfig,
    CacheInfo,
    DeviceConfig,
    EngineConfig,
    GrammarConfig,
    LimitsConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    ServerConfig,
    WatermarkConfig,
    default_max_batch_prefill_tokens,
    parse_lora_adapters,
)
from pytgi.errors import ConfigError
from pytgi.layers.quantization.activations import CUDA_QUANTIZE, activations_for
from pytgi.router.images.config import ImageConfig

logger = logging.getLogger(__name__)


def model_config(args: argparse.Namespace) -> ModelConfig:
    model_id = args.model_id
    if model_id is None:
        from pytgi.demo_model import demo_model_path

        model_id = demo_model_path()
    return ModelConfig(
        model_id=model_id,
        revision=args.revision,
        dtype=args.dtype,
        quantize=getattr(args, "quantize", None),
        trust_remote_code=args.trust_remote_code,
        allow_pickle_weights=args.allow_pickle_weights,
        hub_cache_dir=args.huggingface_hub_cache or envs.hub_cache_dir(),
        hf_token=envs.hf_token(),
        hub_offline=envs.hub_offline(),
        tokenizer_config_path=args.tokenizer_config_path,
        max_model_len=getattr(args, "max_total_tokens", None),
        implementation=args.model_implementation,
        gguf_file=getattr(args, "model_gguf", None),
        rope_scaling=rope_override(
            getattr(args, "rope_scaling", None), getattr(args, "rope_factor", None)
        ),
        weights_dir=getattr(args, "weights_cache_override", None),
        lora_adapters=parse_lora_adapters(getattr(args, "lora_adapters", None)),
        quantize_activations=getattr(args, "quantize_activations", None)
        or envs.quant_activations(),
        cache_dir=envs.cache_dir(),
        quantize_lm_head=envs.quantize_lm_head(),
    )


def rope_override(kind: str | None, factor: float | None) -> tuple[str, float] | None:
    """TGI's launcher: a type alone scales by 1.0, a factor alone is linear scaling."""
    if kind is None and factor is None:
        return None
    return (kind or "linear", 1.0 if factor is None else factor)


def check_quantize(
    quantize: str | None, dtype: str | None, platform: str = "cpu", activations: str | None = None
) -> None:
    """`--quantize` values pytgi does not run, on CPU a `--dtype` other than the kernels' float32,
    and on CUDA the methods it has no kernels for (LLM.int8, int8 activations) are refused before
    anything loads (the engine checks again when it builds the model)."""
    if quantize is None:
        return
    if quantize not in SERVED_QUANTIZE + CHECKPOINT_QUANTIZE:
        raise ConfigError(
            f"--quantize {quantize} is not supported on CPU by pytgi "
            f"(supported: {', '.join(SERVED_QUANTIZE + CHECKPOINT_QUANTIZE)})"
        )
    if platform != "cpu":
        if quantize not in CUDA_QUANTIZE:
            raise ConfigError(
                f"--quantize {quantize} runs on pytgi's CPU kernels only, and the engine would "
                f"run on {platform} (PYTGI_DEVICE=cpu serves it; {platform} serves "
                f"{', '.join(CUDA_QUANTIZE)})"
            )
        if activations not in (None, "fp32"):
            raise ConfigError(f"--quantize-activations {activations} is CPU only")
        return
    if dtype not in (None, "float32"):
        raise ConfigError(
            f"--quantize {quantize} runs its kernels on float32 activations on CPU: "
            f"use --dtype float32 (got {dtype})"
        )
    activations_for(quantize, activations)


def check_kv_cache_dtype(kv_cache_dtype: str | None, platform: str) -> None:
    """An fp8 or int8 cache on CUDA is refused before anything loads: pytgi's Triton attention
    reads 16- and 32-bit caches only (the CPU backend runs every --kv-cache-dtype value)."""
    narrow = kv_cache_dtype is not None and kv_cache_dtype.startswith(("fp8", "int8"))
    if narrow and platform != "cpu":
        raise ConfigError(
            f"--kv-cache-dtype {kv_cache_dtype} is not supported on {platform} by pytgi (its "
            "attention kernels there read bfloat16/float16/float32 caches; PYTGI_DEVICE=cpu "
            "serves fp8 and int8 caches)"
        )


def num_shard(args: argparse.Namespace) -> int:
    """TGI's (sharded, num_shard) resolution; on CPU the visible device count is 1."""
    sharded, n = args.sharded, args.num_shard
    if sharded is True and n is None:
        raise ConfigError("`sharded` is true but only found 1 devices")
    if sharded is True and n <= 1:
        raise ConfigError("`sharded` is true but `num_shard` <= 1")
    if sharded is False and n is not None and n > 1:
        raise ConfigError("`sharded` is false but `num_shard` > 1")
    n = n if n is not None else 1
    if n < 1:
        raise ConfigError("`num_shard` cannot be < 1")
    return n


def engine_config(args: argparse.Namespace, model: ModelConfig) -> EngineConfig:
    check_refused_flags(args)
    apply_llama_cpp_aliases(args)
    check_limits(args)
    check_quantize(
        args.quantize, args.dtype, expected_platform(device_config(args)),
        model.quantize_activations,
    )  # fmt: skip
    check_kv_cache_dtype(args.kv_cache_dtype, expected_platform(device_config(args)))
    return EngineConfig(
        model=model,
        cache=CacheConfig(
            block_size=args.block_size,
            num_blocks=args.num_blocks,
            memory_fraction=args.kv_cache_memory_fraction,
            max_kv_cache_bytes=args.max_kv_cache_bytes,
            enable_prefix_caching=not args.disable_prefix_caching,
            kv_cache_dtype=args.kv_cache_dtype,
        ),
        scheduler=SchedulerConfig(
            max_batch_prefill_tokens=args.max_batch_prefill_tokens or default_prefill_tokens(args),
            max_batch_total_tokens=args.max_batch_total_tokens,
            max_batch_size=args.max_batch_size,
            enable_chunked_prefill=not args.disable_prefill_chunking,
            num_speculative_tokens=args.speculate or 0,
            model_drafts=model.speculator is not None,
            speculation_policy=args.speculation_policy or "adaptive",
        ),
        grammar=None if args.disable_grammar_support else grammar_config(args),
        parallel=ParallelConfig(
            num_shard=num_shard(args),
            master_addr=args.master_addr,
            master_port=args.master_port,
            **envs.parallel_fields(),
        ),
        device=device_config(args),
        num_threads=args.num_threads,
        watermark=WatermarkConfig(gamma=args.watermark_gamma, delta=args.watermark_delta),
    )


def apply_llama_cpp_aliases(args: argparse.Namespace) -> None:
    """TGI's llama.cpp backend spellings of pytgi flags (`flags.LLAMA_CPP_FLAGS`)."""
    aliases = (
        ("n_threads", "num_threads"),
        ("max_physical_batch_total_tokens", "max_batch_prefill_tokens"),
    )
    for alias, name in aliases:
        value, current = getattr(args, alias, None), getattr(args, name)
        if value is None:
            continue
        if current is not None and current != value:
            flag, other = "--" + alias.replace("_", "-"), "--" + name.replace("_", "-")
            raise ConfigError(f"{flag} {value} and {other} {current} disagree: set one")
        setattr(args, name, value)


def grammar_config(args: argparse.Namespace) -> GrammarConfig:
    """The grammar limits (the router's check before admission and the engine's compiles)."""
    return GrammarConfig(
        compile_timeout_s=args.grammar_compile_timeout,
        max_grammar_bytes=args.max_grammar_bytes,
        max_grammar_size=args.max_grammar_size,
        max_lexer_states=args.max_grammar_lexer_states,
        initial_lexer_fuel=args.grammar_compile_fuel,
        step_lexer_fuel=args.grammar_mask_fuel,
        compile_threads=args.grammar_compile_threads,
        mask_threads=args.grammar_mask_threads,
        cache_size=args.grammar_cache_size,
        cache_bytes=args.grammar_cache_bytes,
    )


NVIDIA_CONTROL_DEVICE = "/dev/nvidiactl"  # present wherever the NVIDIA driver exposes a GPU


def default_prefill_tokens(args: argparse.Namespace) -> int:
    chunked = not args.disable_prefill_chunking
    platform = expected_platform(device_config(args))
    return default_max_batch_prefill_tokens(platform, chunked_prefill=chunked)


def expected_platform(config: DeviceConfig) -> str:
    """The platform the engine will choose (backends/selector.py), guessed here without importing
    torch (the API process stays torch-free): on `auto`, CUDA when an NVIDIA device is visible."""
    if config.device != "auto":
        return config.device
    visible = envs.cuda_visible_devices()
    hidden = visible is not None and visible.strip() in ("", "-1")
    return "cuda" if Path(NVIDIA_CONTROL_DEVICE).exists() and not hidden else "cpu"


def visible_gpu_count() -> int:
    """GPUs the engine would see, without importing torch: CUDA_VISIBLE_DEVICES when set, else
    the driver's /dev/nvidiaN device files."""
    visible = envs.cuda_visible_devices()
    if visible is not None:
        return len([v for v in visible.split(",") if v.strip() and v.strip() != "-1"])
    return len([p for p in Path("/dev").glob("nvidia*") if p.name[len("nvidia") :].isdigit()])


def check_visible_gpus(num_shard: int, platform: str, count: int | None = None) -> None:
    """On CUDA each shard needs its own GPU: fewer visible than `--num-shard` is refused before
    any rank starts (else a rank fails with a raw "invalid device ordinal")."""
    if platform != "cuda" or num_shard <= 1:
        return
    count = visible_gpu_count() if count is None else count
    if count < num_shard:
        raise ConfigError(
            f"--num-shard {num_shard} needs {num_shard} GPUs (one per shard), but {count} "
            f"{'is' if count == 1 else 'are'} visible"
        )


def device_config(args: argparse.Namespace) -> DeviceConfig:
    """The environment's device config with the --cuda-* flags applied (TGI: `--cuda-graphs`
    unset = 1,2,4,8,16,32; `0` = no graphs)."""
    config = envs.device_config()
    if args.cuda_graphs is not None:
        config = replace(config, cuda_graphs=envs.parse_cuda_graphs(args.cuda_graphs))
    if args.cuda_memory_fraction is not None:
        config = replace(config, cuda_memory_fraction=args.cuda_memory_fraction)
    if getattr(args, "disable_custom_kernels", False):  # TGI's flag: pytgi's own kernels off
        config = replace(config, kernels=False)
    return config


def check_limits(args: argparse.Namespace) -> None:
    """TGI's argument checks that need no model (texts as in TGI's launcher)."""
    if args.max_input_tokens is not None and args.max_input_length is not None:
        raise ConfigError(
            f"Both `max_input_tokens` ({args.max_input_tokens}) and `max_input_length` "
            f"({args.max_input_length}) are set. Please define only `max_input_tokens` as "
            "`max_input_length is deprecated for naming consistency."
        )
    max_input = input_tokens(args)
    if max_input is not None and args.max_total_tokens is not None:
        if max_input >= args.max_total_tokens:
            raise ConfigError(
                f"`max_input_tokens`({max_input}) must be < "
                f"`max_total_tokens`({args.max_total_tokens})"
            )
    if args.max_total_tokens is not None and args.max_batch_total_tokens is not None:
        if args.max_total_tokens > args.max_batch_total_tokens:
            raise ConfigError(
                "`max_total_tokens` must be <= `max_batch_total_tokens`. Given: "
                f"{args.max_total_tokens} and {args.max_batch_total_tokens}"
            )
    if args.validation_workers <= 0:
        raise ConfigError("`validation_workers` must be > 0")
    if args.max_batch_size == 0:
        raise ConfigError("`max_batch_size` must be > 0")


def input_tokens(args: argparse.Namespace) -> int | None:
    return args.max_input_tokens if args.max_input_tokens is not None else args.max_input_length


def limits_config(
    args: argparse.Namespace, cache: CacheInfo, model_max_length: int | None
) -> LimitsConfig:
    """Request limits once warm-up has sized the KV cache (as TGI's shard decides unset ones)."""
    max_total = args.max_total_tokens
    if max_total is None:
        max_total = min(v for v in (cache.max_total_tokens, model_max_length) if v is not None)
    elif max_total > cache.max_batch_total_tokens:
        raise ConfigError(f"Not enough memory to handle `max_total_tokens={max_total}`")
    max_input = input_tokens(args)
    if max_input is None:
        max_input = max_total - 1
        logger.info("Maximum input tokens defaulted to %d", max_input)
    if max_input >= max_total:
        raise ConfigError("`max_input_tokens` must be < `max_total_tokens`")
    return LimitsConfig(
        max_concurrent_requests=args.max_concurrent_requests,
        max_best_of=args.max_best_of,
        max_stop_sequences=args.max_stop_sequences,
        max_top_n_tokens=args.max_top_n_tokens,
        max_input_tokens=max_input,
        max_total_tokens=max_total,
        max_client_batch_size=args.max_client_batch_size,
        payload_limit=args.payload_limit,
        validation_workers=args.validation_workers,
    )


def image_config(args: argparse.Namespace) -> ImageConfig:
    return ImageConfig(
        max_fetch_bytes=args.max_image_fetch_size,
        fetch_timeout_s=args.image_fetch_timeout,
        max_pixels=args.max_image_pixels,
        allow_private_urls=args.allow_private_image_urls,
    )


def server_config(
    args: argparse.Namespace, limits: LimitsConfig, model_id: str, model_sha: str | None
) -> ServerConfig:
    return ServerConfig(
        hostname=hostname(args.hostname),
        port=args.port,
        api_key=args.api_key,
        cors_allow_origin=tuple(args.cors_allow_origin or ()),
        json_output=args.json_output,
        graceful_termination_timeout_s=args.graceful_termination_timeout,
        enable_prefill_logprobs=args.enable_prefill_logprobs,
        disable_grammar_support=args.disable_grammar_support,
        playground=not args.disable_playground,
        limits=limits,
        model_id=model_id,
        model_sha=model_sha,
        prometheus_port=args.prometheus_port,
        request_header_timeout_s=args.request_header_timeout,
        request_body_timeout_s=args.request_body_timeout,
        max_connections=args.max_connections,
    )


def hostname(value: str) -> str:
    """TGI: an unparsable HOSTNAME (Docker sets it to the container id) falls back to 0.0.0.0."""
    import ipaddress

    if value == "localhost":
        return value
    try:
        ipaddress.ip_address(value)
    except ValueError:
        logger.warning("Invalid hostname %s, defaulting to 0.0.0.0", value)
        return "0.0.0.0"
    return value
