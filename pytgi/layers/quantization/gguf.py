"""The quant config of a GGUF checkpoint: each linear layer, the LM head and the embedding take
the types the file stores them in.

- A layer whose tensors are all quantized gets `GGUFLinearMethod`: its `QuantizedWeight` shards
  (of one type or several, e.g. Q4_K and Q6_K in a Q4_K_M file) are packed as they load (layout
  "auto"): with PYTGI_NATIVE_KQUANTS=1, Q4_K and Q6_K shards keep their 256-value super-blocks
  on the native K-quant kernels (a fused layer mixing the two runs one kernel call per type);
  otherwise (and for other types) into the 4-bit kernel when every shard is 4-bit with
  32-multiple blocks, else the int8 kernel, which holds every code up to 8 bits exactly. Types
  without a kernel of their own (Q5_0, Q5_1, Q5_K, and Q6_K by default) are converted
  losslessly to the int8 kernel, with a log line per type at start-up.
- A layer whose tensors are all F32 / F16 / BF16 stays in full precision (the plain method).
- A fused layer mixing both (rare) quantizes its float shards to Q8_0 (per channel if K is not
  a multiple of 32), with a log line.
- The LM head and the token embedding follow their tensor's type; a quantized embedding looks
  its rows up in the packed weight (a tied one in the head's).
"""

from __future__ import annotations

import logging
from collections import Counter

import torch

from pytgi.backends.base import QuantOps
from pytgi.layers.quantization.base import LinearMethod, QuantConfig
from pytgi.layers.quantization.packed import ActivationPolicy, PackedLinearMethod, Piece
from pytgi.layers.quantization.quantizers import quantize_per_channel_int8, quantize_q8_0

logger = logging.getLogger(__name__)

FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})
EMBEDDING = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"


class GGUFLinearMethod(PackedLinearMethod):
    """Pre-quantized GGUF shards -> one packed kernel weight; float shards quantized to Q8_0."""

    family = "gguf"

    def quantize(self, weight: torch.Tensor) -> Piece:
        logger.info("a %s float shard in a quantized layer is quantized to Q8_0", weight.dtype)
        if weight.shape[1] % 32 == 0:
            return quantize_q8_0(weight)
        return quantize_per_channel_int8(weight, source="int8 per channel")


class GGUFQuantConfig(QuantConfig):
    """`tensor_types`: HF tensor name -> GGML type name (GGUFCheckpoint.hf_tensor_types);
    `packed_modules`: the model's checkpoint module -> (fused module, shard id) table, to find
    the tensors a fused layer loads."""

    name = "gguf"
    experts_in_full_precision = True  # models/gguf/checkpoint.py dequantizes stacked experts

    def __init__(
        self,
        tensor_types: dict[str, str],
        packed_modules: dict[str, tuple[str, object]],
        policy: ActivationPolicy,
    ):
        self.tensor_types = tensor_types
        self.packed_modules = packed_modules
        self.policy = policy
        self.tied = LM_HEAD not in tensor_types
        log_kernel_choices(tensor_types)

    def get_linear_method(self, prefix: str, ops: QuantOps) -> LinearMethod | None:
        types = [self.tensor_types.get(name) for name in self._checkpoint_weights(prefix)]
        if all(t is None or t in FLOAT_TYPES for t in types):
            return None  # full precision (a missing tensor is reported by the loader)
        return GGUFLinearMethod(ops, self.policy)

    def get_lm_head_method(self, ops: QuantOps) -> LinearMethod | None:
        return self._for_tensor(EMBEDDING if self.tied else LM_HEAD, ops)

    def get_embedding_method(self, ops: QuantOps) -> LinearMethod | None:
        # a tied embedding is served from the head's packed weight (ParallelLMHead.tie)
        return None if self.tied else self._for_tensor(EMBEDDING, ops)

    def _for_tensor(self, name: str, ops: QuantOps) -> LinearMethod | None:
        if self.tensor_types.get(name, "F32") in FLOAT_TYPES:
            return None
        return GGUFLinearMethod(ops, self.policy)

    def _checkpoint_weights(self, prefix: str) -> list[str]:
        """The checkpoint weights linear `prefix` loads, e.g. q/k/v_proj for a qkv_proj."""
        parent, _, module = prefix.rpartition(".")
        shards = [ckpt for ckpt, (fused, _) in self.packed_modules.items() if fused == module]
        modules = shards or [module]
        return [f"{parent}.{m}.weight" if parent else f"{m}.weight" for m in modules]


def kernel_for(type_name: str) -> str:
    """The kernel family a GGML type runs on (the nearest with a kernel of its own; Q4_K and
    Q6_K have their own with PYTGI_NATIVE_KQUANTS=1, which the platform logs)."""
    if type_name in FLOAT_TYPES:
        return "fp32"
    bits = {"Q4_0": 4, "Q4_1": 4, "Q4_K": 4}.get(type_name)
    return "int4" if bits == 4 else "int8"


def log_kernel_choices(tensor_types: dict[str, str]) -> None:
    """One line per quantized GGML type: how many tensors, and the kernel they run on."""
    counts = Counter(t for t in tensor_types.values() if t not in FLOAT_TYPES)
    for type_name, count in sorted(counts.items()):
        kernel = kernel_for(type_name)
        native = type_name in ("Q8_0", "Q4_0", "Q4_1", "Q4_K")
        how = "" if native else f" (no {type_name} kernel: converted losslessly)"
        logger.info("GGUF %s x%d -> %s kernel%s", type_name, count, kernel, how)
