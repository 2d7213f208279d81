"""Checks the launcher (and `pytgi generate`) runs before it starts an engine, so that a mistake
costs milliseconds, not a model load, and ends with one line naming the cause (`ConfigError`,
`ModelLoadError`):

- the HTTP port is free (it is bound here and handed to uvicorn, so nothing can take it during
  warm-up);
- `config.json` exists and is a JSON object naming its architecture (a hub model's is checked
  before its weights are downloaded: `utils.hub.resolve_model_dir(check_config=...)`);
- the architecture resolves (models/registry.py): natively, else to the transformers fallback
  (an architecture of transformers' causal-LM table, or the checkpoint's own code with
  --trust-remote-code), else refused;
- the fallback's limits: one shard, no quantized checkpoint, text-only decoder models whose every
  layer is attention (no encoder-decoder, multimodal or recurrent/state-space configs);
- the weight files exist (safetensors, every shard an index names; pickle weights only with
  --allow-pickle-weights), or the model is a GGUF file (its prepared directory, see
  models/gguf/prepared.py), which runs on the native implementation and is not re-quantized.

What needs the model itself (a tensor missing from the files, a parameter the attention backend
cannot honour, a transformers model whose attention bypasses the attention interface) is checked
when the engine builds the model, before any weight is read; the engine reports it in one line
too.

Torch-free: the launcher's process serves HTTP and never imports torch.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, replace
from pathlib import Path

from pytgi.errors import ConfigError, ModelLoadError
from pytgi.layers.quantization.detect import (
    check_checkpoint_quant,
    check_quantize_needs_checkpoint,
    read_checkpoint_quant,
)
from pytgi.models.gguf.prepared import describe_types, read_marker
from pytgi.models.registry import NATIVE, TRANSFORMERS, resolve_architecture
from pytgi.models.weights import find_weight_files

# layer kinds the fallback's paged attention serves (transformers' `layer_types` spelling)
ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})
MULTIMODAL_KEYS = ("vision_config", "audio_config", "text_config")


def bind_port(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port), not yet listening: connections are refused until uvicorn
    listens on it after warm-up. Raises `ConfigError` when the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"Cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(False)
    return sock


@dataclass(frozen=True)
class ModelPlan:
    """Which implementation serves the checkpoint, and how its weights are quantized."""

    architecture: str
    implementation: str  # registry.NATIVE or registry.TRANSFORMERS
    quantize: str | None = None  # a --quantize method, or "gguf"
    weight_types: str | None = None  # a GGUF file's tensor types, e.g. "Q4_1 x210, F32 x61"

    @property
    def description(self) -> str:
        kind = "native" if self.implementation == NATIVE else "transformers fallback"
        text = f"{self.architecture} ({kind} implementation)"
        if self.quantize == "gguf":
            return f"{text}, GGUF weights {self.weight_types}"
        if self.quantize is not None:
            return f"{text}, weights quantized with {self.quantize}"
        return text


def check_model_dir(
    model_dir: Path,
    *,
    implementation: str = "auto",
    trust_remote_code: bool = False,
    allow_pickle_weights: bool = False,
    num_shard: int = 1,
    quantize: str | None = None,
    dtype: str | None = None,
    weights_dir: str | None = None,
) -> ModelPlan:
    """The plan for serving `model_dir` (its weight files in `weights_dir` when given: TGI's
    --weights-cache-override); raises `ModelLoadError` (`ConfigError` for flags that cannot go
    together) with the cause."""
    plan = check_model_config(
        model_dir,
        implementation=implementation,
        trust_remote_code=trust_remote_code,
        num_shard=num_shard,
    )
    gguf = read_marker(model_dir)
    if gguf is None:
        find_weight_files(Path(weights_dir or model_dir), allow_pickle_weights)
        check_fallback_quantization(Path(model_dir), plan)
        return replace(plan, quantize=checkpoint_quantization(Path(model_dir), quantize, dtype))
    if weights_dir is not None:
        raise ConfigError(
            "--weights-cache-override names where a checkpoint's safetensors files are; a GGUF "
            "model is one file: pass it as --model-id"
        )
    if quantize is not None:
        raise ConfigError(
            f"--quantize {quantize} cannot re-quantize a GGUF model: its weights are served in "
            "their own quantized types"
        )
    if plan.implementation != NATIVE:
        raise ModelLoadError("GGUF models run on pytgi's native implementation only")
    return replace(plan, quantize="gguf", weight_types=describe_types(gguf["tensor_types"]))


def checkpoint_quantization(
    model_dir: Path, quantize: str | None, dtype: str | None = None
) -> str | None:
    """The method the weights are served with: the checkpoint's own (refused in one line when
    pytgi cannot serve it, `--quantize` names another, or `--dtype` is not the kernels'
    float32), else `--quantize`'s."""
    quant = read_checkpoint_quant(model_dir)
    if quant is None:
        check_quantize_needs_checkpoint(quantize)
        return quantize
    method = check_checkpoint_quant(quant, quantize)
    if dtype not in (None, "float32"):
        raise ConfigError(
            f"{method} checkpoints run the CPU kernels on float32 activations: use --dtype "
            f"float32 (got {dtype})"
        )
    return method


def check_fallback_quantization(model_dir: Path, plan: ModelPlan) -> None:
    """The fallback serves no checkpoint stored quantized (config.json's quantization_config is
    refused with the config checks; this catches quantize_config.json / quant_config.json)."""
    quant = read_checkpoint_quant(model_dir)
    if quant is not None and plan.implementation == TRANSFORMERS:
        raise ModelLoadError(
            f"{plan.architecture} runs on the transformers fallback, which does not run "
            f"quantized checkpoints ({quant.method}, {quant.source})"
        )


def check_model_config(
    model_dir: Path,
    *,
    implementation: str = "auto",
    trust_remote_code: bool = False,
    num_shard: int = 1,
) -> ModelPlan:
    """The checks of config.json alone (a hub model's before its weights are downloaded)."""
    config = read_config(Path(model_dir))
    plan = plan_model(config, implementation, trust_remote_code)
    if plan.implementation == TRANSFORMERS:
        check_fallback_config(config, plan.architecture, num_shard)
    return plan


def read_config(model_dir: Path) -> dict:
    path = model_dir / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"No config.json in {model_dir}: not a model directory")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelLoadError(f"Cannot read {path}: {err}") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path} is not a JSON object")
    return config


def plan_model(
    config: dict, implementation: str = "auto", trust_remote_code: bool = False
) -> ModelPlan:
    architectures = config.get("architectures")
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        architectures = None
    remote = "AutoModelForCausalLM" in (config.get("auto_map") or {})
    try:
        architecture, entry = resolve_architecture(
            architectures, implementation, remote_code=trust_remote_code and remote
        )
    except ModelLoadError as err:
        if remote and not trust_remote_code:
            raise ModelLoadError(
                f"{err.message}; this checkpoint ships its own modeling code (auto_map), which "
                "runs only with --trust-remote-code"
            ) from None
        raise
    return ModelPlan(architecture, entry.implementation)


def check_fallback_config(config: dict, architecture: str, num_shard: int) -> None:
    """What the transformers fallback cannot serve, read from config.json."""
    served = f"{architecture} runs on the transformers fallback, which"
    if num_shard > 1:
        raise ModelLoadError(f"{served} does not shard: use --num-shard 1 (got {num_shard})")
    quantization = config.get("quantization_config") or config.get("compression_config")
    if quantization:
        method = quantization.get("quant_method") if isinstance(quantization, dict) else None
        raise ModelLoadError(f"{served} does not run quantized checkpoints ({method or 'yes'})")
    if config.get("is_encoder_decoder"):
        raise ModelLoadError(f"{served} serves decoder-only models (this is encoder-decoder)")
    multimodal = [key for key in MULTIMODAL_KEYS if key in config]
    if multimodal:
        raise ModelLoadError(
            f"{served} serves text-only models (config.json has {', '.join(multimodal)})"
        )
    layer_types = config.get("layer_types") or []
    other = sorted({t for t in layer_types if t not in ATTENTION_LAYER_TYPES}, key=str)
    if other:
        raise ModelLoadError(
            f"{served} serves models whose every layer is attention on the KV cache "
            f"(config.json's layer_types has {', '.join(map(str, other))})"
        )
