"""TGI's `--quantize` values -> `QuantConfig`s on the CPU kernels, and the checks that refuse an
unsupported combination at start-up (never a silent fallback).

On-the-fly quantisation of a full-precision checkpoint (each with its format's arithmetic, see
quantizers.py): `eetq` (int8 per channel, weight-only), `bitsandbytes` (LLM.int8: int8 per row,
activation columns above 6.0 in fp32), `bitsandbytes-nf4` / `bitsandbytes-fp4` (64-wide blocks,
absmax scales, the code tables), `fp8` (e4m3, per-channel scales). Every linear layer uses it;
the LM head stays in full precision as in TGI (its on-the-fly methods load the head through a
path that is not quantization-aware) unless `ModelConfig.quantize_lm_head`
(PYTGI_QUANTIZE_LM_HEAD=1), which quantizes it too (a tied embedding then dequantises the rows it
looks up): fewer bytes per decode step, at an
accuracy cost measured in docs/PERFORMANCE.md.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from pytgi.backends.base import QuantOps
from pytgi.errors import ConfigError
from pytgi.layers.quantization.activations import CUDA_QUANTIZE, activations_for
from pytgi.layers.quantization.base import LinearMethod, QuantConfig
from pytgi.layers.quantization.cpu_methods import (
    CodebookLinearMethod,
    Fp8LinearMethod,
    Int8LinearMethod,
)
from pytgi.layers.quantization.detect import (
    CheckpointQuant,
    check_checkpoint_quant,
    check_quantize_needs_checkpoint,
)
from pytgi.layers.quantization.packed import FP32_ACTIVATIONS, ActivationPolicy
from pytgi.layers.quantization.quantizers import quantize_per_channel_int8

LLM_INT8_THRESHOLD = 6.0  # bitsandbytes' default outlier threshold (TGI's too)
# int8 activations at every row count: one arithmetic per row whatever the batch
INT8_POLICY = ActivationPolicy(int8_from_rows=1)
POLICIES = {"int8": INT8_POLICY, "fp32": FP32_ACTIVATIONS}


def activation_policy(method: str, requested: str | None = None) -> ActivationPolicy:
    """The policy of `method` ("gguf" or a `--quantize` value): `requested` ("int8" / "fp32",
    `--quantize-activations`) or the method's TGI default (quantization/activations.py)."""
    return POLICIES[activations_for(method, requested)]


class OnTheFlyQuantConfig(QuantConfig):
    """One `--quantize` method: a fresh LinearMethod per layer from `make_method(ops)`, the ops
    being the platform's quantized products for the model."""

    def __init__(
        self,
        name: str,
        make_method: Callable[[QuantOps], LinearMethod],
        quantize_lm_head: bool = False,
    ):
        self.name = name
        self._make_method = make_method
        self.quantize_lm_head = quantize_lm_head

    def get_linear_method(self, prefix: str, ops: QuantOps) -> LinearMethod:
        return self._make_method(ops)

    def get_lm_head_method(self, ops: QuantOps) -> LinearMethod | None:
        return self._make_method(ops) if self.quantize_lm_head else None


def _factories(policy: ActivationPolicy) -> dict[str, Callable]:
    """--quantize name -> (ops -> LinearMethod)."""
    eetq = partial(quantize_per_channel_int8, source="eetq")
    llm_int8 = partial(quantize_per_channel_int8, source="bitsandbytes")
    return {
        "eetq": lambda ops: Int8LinearMethod(ops, policy, eetq),
        "bitsandbytes": lambda ops: Int8LinearMethod(
            ops, policy, llm_int8, outlier_threshold=LLM_INT8_THRESHOLD
        ),
        "bitsandbytes-nf4": lambda ops: CodebookLinearMethod(ops, policy, "nf4"),
        "bitsandbytes-fp4": lambda ops: CodebookLinearMethod(ops, policy, "fp4"),
        "fp8": lambda ops: Fp8LinearMethod(ops),
    }


SUPPORTED_QUANTIZE = tuple(_factories(INT8_POLICY))


def quant_config_for(
    name: str, policy: ActivationPolicy | None = None, quantize_lm_head: bool = False
) -> QuantConfig:
    """The QuantConfig of `--quantize name`, with the activation policy given (default: the
    method's TGI numerics) and the LM head quantized or not (`ModelConfig.quantize_lm_head`;
    TGI: not)."""
    if name not in SUPPORTED_QUANTIZE:
        raise ConfigError(
            f"--quantize {name} is not supported on CPU by pytgi "
            f"(supported: {', '.join(SUPPORTED_QUANTIZE)})"
        )
    factories = _factories(policy or activation_policy(name))
    return OnTheFlyQuantConfig(name, factories[name], quantize_lm_head)


def resolve_quant_config(
    quantize: str | None,
    checkpoint_method: str | None,
    dtype: torch.dtype,
    activations: str | None = None,
    quantize_lm_head: bool = False,
    platform: str = "cpu",
) -> QuantConfig | None:
    """`--quantize` (with `--quantize-activations`) on a full-precision checkpoint -> the
    on-the-fly config, or a ConfigError naming what cannot run together (a pre-quantized
    checkpoint goes through `check_prequantized_options` and prequantized.py instead). On CUDA
    the weight-only methods and fp8 run on its QuantOps (CUDA_QUANTIZE), in any model dtype."""
    if checkpoint_method is not None:
        raise ConfigError(f"the checkpoint is already quantized with '{checkpoint_method}'")
    if quantize is None:
        return None
    check_quantize_needs_checkpoint(quantize)
    if platform != "cpu":
        _check_gpu_options(quantize, activations, platform)
        return quant_config_for(quantize, FP32_ACTIVATIONS, quantize_lm_head)
    if dtype != torch.float32:
        raise ConfigError(
            f"--quantize {quantize} runs its kernels on float32 activations on CPU: "
            f"use --dtype float32 (got {str(dtype).removeprefix('torch.')})"
        )
    policy = activation_policy(quantize, activations)
    return quant_config_for(quantize, policy, quantize_lm_head)


def _check_gpu_options(method: str, activations: str | None, platform: str) -> None:
    if method not in CUDA_QUANTIZE:
        raise ConfigError(
            f"--quantize {method} is not supported on {platform} by pytgi "
            f"(supported there: {', '.join(CUDA_QUANTIZE)})"
        )
    if activations is not None and activations != "fp32":
        raise ConfigError(
            f"--quantize-activations {activations} is CPU only: on {platform} quantized layers "
            "keep the model dtype's activations (fp8: per-token e4m3)"
        )


def check_prequantized_options(
    quant: CheckpointQuant,
    quantize: str | None,
    dtype,
    activations: str | None = None,
    platform: str = "cpu",
) -> ActivationPolicy:
    """What cannot serve a pre-quantized checkpoint: an unsupported method or format, a
    `--quantize` naming another method, on CPU a compute dtype other than the kernels' float32.
    Returns the activation policy: full precision by default (these formats are weight-only),
    `--quantize-activations int8` on request on CPU (not for fp8)."""
    method = check_checkpoint_quant(quant, quantize)
    if platform != "cpu":
        _check_gpu_options(method, activations, platform)
        return FP32_ACTIVATIONS
    if dtype != torch.float32:
        raise ConfigError(
            f"{method} checkpoints run the CPU kernels on float32 activations: use --dtype "
            f"float32 (got {str(dtype).removeprefix('torch.')})"
        )
    return POLICIES[activations_for(method, activations)]


def check_gguf_options(quantize: str | None, dtype: torch.dtype) -> None:
    """What cannot run together with a GGUF checkpoint: re-quantizing it, or a compute dtype
    other than the kernels' float32."""
    if quantize is not None:
        raise ConfigError(
            f"--quantize {quantize} cannot re-quantize a GGUF model: its weights are served in "
            "their own quantized types"
        )
    if dtype != torch.float32:
        raise ConfigError(
            "GGUF models run their kernels on float32 activations on CPU: use --dtype float32 "
            f"(got {str(dtype).removeprefix('torch.')})"
        )
