"""Which activations each quantization method's kernels take (torch-free: the launcher checks
`--quantize-activations` before any engine starts, the loader builds the policy from it).

The default is each method as TGI computes it: eetq is W8A16 and bitsandbytes NF4 / FP4 are W4A16
(full-precision activations); LLM.int8 quantizes activations to int8 per row and keeps the
outlier features in full precision; fp8 on CPU has no fp8 activations (TGI's fp8 on GPUs without
fp8 matmuls is weight-only too: fp8 weights, 16-bit activations); GGUF as llama.cpp, which
quantizes activations to 8-bit blocks (Q8_0 / Q8_K) for its quantized dot products.
"""

from __future__ import annotations

from pytgi.errors import ConfigError

ACTIVATIONS = ("int8", "fp32")
DEFAULT_ACTIVATIONS = {
    "eetq": "fp32",
    "bitsandbytes": "int8",
    "bitsandbytes-nf4": "fp32",
    "bitsandbytes-fp4": "fp32",
    "fp8": "fp32",
    "gguf": "int8",
}
# int8 activations would change these methods' numbers beyond rounding the activations: NF4 /
# FP4 through the integer kernels need their code table rounded to round(127 t) / 127, and fp8
# has no int8 kernel; the opt-in is refused for them
FP32_ONLY = ("bitsandbytes-nf4", "bitsandbytes-fp4", "fp8")
# what CUDA serves (backends/cuda/quant_ops.py): the weight-only formats with the model dtype's
# activations, as TGI runs them, and fp8 (per-token e4m3 activations where _scaled_mm runs);
# LLM.int8 (`bitsandbytes`: int8 activations with outlier columns) has no kernel there
CUDA_QUANTIZE = ("gptq", "awq", "compressed-tensors", "fp8", "eetq", "bitsandbytes-nf4",
                 "bitsandbytes-fp4")  # fmt: skip


def activations_for(method: str, requested: str | None = None) -> str:
    """ "int8" or "fp32" for `method` ("gguf" or a `--quantize` value): `requested`
    (`--quantize-activations`) or the method's TGI default; a ConfigError for what cannot run."""
    name = requested or DEFAULT_ACTIVATIONS.get(method, "fp32")
    if name not in ACTIVATIONS:
        raise ConfigError(f"--quantize-activations must be one of {', '.join(ACTIVATIONS)}")
    if name == "int8" and method in FP32_ONLY:
        why = "it has no int8 kernel" if method == "fp8" else "that would round its code table"
        raise ConfigError(
            f"--quantize-activations int8 is not available with --quantize {method}: {why}"
        )
    return name
