"""Every launcher flag, declared once as data: TGI's spelling, help text, env twin (upper-snake of
the name).

`add_flags(parser, FLAGS)` turns them into argparse options whose default is the env value when set.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from pytgi import envs
from pytgi.config import (
    KV_CACHE_DTYPES,
    MODEL_IMPLEMENTATIONS,
    ROPE_SCALINGS,
    SPECULATION_POLICIES,
    GrammarConfig,
)
from pytgi.router.images.config import ImageConfig


@dataclass(frozen=True)
class Flag:
    name: str
    help: str
    type: Callable = str
    default: object = None
    switch: bool = False  # a boolean flag without a value (env: true/false)
    repeat: bool = False  # may be given several times (a list)
    short: str | None = None
    choices: tuple[str, ...] | None = None
    env_twin: bool = True  # read from the environment too (TGI: every flag but --env)

    @property
    def env(self) -> str | None:
        return self.name.lstrip("-").replace("-", "_").upper() if self.env_twin else None

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")


def _bool(value: str) -> bool:
    if value.lower() in ("true", "1", "yes", "on"):
        return True
    if value.lower() in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError("expected true or false")


def _size_list(value: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError("expected comma-separated batch sizes") from None


QUANTIZE = (
    "awq", "compressed-tensors", "eetq", "exl2", "gptq", "marlin",
    "bitsandbytes", "bitsandbytes-nf4", "bitsandbytes-fp4", "fp8",
)  # fmt: skip
# the QUANTIZE values pytgi runs (on-the-fly quantisation of a full-precision checkpoint on the
# CPU kernels; layers/quantization/registry.py); the others are refused at start-up
SERVED_QUANTIZE = ("eetq", "bitsandbytes", "bitsandbytes-nf4", "bitsandbytes-fp4", "fp8")
# the QUANTIZE values naming a checkpoint's own format (layers/quantization/detect.py): accepted
# when the checkpoint is stored in it
CHECKPOINT_QUANTIZE = ("gptq", "awq", "compressed-tensors", "marlin")


def _quantize_help() -> str:
    return (
        f"Quantize a full-precision checkpoint's weights at load time (TGI's values; pytgi runs "
        f"{', '.join(SERVED_QUANTIZE)} on CPU, and refuses the others). A checkpoint stored "
        f"quantized ({', '.join(CHECKPOINT_QUANTIZE)}, fp8) is detected from its config; "
        "--quantize must then name its method. GGUF models are served in their own quantized "
        "types"
    )


QUANTIZE_FLAG = Flag("--quantize", _quantize_help(), choices=QUANTIZE)
QUANTIZE_ACTIVATIONS_FLAG = Flag(
    "--quantize-activations",
    "pytgi extension: the activations of the quantized kernels (also PYTGI_QUANT_ACTIVATIONS). "
    "Default: each method as TGI computes it (eetq, bitsandbytes-nf4/fp4, fp8: full-precision "
    "activations; bitsandbytes LLM.int8: int8 with outlier features; GGUF: int8 blocks, as "
    "llama.cpp). int8: quantize activations per row and 32-wide block (faster, less exact; not "
    "for nf4/fp4/fp8); fp32: exact products with the dequantized weights",
    choices=("int8", "fp32"),
)


MODEL_FLAGS = [
    Flag(
        "--model-id",
        "Hub model id, local directory, or GGUF file (default: the bundled demo model)",
    ),
    Flag(
        "--model-gguf",
        "The GGUF file to serve, as TGI: its path (the tokenizer and chat template then come from "
        "--model-id); or a file inside the --model-id directory or hub repo (when it holds "
        "several)",
    ),
    Flag("--revision", "Hub revision: a branch, tag, commit sha or refs/pr/N"),
    Flag(
        "--dtype",
        "Compute dtype; default float32 on CPU (bf16/fp16 matmul is ~40x slower there), "
        "float16 on CUDA (bfloat16 for the families TGI runs in bf16)",
        choices=("float32", "float16", "bfloat16"),
    ),  # fmt: skip
    Flag(
        "--trust-remote-code", "Allow custom model code from the hub (off by default)", switch=True
    ),
    Flag(
        "--allow-pickle-weights",
        "Accept pickle .bin checkpoints (loaded with weights_only=True, converted to safetensors)",
        switch=True,
    ),  # fmt: skip
    Flag(
        "--model-implementation",
        "auto: pytgi's native model code when it has the architecture, else transformers' code "
        "on pytgi's paged KV cache; transformers: the latter for every architecture",
        default="auto",
        choices=MODEL_IMPLEMENTATIONS,
    ),  # fmt: skip
    Flag("--huggingface-hub-cache", "Hub cache directory"),
    Flag("--tokenizer-config-path", "Alternate tokenizer_config.json (chat template source)"),
]

ENGINE_FLAGS = [
    Flag(
        "--max-batch-prefill-tokens",
        "Token budget of one step (prompt chunks + decodes) [default: 1024 on CPU with chunked "
        "prefill (measured, docs/PERFORMANCE.md), else TGI's 4096]",
        int,
    ),  # fmt: skip
    Flag(
        "--max-batch-total-tokens", "KV cache capacity in tokens (default: from free memory)", int
    ),
    Flag("--max-batch-size", "Maximum number of running requests", int),
    Flag("--num-blocks", "KV blocks to allocate (overrides memory profiling)", int),
    Flag("--block-size", "Tokens per KV block", int, 16),
    Flag("--kv-cache-memory-fraction", "Fraction of free memory for the KV cache", float, 0.9),
    Flag("--max-kv-cache-bytes", "Hard cap on KV cache memory in bytes", int),
    Flag("--disable-prefix-caching", "Turn off automatic prefix caching", switch=True),
    Flag("--disable-prefill-chunking", "Prefill each prompt in one step", switch=True),
    Flag("--num-threads", "torch intra-op threads (default: torch's choice)", int),
    Flag("--num-shard", "Number of tensor-parallel shards", int),
    Flag("--sharded", "Shard the model (true/false)", _bool),
    Flag("--master-addr", "torch.distributed master address", default="127.0.0.1"),
    Flag("--master-port", "torch.distributed master port", int, 29500),
    QUANTIZE_FLAG,
    QUANTIZE_ACTIVATIONS_FLAG,
    Flag(
        "--kv-cache-dtype",
        "KV cache storage dtype (default: the model dtype). TGI's fp8_e4m3fn (per-layer k/v "
        "scales from the checkpoint, else 1.0) and fp8_e5m2, and pytgi's bfloat16, float16 and "
        "int8 (CPU: per-token, per-head scales)",
        choices=KV_CACHE_DTYPES,
    ),  # fmt: skip
    Flag(
        "--cuda-graphs",
        "Decode batch sizes captured as CUDA graphs at warm-up (default 1,2,4,8,16,32; 0 = eager; "
        "CUDA only)",
        _size_list,
    ),  # fmt: skip
    Flag("--cuda-memory-fraction", "Fraction of GPU memory usable (default 1.0; CUDA only)", float),
    Flag(
        "--speculate",
        "Draft tokens verified per decode step, proposed by n-gram lookup in the request's own "
        "text (no draft model)",
        int,
    ),
    Flag(
        "--speculation-policy",
        "pytgi extension: adaptive (default) verifies drafts only in steps where the measured "
        "acceptance and step costs say they gain tokens per second; always verifies them in every "
        "step, as TGI",
        choices=SPECULATION_POLICIES,
    ),  # fmt: skip
    Flag(
        "--disable-custom-kernels",
        "Run the layers on plain torch ops instead of pytgi's compiled C++ (CPU) and Triton (CUDA) "
        "kernels (paged attention on CUDA stays on Triton)",
        switch=True,
    ),  # fmt: skip
    Flag(
        "--rope-scaling",
        "Replace the checkpoint's rope scaling with this type (alone: factor 1.0)",
        choices=ROPE_SCALINGS,
    ),  # fmt: skip
    Flag("--rope-factor", "Rope scaling factor (alone: linear scaling)", float),
]

_IMAGES = ImageConfig()
LIMIT_FLAGS = [
    Flag("--max-concurrent-requests", "Concurrent requests before 429", int, 128),
    Flag("--max-best-of", "Maximum best_of", int, 2),
    Flag("--max-stop-sequences", "Maximum stop sequences", int, 4),
    Flag("--max-top-n-tokens", "Maximum top_n_tokens", int, 5),
    Flag("--max-input-tokens", "Maximum prompt tokens (default: max_total_tokens - 1)", int),
    Flag("--max-input-length", "Legacy alias of --max-input-tokens", int),
    Flag("--max-total-tokens", "Maximum prompt + new tokens per request", int),
    Flag("--max-client-batch-size", "Maximum prompts in one /v1/completions call", int, 4),
    Flag("--payload-limit", "Maximum HTTP body in bytes", int, 2_000_000),
    Flag(
        "--max-image-fetch-size",
        "Largest image accepted, in bytes, fetched or in a data URI (TGI: 1 GiB, router only)",
        int,
        _IMAGES.max_fetch_bytes,
    ),  # fmt: skip
    Flag("--image-fetch-timeout", "Seconds one image fetch may take", float, 10.0),
    Flag(
        "--max-image-pixels",
        "Most pixels (width x height) a decoded image may have",
        int,
        _IMAGES.max_pixels,
    ),  # fmt: skip
    Flag(
        "--allow-private-image-urls",
        "Fetch image URLs that resolve to loopback, private or link-local addresses (pytgi only)",
        switch=True,
    ),  # fmt: skip
    Flag(
        "--validation-workers",
        "Threads tokenizing and validating requests (must be > 0)",
        int,
        2,
    ),  # fmt: skip
    Flag(
        "--waiting-served-ratio",
        "TGI's batching heuristic without chunked prefill; pytgi's scheduler admits waiting "
        "requests every step, so it is ignored with a warning when set (as TGI with chunking)",
        float,
    ),  # fmt: skip
    Flag(
        "--max-waiting-tokens",
        "TGI's batching heuristic without chunked prefill; ignored with a warning when set "
        "(pytgi admits waiting requests every step)",
        int,
    ),  # fmt: skip
]

SERVER_FLAGS = [
    Flag("--hostname", "Bind address", default="0.0.0.0"),
    Flag("--port", "HTTP port", int, 3000, short="-p"),
    Flag(
        "--prometheus-port",
        "Extra port serving the metrics on any path (also on the main port's /metrics); a busy "
        "port is a warning; 0: none",
        int,
        9000,
    ),  # fmt: skip
    Flag("--api-key", "Bearer key required on the generation routes"),
    Flag("--cors-allow-origin", "Allowed CORS origin (repeatable)", repeat=True),
    Flag("--json-output", "JSON log lines", switch=True),
    Flag(
        "--env",
        "Log the runtime environment and versions at start-up (no env twin, as in TGI)",
        switch=True,
        env_twin=False,
    ),  # fmt: skip
    Flag("--graceful-termination-timeout", "Seconds to drain on SIGTERM", float, 90.0, short="-g"),
    Flag(
        "--request-header-timeout",
        "Seconds a client has to send a request's headers before its connection is closed",
        float,
        10.0,
    ),  # fmt: skip
    Flag(
        "--request-body-timeout",
        "Seconds a client has to send a request's body (after its headers)",
        float,
        60.0,
    ),  # fmt: skip
    Flag("--max-connections", "Open HTTP connections before new requests get 503", int, 1024),
    Flag(
        "--enable-prefill-logprobs",
        "Return prompt logprobs with decoder_input_details",
        switch=True,
    ),  # fmt: skip
    Flag(
        "--disable-grammar-support",
        "Reject grammar / response_format (tools are then only prompted for)",
        switch=True,
    ),  # fmt: skip
    Flag(
        "--disable-playground",
        "pytgi extension: do not serve the chat playground and live dashboard at /playground",
        switch=True,
    ),  # fmt: skip
    Flag(
        "--watermark-gamma",
        "Green-list fraction of the vocabulary (requests with watermark)",
        float,
        0.5,
    ),  # fmt: skip
    Flag("--watermark-delta", "Logit bias of the green list (requests with watermark)", float, 2.0),
    Flag(
        "--otlp-endpoint",
        "OpenTelemetry collector: request spans exported with OTLP over gRPC, as TGI "
        "(e.g. http://localhost:4317)",
    ),  # fmt: skip
    Flag(
        "--otlp-service-name",
        "service.name of the exported spans",
        default="text-generation-inference.router",
    ),
    Flag(
        "--lora-adapters",
        "LoRA adapters (PEFT format) served next to the base model: comma-separated `id`, "
        "`id@revision` (hub repos) or `id=path`; a request picks one by `adapter_id` or `model`",
    ),
    Flag("--usage-stats", "Telemetry (pytgi sends none)", default="off"),
    Flag("--shard-uds-path", "Accepted for compatibility", default="/tmp/text-generation-server"),
    Flag(
        "--weights-cache-override",
        "Directory holding the model's weight files (config and tokenizer still come from "
        "--model-id; nothing is downloaded for a hub model's weights)",
    ),  # fmt: skip
]

_GRAMMAR = GrammarConfig()
# bounds on user grammars (grammar, response_format, tools): checked before admission, compiled by
# the engine; `configs.grammar_config` maps them to GrammarConfig
GRAMMAR_FLAGS = [
    Flag(
        "--grammar-compile-timeout",
        "Seconds a request may wait for its grammar to compile (queueing included) before a 422",
        float,
        _GRAMMAR.compile_timeout_s,
    ),  # fmt: skip
    Flag(
        "--max-grammar-bytes",
        "Longest JSON schema or regex accepted, in bytes",
        int,
        _GRAMMAR.max_grammar_bytes,
    ),  # fmt: skip
    Flag(
        "--max-grammar-size",
        "Most grammar symbols after expanding a schema or regex",
        int,
        _GRAMMAR.max_grammar_size,
    ),  # fmt: skip
    Flag(
        "--max-grammar-lexer-states",
        "Most lexer states one grammar may build (each ~1-2 kB)",
        int,
        _GRAMMAR.max_lexer_states,
    ),  # fmt: skip
    Flag(
        "--grammar-compile-fuel",
        "Work bound of building a grammar's lexer (llguidance fuel, ~50k per ms)",
        int,
        _GRAMMAR.initial_lexer_fuel,
    ),  # fmt: skip
    Flag(
        "--grammar-mask-fuel",
        "Work bound of one token mask (llguidance fuel, ~14k per ms); past it the request fails",
        int,
        _GRAMMAR.step_lexer_fuel,
    ),  # fmt: skip
    Flag("--grammar-compile-threads", "Threads compiling grammars", int, _GRAMMAR.compile_threads),
    Flag(
        "--grammar-mask-threads",
        "Threads computing a step's token masks",
        int,
        _GRAMMAR.mask_threads,
    ),  # fmt: skip
    Flag("--grammar-cache-size", "Compiled grammars kept", int, _GRAMMAR.cache_size),
    Flag(
        "--grammar-cache-bytes",
        "Estimated memory of the compiled grammars kept (the least recently used go first); on "
        "CPU it is taken from the KV cache's memory budget at start-up",
        int,
        _GRAMMAR.cache_bytes,
    ),
]

# TGI's llama.cpp backend (the launcher a CPU user of TGI runs with a GGUF file): the flags with a
# pytgi meaning (`configs.llama_cpp_aliases` maps them)
LLAMA_CPP_FLAGS = [
    Flag("--n-threads", "llama.cpp backend's name of --num-threads", int),
    Flag(
        "--max-physical-batch-total-tokens",
        "llama.cpp backend's physical batch: pytgi's step token budget "
        "(--max-batch-prefill-tokens)",
        int,
    ),  # fmt: skip
]

SERVE_FLAGS = (
    MODEL_FLAGS + ENGINE_FLAGS + LIMIT_FLAGS + SERVER_FLAGS + GRAMMAR_FLAGS + LLAMA_CPP_FLAGS
)


@dataclass(frozen=True)
class RefusedFlag:
    """A TGI flag pytgi has no meaning for: parsed, so that start-up refuses it in one line that
    says why (instead of argparse's bare "unrecognized arguments")."""

    name: str
    reason: str
    switch: bool = False

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")


_NO_GPU_OFFLOAD = "pytgi runs the whole model on one device per shard"
REFUSED_FLAGS = [
    RefusedFlag("--ngrok", "ngrok tunnels are not built in (TGI's do not work either)", True),
    RefusedFlag("--ngrok-authtoken", "ngrok tunnels are not built in"),
    RefusedFlag("--ngrok-edge", "ngrok tunnels are not built in"),
    # TGI's llama.cpp backend
    RefusedFlag("--n-threads-batch", "prefill and decode share the --num-threads threads"),
    RefusedFlag("--n-gpu-layers", _NO_GPU_OFFLOAD),
    RefusedFlag("--split-mode", "models are split across GPUs with --num-shard"),
    RefusedFlag("--defrag-threshold", "the paged KV cache never needs defragmenting"),
    RefusedFlag("--numa", "NUMA placement is left to the OS (numactl)"),
    RefusedFlag("--disable-mmap", "GGUF weights are read into pytgi's own layouts", True),
    RefusedFlag("--use-mmap", "GGUF weights are read into pytgi's own layouts", True),
    RefusedFlag("--use-mlock", "weights are not locked in memory", True),
    RefusedFlag("--disable-offload-kqv", _NO_GPU_OFFLOAD, True),
    RefusedFlag("--offload-kqv", _NO_GPU_OFFLOAD, True),
    RefusedFlag("--disable-flash-attention", "pytgi's CPU attention has one implementation", True),
    RefusedFlag("--flash-attention", "pytgi's CPU attention has one implementation", True),
    RefusedFlag("--type-k", "the KV cache has one dtype for keys and values (--kv-cache-dtype)"),
    RefusedFlag("--type-v", "the KV cache has one dtype for keys and values (--kv-cache-dtype)"),
]


def add_refused_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("TGI flags pytgi refuses at start-up")
    for flag in REFUSED_FLAGS:
        help_text = f"refused: {flag.reason}"
        if flag.switch:
            group.add_argument(flag.name, action="store_true", default=None, help=help_text)
        else:
            group.add_argument(flag.name, default=None, metavar="VALUE", help=help_text)


def check_refused_flags(args: argparse.Namespace) -> None:
    """One line naming the first refused flag given (on the command line or by its env twin)."""
    from pytgi.errors import ConfigError

    for flag in REFUSED_FLAGS:
        if getattr(args, flag.dest, None) not in (None, False):
            raise ConfigError(f"{flag.name} is not supported by pytgi: {flag.reason}")


def _help(flag: Flag) -> str:
    default = "" if flag.default is None or flag.switch else f" [default: {flag.default}]"
    env = f" [env: {flag.env}]" if flag.env else ""
    return f"{flag.help}{default}{env}"


_EXPECTED = {int: "an integer", float: "a number", str: "a string"}


def _env_default(flag: Flag, value: str):
    """The flag's value from its env twin; a bad one ends the command with one line naming the
    variable and what it expects (before any sub-command runs, `-V` included)."""
    if flag.switch:
        parse = _bool
    else:
        parse = flag.type
    try:
        parsed = parse(value)
    except (ValueError, argparse.ArgumentTypeError) as exc:
        expected = _EXPECTED.get(parse) or str(exc).removeprefix("expected ")
        message = f"pytgi: environment variable {flag.env}={value!r}: expected {expected}"
        raise SystemExit(message) from None
    if flag.choices is not None and parsed not in flag.choices:
        raise SystemExit(
            f"pytgi: environment variable {flag.env}={value!r}: expected one of "
            f"{', '.join(flag.choices)}"
        )
    return [parsed] if flag.repeat else parsed


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    from pytgi.version import __version__

    parser.add_argument("-V", "--version", action="version", version=f"pytgi {__version__}")


def add_flags(parser: argparse.ArgumentParser, flags: list[Flag]) -> None:
    for flag in flags:
        names = [flag.short, flag.name] if flag.short else [flag.name]
        env_value = envs.get(flag.env) if flag.env else None
        help_text = _help(flag)
        if flag.switch:
            default = _env_default(flag, env_value) if env_value is not None else False
            parser.add_argument(*names, action="store_true", default=default, help=help_text)
            continue
        default = flag.default
        if env_value is not None:
            default = _env_default(flag, env_value)
        parser.add_argument(
            *names,
            type=flag.type,
            default=default,
            choices=flag.choices,
            action="append" if flag.repeat else "store",
            help=help_text,
        )
