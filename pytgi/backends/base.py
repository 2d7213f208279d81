"""The device seams: the platform, the attention contract and the decode-step accelerator.

- `Platform`: the device pytgi runs on, chosen once at start-up (`backends.selector`). It decides,
  before any model is built, which compiled kernels exist (`kernels_for(dtype)`), which attention
  backend serves the layers, and which decode-step accelerator the model runner may use.
- Attention: each attention layer declares fixed `AttentionParams` and gets one `AttentionImpl`
  from the backend when it is built; it also declares a `KVCacheSpec`, from which the runner sizes
  and allocates its cache. Per step the backend's `AttentionMetadataBuilder` turns the step's
  `AttentionBatch` into metadata (all of it computed before the forward), shared by every layer.
- `DecodeAccelerator`: runs a decode step's decoder stack at once (the CPU fused decode stack) or
  replays its whole forward (CUDA graphs captured at warm-up). Owned by the model runner, which
  asks it per step.

Row order contract of a step: rows whose query is a single token ("decode rows") come first, so
their tokens are the first `num_decode_rows` tokens of the flat batch; prefill rows follow.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

KVCache = tuple[torch.Tensor, ...]  # one layer's cache: (K, V), or (latent,) for an MLA cache

# --kv-cache-dtype's values -> the cache's storage dtype
KV_CACHE_TORCH_DTYPES = {
    "fp8_e4m3fn": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int8": torch.int8,  # CPU: per-token, per-head scales beside the values (docs/KV_CACHE.md)
}
# an int8 cache row (one token, one KV head) ends with its own fp32 scale
INT8_KV_SCALE_BYTES = 4
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


@dataclass(frozen=True)
class KVScales:
    """A layer's per-tensor KV scales (TGI's and vLLM's fp8 convention): a key is stored as
    k / k_scale in the cache dtype and read back as stored * k_scale; likewise values. From the
    checkpoint (`k_scale` / `v_scale`, or the legacy shared `kv_scale`), else 1.0."""

    k_scale: float = 1.0
    v_scale: float = 1.0

    @property
    def is_unit(self) -> bool:
        return self.k_scale == 1.0 and self.v_scale == 1.0


@dataclass
class AttentionBatch:
    """One step's attention layout, built by the worker's InputBuilder. Row i runs the flat tokens
    [query_start_loc[i], query_start_loc[i + 1]) at positions seq_lens[i] - num_queries[i] ..
    seq_lens[i] - 1, attending to every earlier position of its sequence, whose K/V live at slot
    block_table[i, pos // block_size] * block_size + pos % block_size.

    The row tensors are host (CPU) tensors; `slot_mapping` is on the model's device.
    """

    query_start_loc: torch.Tensor  # [R + 1] int64
    seq_lens: torch.Tensor  # [R] int64: tokens in the cache once this step's are stored
    block_table: torch.Tensor  # [R, W] int64, padded with block 0
    slot_mapping: torch.Tensor  # [T] int64: cache slot of each new token
    block_size: int
    num_decode_rows: int
    # per row, its bidirectional spans ([start, end) positions whose tokens attend to each other
    # both ways: PaliGemma's prompt, Gemma 3's images), or None when no row has one; every span
    # lies wholly inside its row's queries (the scheduler's invariant, messages/bidirectional.py)
    bidirectional_spans: tuple[tuple[tuple[int, int], ...], ...] | None = None
    # KV groups 1.. (kv_group_windows: a model mixing windowed and full layers): each group's
    # (block_table [R, W_g] host, slot_mapping [T] on the device) over its own cache blocks;
    # `block_table` and `slot_mapping` above are group 0's
    group_tables: tuple[tuple[torch.Tensor, torch.Tensor], ...] = ()

    @property
    def num_rows(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def num_queries(self) -> torch.Tensor:
        return self.query_start_loc[1:] - self.query_start_loc[:-1]  # [R]

    @property
    def start_positions(self) -> torch.Tensor:
        return self.seq_lens - self.num_queries  # [R]: tokens cached before this step

    @property
    def is_decode_only(self) -> bool:
        return self.num_decode_rows == self.num_rows

    @property
    def num_groups(self) -> int:
        return 1 + len(self.group_tables)

    def group(self, index: int) -> AttentionBatch:
        """The batch as KV group `index`'s layers see it (its block table and slots)."""
        if index == 0:
            return self
        table, slots = self.group_tables[index - 1]
        return dataclasses.replace(self, block_table=table, slot_mapping=slots, group_tables=())


@dataclass(frozen=True)
class AttentionParams:
    """What one attention layer computes, fixed when the layer is built."""

    num_heads: int
    num_kv_heads: int
    head_size: int
    scale: float
    head_size_v: int | None = None  # None: the same as head_size
    sliding_window: int | None = None  # a query at p sees keys p - W < pos <= p
    # chunked attention (Llama 4): a query at p sees keys p // C * C <= pos <= p (its own chunk)
    attention_chunk_size: int | None = None
    logits_soft_cap: float | None = None  # scores -> cap * tanh(scores / cap)
    alibi_slopes: tuple[float, ...] | None = None  # one per query head
    kv_cache_dtype: torch.dtype | None = None  # None: the model dtype

    @property
    def v_size(self) -> int:
        return self.head_size if self.head_size_v is None else self.head_size_v

    @property
    def visibility(self) -> tuple[int | None, int | None]:
        """(sliding window, attention chunk): which earlier keys a query sees."""
        return self.sliding_window, self.attention_chunk_size


@dataclass(frozen=True)
class KVCacheSpec:
    """One layer's KV cache per token: what the runner sizes and allocates. A full-attention
    layer keeps every position; a sliding-window layer only needs the last `sliding_window`; a
    latent (MLA) cache holds one vector per token (`head_size_v == 0`). A chunked-attention layer
    (`attention_chunk_size`) reads only its query's chunk but keeps a full layer's cache: the
    engine frees blocks only below a windowed KV group's window (docs/KV_CACHE.md)."""

    num_kv_heads: int
    head_size: int
    head_size_v: int
    dtype: torch.dtype
    sliding_window: int | None = None
    attention_chunk_size: int | None = None

    @property
    def visibility(self) -> tuple[int | None, int | None]:
        return self.sliding_window, self.attention_chunk_size

    @property
    def bytes_per_token(self) -> int:
        """K's and V's rows of one token, with an int8 cache's per-row scales."""
        rows = 1 if self.head_size_v == 0 else 2
        scales = INT8_KV_SCALE_BYTES * rows if self.dtype == torch.int8 else 0
        return self.num_kv_heads * (
            (self.head_size + self.head_size_v) * self.dtype.itemsize + scales
        )


@dataclass(frozen=True)
class FullAttentionSpec(KVCacheSpec):
    pass


@dataclass(frozen=True)
class SlidingWindowSpec(KVCacheSpec):
    pass


@dataclass(frozen=True)
class LatentAttentionSpec(KVCacheSpec):
    """An MLA latent cache: `head_size` values per token, no separate V (head_size_v = 0)."""


def kv_group_windows(specs: Iterable[KVCacheSpec]) -> tuple[int | None, ...]:
    """The KV groups of a model's layers, by window: each group has its own blocks and block
    table (docs/KV_CACHE.md). One group when the layers agree: (None,) for full attention (chunked
    layers included), (W,) with W the largest window when every layer has one; a model mixing
    windowed and full layers gets the full group first, then one group per window value:
    (None, W1, W2, ...), W ascending."""
    windows = [spec.sliding_window for spec in specs]
    if not windows or all(w is None for w in windows):
        return (None,)
    if None not in windows:
        return (max(windows),)
    return (None, *sorted({w for w in windows if w is not None}))


def kv_group_of(window: int | None, groups: tuple[int | None, ...]) -> int:
    """The group index of a layer with `window` among `groups` (kv_group_windows')."""
    return 0 if len(groups) == 1 else groups.index(window)


def kv_cache_spec(params: AttentionParams, model_dtype: torch.dtype) -> KVCacheSpec:
    """The cache a standard (non-latent) attention layer with `params` needs."""
    spec_type = FullAttentionSpec if params.sliding_window is None else SlidingWindowSpec
    return spec_type(
        num_kv_heads=params.num_kv_heads,
        head_size=params.head_size,
        head_size_v=params.v_size,
        dtype=params.kv_cache_dtype or model_dtype,
        sliding_window=params.sliding_window,
        attention_chunk_size=params.attention_chunk_size,
    )


class AttentionImpl(ABC):
    """One layer's attention, holding its fixed parameters."""

    def __init__(self, params: AttentionParams):
        self.params = params
        self.kv_scales = KVScales()

    def set_kv_scales(self, scales: KVScales) -> None:
        """The checkpoint's KV scales for this layer (before the first forward); a backend that
        does not apply them to its cache dtype ignores them, as TGI does."""
        self.kv_scales = scales

    @abstractmethod
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: KVCache, metadata: Any
    ) -> torch.Tensor:
        """q [T, H, D], k [T, KVH, D], v [T, KVH, Dv] (this step's tokens) -> out [T, H, Dv];
        stores k/v in the cache first."""


class AttentionMetadataBuilder(ABC):
    """Turns a step's `AttentionBatch` into the backend's metadata, before the forward."""

    @abstractmethod
    def build(self, batch: AttentionBatch) -> Any: ...


class AttentionBackend(ABC):
    name: str
    # honours AttentionBatch.bidirectional_spans (a model that needs it is refused otherwise)
    supports_bidirectional_spans: bool = False
    # reads each layer's KV group's block table (AttentionBatch.group): a model mixing windowed
    # and full layers then gets one group per window; else one group, where no block is freed
    supports_kv_groups: bool = False

    @abstractmethod
    def make_impl(self, params: AttentionParams) -> AttentionImpl:
        """The layer's implementation; raises ModelLoadError for parameters it cannot honour."""

    @abstractmethod
    def allocate_kv_cache(
        self, spec: KVCacheSpec, num_blocks: int, block_size: int, device: torch.device
    ) -> KVCache:
        """A zeroed cache for one layer (padded reads see finite values)."""

    @abstractmethod
    def metadata_builder(
        self, specs: Iterable[KVCacheSpec], num_blocks: int | tuple[int, ...], block_size: int
    ) -> AttentionMetadataBuilder:
        """The per-step builder for layers with these specs over caches of `num_blocks` (a
        backend with `supports_kv_groups`: one count per KV group of the specs)."""


class QuantOps(ABC):
    """The platform's quantized linear products, chosen once at start-up like attention (on CPU:
    the compiled kernels on the kernel table DeviceConfig.quant_isa names, or the pure-torch
    reference). A quantized method declares the weight layout it wants ("int8", "int4", "auto",
    "codebook") and hands its loaded pieces over; the platform packs them and multiplies."""

    @property
    @abstractmethod
    def compiled(self) -> bool:
        """Whether compiled kernels run (which int8 activations and the fused decode stack need)."""

    @abstractmethod
    def pack(self, pieces: list, layout: str) -> Any:
        """Row pieces of one layer, in row order -> its packed weight."""

    @abstractmethod
    def linear(
        self, x: torch.Tensor, packed: Any, bias: torch.Tensor | None, int8_acts: bool
    ) -> torch.Tensor:
        """x [M, K] float32 -> [M, N] = x @ W^T (+ bias); int8 activations when asked."""

    @abstractmethod
    def rows(self, ids: torch.Tensor, packed: Any) -> torch.Tensor:
        """Rows `ids` [T] of the dequantised weight -> [T, K] (a tied embedding's lookup)."""


# (hidden [T, D], cos, sin) -> (hidden, residual): a decoder stack run by an accelerator
FusedLayers = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]

# (input_ids [T], positions [T], attention metadata) -> hidden [T, D]: the model's whole forward
# over the runner's KV caches (the runner sets the forward context), what `capture` records
ModelForward = Callable[[torch.Tensor, torch.Tensor, Any], torch.Tensor]


class DecodeAccelerator(ABC):  # noqa: B024 (every hook has a default: implement those you need)
    """Runs decode steps faster than layer by layer, owned by the model runner, in one of two ways:
    - `for_step`: a replacement for this step's decoder stack, run inside the eager forward (the
      CPU fused decode stack);
    - `run_step`: this step's whole forward, replayed from what `capture` recorded at warm-up
      (CUDA graphs). The runner asks it first, before any metadata is built, and `for_step` only
      when it declines.
    """

    name: str
    captures_steps: bool = False  # whether `capture` records steps (which then hold memory)

    def capture(  # noqa: B027
        self,
        forward: ModelForward,
        builder: AttentionMetadataBuilder,
        block_size: int,
        max_model_len: int,
    ) -> None:
        """Record what `run_step` replays, over the runner's current KV caches (called once they
        are allocated); `builder` turns a batch over the accelerator's own static buffers into
        metadata. Default: nothing to record."""

    def release(self) -> None:  # noqa: B027
        """Drop what `capture` recorded (the KV caches it reads are about to be freed)."""

    def run_step(
        self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch
    ) -> torch.Tensor | None:
        """This step's hidden states [T, D] (a view the next step may overwrite), or None to run
        the forward eagerly."""
        return None

    def for_step(
        self,
        batch: AttentionBatch,
        metadata: Any,
        kv_caches: dict[str, KVCache],
        adapter_slots: torch.Tensor | None = None,
    ) -> FusedLayers | None:
        """The stack's replacement for this step, or None to run it layer by layer.
        adapter_slots [T] int64: each row's LoRA adapter slot (0: base), None when no row has one;
        an accelerator that does not apply LoRA deltas must decline a step that has them."""
        return None


class Platform(ABC):
    """The device pytgi runs on: chosen once at start-up by `backends.selector`."""

    name: str
    dist_backend: str

    @abstractmethod
    def device_for_rank(self, rank: int) -> torch.device:
        """The device tensor-parallel rank `rank` computes on."""

    @abstractmethod
    def default_dtype(self, model_type: str | None = None) -> torch.dtype:
        """The model dtype when --dtype is not given, for a checkpoint of `model_type`
        (config.json's, None when unknown)."""

    @abstractmethod
    def kernels_for(self, dtype: torch.dtype) -> Any | None:
        """The compiled kernels layers may use for a model in `dtype` (None: reference path)."""

    @abstractmethod
    def attention_backend(self, dtype: torch.dtype) -> AttentionBackend:
        """The attention backend for a model in `dtype`."""

    def quant_ops(self, dtype: torch.dtype) -> QuantOps | None:
        """The quantized linear products for a model in `dtype` (None: the platform runs no
        quantized layers; the build context's reference then serves the layer tests)."""
        return None

    def decode_accelerator(  # noqa: B027
        self, model: torch.nn.Module, kv_cache_dtype: torch.dtype
    ) -> DecodeAccelerator | None:
        """The accelerator for `model`'s decode steps, or None (the default) to run them eagerly."""

    @abstractmethod
    def available_memory_bytes(self) -> int:
        """Memory still free for the KV cache (after weights and a warm-up step)."""

    @abstractmethod
    def default_kv_cache_cap_bytes(self) -> int | None:
        """An upper bound on the KV cache when --max-kv-cache-bytes is not given (None: no cap)."""

    def bind_rank(self, rank: int) -> None:  # noqa: B027
        """Make rank `rank`'s device this process's current one (before it joins the group)."""

    def ranks_share_memory(self) -> bool:
        """Whether every rank's KV cache comes out of the same memory (CPU RAM)."""
        return False

    def threads_per_rank(self, world_size: int) -> int | None:
        """Intra-op threads per rank when --num-threads is not given (None: torch's default)."""
        return None

    def synchronize(self) -> None:  # noqa: B027
        """Wait for queued device work (timings); nothing to do on CPU."""
