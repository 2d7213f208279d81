"""Frozen configuration dataclasses, one per concern, aggregated into `EngineConfig` and
`ServerConfig`.

They are built once by the CLI (from flags and, through `envs`, TGI's environment variables) and
passed explicitly, including to child processes (pickled). Values discovered at run time (the number
of KV blocks, the resulting max_total_tokens) are returned as `CacheInfo`; they never mutate a
config.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pytgi.errors import ConfigError

DTYPES = ("float32", "bfloat16", "float16")
QUANT_ACTIVATIONS = ("int8", "fp32")
MODEL_IMPLEMENTATIONS = ("auto", "transformers")
DEVICES = ("auto", "cpu", "cuda")
ROPE_SCALINGS = ("linear", "dynamic")  # TGI's --rope-scaling values
# --kv-cache-dtype: TGI's two fp8 formats, and pytgi's 16-bit ones and int8 with per-token,
# per-head scales (docs/KV_CACHE.md)
KV_CACHE_DTYPES = ("fp8_e4m3fn", "fp8_e5m2", "bfloat16", "float16", "int8")
# TGI's default `--cuda-graphs`: decode batch sizes captured at warm-up
DEFAULT_CUDA_GRAPHS = (1, 2, 4, 8, 16, 32)


# TGI's step token budget, which pytgi keeps off the CPU. On a CPU a step's time grows with its
# tokens, so with TGI's budget a burst of prompts waits for one huge prefill step before any
# first token; a smaller one lets the prompts start in turn between decode steps (measured in
# docs/PERFORMANCE.md, "CPU serving defaults").
TGI_MAX_BATCH_PREFILL_TOKENS = 4096
CPU_MAX_BATCH_PREFILL_TOKENS = 1024


def default_max_batch_prefill_tokens(device: str, *, chunked_prefill: bool = True) -> int:
    """The budget when `--max-batch-prefill-tokens` is not given. Without chunked prefill a
    prompt must fit in one step, so TGI's (larger) budget stays."""
    if device == "cpu" and chunked_prefill:
        return CPU_MAX_BATCH_PREFILL_TOKENS
    return TGI_MAX_BATCH_PREFILL_TOKENS


@dataclass(frozen=True)
class LoRAAdapter:
    """One `--lora-adapters` entry: `id`, `id@revision` (a hub repo) or `id=path` (a directory).
    `source` is the hub repo id or the directory; requests name the adapter by `id`."""

    id: str
    source: str
    revision: str | None = None


def parse_lora_adapters(text: str | None) -> tuple[LoRAAdapter, ...]:
    """TGI's `--lora-adapters` syntax: comma-separated `id`, `id@revision` or `id=path`."""
    adapters: list[LoRAAdapter] = []
    for item in (part.strip() for part in (text or "").split(",")):
        if not item:
            continue
        if "=" in item:
            adapter_id, path = (s.strip() for s in item.split("=", 1))
            adapter = LoRAAdapter(adapter_id, path)
        elif "@" in item:
            repo, revision = item.split("@", 1)
            adapter = LoRAAdapter(repo, repo, revision or None)
        else:
            adapter = LoRAAdapter(item, item)
        if not adapter.id or not adapter.source:
            raise ConfigError(f"--lora-adapters: cannot read the entry '{item}'")
        if any(a.id == adapter.id for a in adapters):
            raise ConfigError(f"--lora-adapters: the adapter id '{adapter.id}' is given twice")
        adapters.append(adapter)
    return tuple(adapters)


@dataclass(frozen=True)
class SpeculatorConfig:
    """A trained speculator found at `--model-id` (TGI detects it from its config.json): Medusa
    heads (`medusa_num_heads`) or IBM's MLP speculator (`model_type: mlp_speculator`); the model
    served is the checkpoint's `base_model_name_or_path`."""

    kind: str  # "medusa" or "mlp_speculator"
    path: str  # the local directory holding the speculator's config.json and weights
    num_heads: int  # draft tokens it can propose per step (medusa_num_heads, n_predict)


@dataclass(frozen=True)
class ModelConfig:
    model_id: str
    revision: str | None = None
    dtype: str | None = None  # None = the platform's default for the model (fp32 on CPU)
    quantize: str | None = None
    trust_remote_code: bool = False
    # .bin checkpoints only with this opt-in (converted, weights_only)
    allow_pickle_weights: bool = False
    hub_cache_dir: str | None = None
    hf_token: str | None = None
    hub_offline: bool = False
    tokenizer_id: str | None = None  # defaults to the model directory
    tokenizer_config_path: str | None = None
    seed: int = 0  # random-weight init, warm-up inputs
    # the longest sequence served (--max-total-tokens); None: the model's max_position_embeddings
    max_model_len: int | None = None
    # "auto": the native implementation when pytgi has one, else the transformers fallback;
    # "transformers": the fallback even for a natively implemented architecture
    implementation: str = "auto"
    # --model-gguf: the GGUF file inside the --model-id directory or hub repo (needed only when
    # it holds several); None: --model-id's only GGUF file, if it is a GGUF model at all
    gguf_file: str | None = None
    # where pytgi keeps files it derives from models (a GGUF file's config and tokenizer):
    # PYTGI_CACHE_DIR; None: nowhere (a GGUF model then cannot be prepared)
    cache_dir: str | None = None
    # --rope-scaling/--rope-factor: (type, factor) replacing config.json's rope_scaling (TGI's
    # override); None keeps the checkpoint's
    rope_scaling: tuple[str, float] | None = None
    # --weights-cache-override: the directory the weight files are read from (config and
    # tokenizer still come from the model); None: the model's own directory
    weights_dir: str | None = None
    # --lora-adapters, in order (the engine gives the k-th adapter slot k + 1; 0 is the base)
    lora_adapters: tuple[LoRAAdapter, ...] = ()
    speculator: SpeculatorConfig | None = None  # trained draft heads (Medusa, MLP speculator)
    # --quantize-activations (twin: PYTGI_QUANT_ACTIVATIONS): "int8" or "fp32" activations for
    # the quantized kernels; None: each method's TGI numerics (layers/quantization/registry.py)
    quantize_activations: str | None = None
    # PYTGI_QUANTIZE_LM_HEAD: the `--quantize` method quantizes the LM head too (TGI: it does not)
    quantize_lm_head: bool = False

    def __post_init__(self):
        if self.rope_scaling is not None:
            kind, factor = self.rope_scaling
            if kind not in ROPE_SCALINGS:
                raise ConfigError(f"--rope-scaling must be one of {', '.join(ROPE_SCALINGS)}")
            if not factor > 0:
                raise ConfigError(f"--rope-factor must be > 0, got {factor}")
        if self.quantize_activations not in (None, *QUANT_ACTIVATIONS):
            raise ConfigError(
                f"--quantize-activations must be one of {', '.join(QUANT_ACTIVATIONS)}, "
                f"got '{self.quantize_activations}'"
            )
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got '{self.dtype}'")
        if self.implementation not in MODEL_IMPLEMENTATIONS:
            raise ConfigError(
                f"--model-implementation must be one of {', '.join(MODEL_IMPLEMENTATIONS)}, "
                f"got '{self.implementation}'"
            )


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    num_blocks: int | None = None  # None: derived from free memory at warm-up
    memory_fraction: float = 0.9  # of the memory left after loading weights and a warm-up step
    # hard cap on KV memory (CPU: RAM is shared with everything)
    max_kv_cache_bytes: int | None = None
    enable_prefix_caching: bool = True
    # --kv-cache-dtype: None = the model dtype (or fp8_e4m3fn for a checkpoint whose
    # compressed-tensors config declares an 8-bit float KV cache)
    kv_cache_dtype: str | None = None

    def __post_init__(self):
        if self.kv_cache_dtype is not None and self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(
                f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                f"got '{self.kv_cache_dtype}'"
            )
        if self.block_size <= 0:
            raise ConfigError("block_size must be > 0")
        if not 0.0 < self.memory_fraction <= 1.0:
            raise ConfigError("memory_fraction must be in (0, 1]")


# --speculation-policy: when drafts are verified (engine/speculation_policy.py)
SPECULATION_POLICIES = ("adaptive", "always")


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch_prefill_tokens: int = 4096  # token budget of one step (prefill chunks + decodes)
    max_batch_total_tokens: int | None = None  # KV budget in tokens; None = from memory
    max_batch_size: int | None = None  # max running requests; None = unbounded (KV-limited)
    enable_chunked_prefill: bool = True
    num_speculative_tokens: int = 0  # --speculate: draft tokens verified per decode step
    # drafts come from the workers' trained speculator (ModelOutput.draft_ids), not n-gram lookup
    model_drafts: bool = False
    # --speculation-policy: "adaptive" drafts when the measured acceptance and step costs say it
    # pays (engine/speculation_policy.py); "always" verifies drafts in every step, as TGI
    speculation_policy: str = "adaptive"

    def __post_init__(self):
        if self.num_speculative_tokens < 0:
            raise ConfigError("`speculate` must be >= 0")
        if self.speculation_policy not in SPECULATION_POLICIES:
            raise ConfigError(
                f"--speculation-policy must be adaptive or always, got '{self.speculation_policy}'"
            )
        if self.max_batch_size is not None and self.max_batch_size <= 0:
            raise ConfigError("`max_batch_size` must be > 0")
        if self.max_batch_prefill_tokens <= 0:
            raise ConfigError("`max_batch_prefill_tokens` must be > 0")


@dataclass(frozen=True)
class ParallelConfig:
    num_shard: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    # PYTGI_TP_COLLECTIVE_TIMEOUT_S: how long a rank waits in one collective of a step
    collective_timeout_s: float = 60.0
    # tests only (PYTGI_TEST_RANK_FAULT): (rank, stage) that fails at start-up, stage "load" or
    # "warmup"
    test_rank_fault: tuple[int, str] | None = None

    def __post_init__(self):
        if self.num_shard < 1:
            raise ConfigError("`num_shard` must be >= 1")


@dataclass(frozen=True)
class DeviceConfig:
    """What the platform may use, decided before the model is built (the CLI fills it from
    PYTGI_DEVICE, PYTGI_CPU_KERNELS, PYTGI_FUSED_DECODE, PYTGI_QUANT_ISA, PYTGI_NATIVE_KQUANTS,
    TORCH_EXTENSIONS_DIR and
    the --cuda-* flags): the device,
    compiled kernels for the layers, and the decode-step accelerator (the fused CPU decode stack;
    CUDA-graph replay on GPU, over the `cuda_graphs` batch sizes; empty = eager)."""

    kernels: bool = True
    decode_accelerator: bool = True
    device: str = "auto"  # auto: CUDA when torch sees a GPU, else CPU
    cuda_graphs: tuple[int, ...] = DEFAULT_CUDA_GRAPHS
    cuda_memory_fraction: float = 1.0  # of the GPU's total memory pytgi may use
    # PYTGI_QUANT_ISA: the compiled quantized-kernel table (auto: the best this CPU has)
    quant_isa: str = "auto"
    # PYTGI_NATIVE_KQUANTS=1: GGUF Q4_K / Q6_K on their own super-block kernels (off until their
    # speed is measured: they are widened into the int4 / int8 kernels otherwise)
    native_kquants: bool = False
    # TORCH_EXTENSIONS_DIR: root of the compiled CPU kernels' builds; None: torch's default
    kernel_build_root: str | None = None

    def __post_init__(self):
        if self.device not in DEVICES:
            choices = ", ".join(DEVICES)
            raise ConfigError(f"PYTGI_DEVICE must be one of {choices}, got '{self.device}'")
        if any(size <= 0 for size in self.cuda_graphs):
            raise ConfigError(f"`cuda_graphs` must be positive batch sizes, got {self.cuda_graphs}")
        if not 0.0 < self.cuda_memory_fraction <= 1.0:
            raise ConfigError("`cuda_memory_fraction` must be in (0, 1]")


@dataclass(frozen=True)
class WatermarkConfig:
    """TGI's watermark (requests with `watermark`): the green-list fraction `gamma` of the
    vocabulary gets `delta` added to its logits (--watermark-gamma, --watermark-delta)."""

    gamma: float = 0.5
    delta: float = 2.0

    def __post_init__(self):
        if not 0.0 < self.gamma <= 1.0:
            raise ConfigError(f"--watermark-gamma must be in (0, 1], got {self.gamma}")


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    # constrained decoding (grammar, response_format, tools); None: off (grammar requests fail)
    grammar: GrammarConfig | None = None
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    num_threads: int | None = None  # torch intra-op threads; None = torch's default
    watermark: WatermarkConfig = field(default_factory=WatermarkConfig)


@dataclass(frozen=True)
class CacheInfo:
    """What warm-up found: KV capacity and the request limits derived from it (for /info)."""

    num_blocks: int
    block_size: int
    max_total_tokens: int  # per request
    max_input_tokens: int
    max_batch_total_tokens: int  # KV capacity in tokens
    max_position_embeddings: int
    dtype: str
    device: str
    kv_cache_dtype: str = ""  # the caches' storage dtype
    kv_bytes_per_token: int = 0  # every layer's K and V for one token, on one rank
    # every attention layer has a sliding window: the largest (older blocks are freed); else None
    sliding_window: int | None = None
    # a model mixing windowed and full layers: (window, num_blocks) per KV group, the full group
    # first (`num_blocks` is its count); empty: one group of `num_blocks` with `sliding_window`
    kv_groups: tuple[tuple[int | None, int], ...] = ()
    # the model's bidirectional spans (messages/bidirectional.py: "prompt" for PaliGemma's
    # prefix-LM, "images" for Gemma 3), None: causal; the scheduler runs each span whole in one
    # step and takes no prefix hit that ends inside one
    bidirectional: str | None = None
    warmup_s: float = 0.0
    vocab_size: int = 0  # the model's logits width (token masks cover it)
    supports_grammar: bool = False  # the engine applies grammars (SamplingParams.grammar)
    lora_adapters: tuple[str, ...] = ()  # the ids of the LoRA adapters the engine loaded


@dataclass(frozen=True)
class LimitsConfig:
    """TGI's per-request limits (validated by the router)."""

    max_concurrent_requests: int = 128
    max_best_of: int = 2
    max_stop_sequences: int = 4
    max_top_n_tokens: int = 5
    max_input_tokens: int | None = None  # None = derived at warm-up
    max_total_tokens: int | None = None  # None = derived at warm-up
    max_client_batch_size: int = 4
    payload_limit: int = 2_000_000
    validation_workers: int = 2  # threads tokenizing requests

    def __post_init__(self):
        if self.validation_workers < 1:
            raise ConfigError("`validation_workers` must be > 0")
        mi, mt = self.max_input_tokens, self.max_total_tokens
        if mi is not None and mt is not None and mi >= mt:
            raise ConfigError(f"`max_input_tokens`({mi}) must be < `max_total_tokens`({mt})")


@dataclass(frozen=True)
class GrammarConfig:
    """Bounds on user grammars (`grammar`, `response_format`, tool calls); see pytgi.grammar.

    `compile_timeout_s` is how long a request may wait for its grammar (queueing included) before
    it fails with a validation error. The lexer/parser limits are llguidance's fuel counters: they
    bound the work of one compile and of one token mask, so no grammar can stall a step.
    """

    compile_timeout_s: float = 10.0
    max_grammar_bytes: int = 512 * 1024  # the schema or regex text
    max_grammar_size: int = 200_000  # grammar symbols after expansion
    max_lexer_states: int = 50_000  # ~1-2 kB each
    initial_lexer_fuel: int = 200_000  # building the regexes (~50k per ms)
    step_lexer_fuel: int = 100_000  # one token mask (~14k per ms)
    compile_threads: int = 1
    mask_threads: int = 1  # threads filling a batch's token masks
    cache_size: int = 256  # compiled grammars kept, by spec
    # and their estimated memory (grammar/compiler.py, `estimated_bytes`): the engine's host
    # memory for compiled grammars, taken from the KV cache's budget on CPU
    cache_bytes: int = 256 << 20

    def __post_init__(self):
        if not self.compile_timeout_s > 0:
            raise ConfigError("`grammar_compile_timeout` must be > 0")
        for name, value in vars(self).items():
            if name != "compile_timeout_s" and value < 1:
                raise ConfigError(f"grammar limit `{name}` must be >= 1, got {value}")


@dataclass(frozen=True)
class ServerConfig:
    hostname: str = "0.0.0.0"
    port: int = 3000
    api_key: str | None = None
    cors_allow_origin: tuple[str, ...] = ()
    json_output: bool = False
    graceful_termination_timeout_s: float = 90.0
    enable_prefill_logprobs: bool = False
    disable_grammar_support: bool = False
    playground: bool = True  # the /playground page (pytgi only)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    model_id: str = ""
    model_sha: str | None = None
    prometheus_port: int | None = None
    request_header_timeout_s: float = 10.0  # slow clients: headers, then body, must arrive
    request_body_timeout_s: float = 60.0
    max_connections: int = 1024

    def __post_init__(self):
        if self.request_header_timeout_s <= 0 or self.request_body_timeout_s <= 0:
            raise ConfigError("request header and body timeouts must be > 0")
        if self.max_connections < 1:
            raise ConfigError("`max_connections` must be >= 1")
