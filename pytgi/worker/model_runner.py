"""ModelRunner: one rank's model, KV cache and step execution.

Life cycle (driven by the Worker): `load_model` -> `warm_up` (a dummy step through `execute`, on a
temporary cache) -> `profile_num_blocks` -> `allocate_kv_cache(num_blocks)`; then `execute` per
step. Only rank 0 gets logits back from the LM head, samples, and returns a `ModelOutput`.
"""

from __future__ import annotations

import gc
import logging
import math

import torch

from pytgi.backends.base import Platform
from pytgi.backends.selector import select_attention_backend
from pytgi.config import EngineConfig
from pytgi.distributed.parallel_state import get_tp_info
from pytgi.engine.outputs import ModelOutput, SchedulerOutput
from pytgi.layers.attention import Attention
from pytgi.layers.forward_context import forward_context
from pytgi.models.loader import build_model
from pytgi.worker.input_builder import ForwardBatch, InputBuilder, LogprobRow
from pytgi.worker.warmup import dummy_scheduler_output

logger = logging.getLogger(__name__)

LOGPROB_CHUNK_ROWS = 512  # prompt rows per LM-head call when prefill logprobs are asked for


class ModelRunner:
    def __init__(self, config: EngineConfig, platform: Platform):
        self.config = config
        self.platform = platform
        self.tp = get_tp_info()
        self.block_size = config.cache.block_size
        dtype = config.model.dtype
        self.dtype = getattr(torch, dtype) if dtype else platform.default_dtype()
        self.backend = select_attention_backend(platform)
        self.input_builder = InputBuilder(self.block_size)
        self.model = None
        self.spec = None
        self.sampler = None
        self.num_blocks = 0
        # the logprob of a prompt chunk's first token comes from the previous chunk's last row
        self._next_prompt_logprob: dict[str, float] = {}

    # ---- set-up -------------------------------------------------------------------------------

    def load_model(self, model_dir) -> None:
        self.model, self.spec = build_model(
            self.config.model, model_dir, self.dtype, self.platform.device
        )
        if self.tp.is_first_rank:
            from pytgi.sampling.sampler import Sampler

            self.sampler = Sampler(self.spec.vocab_size)

    @property
    def attention_layers(self) -> list[Attention]:
        return [m for m in self.model.modules() if isinstance(m, Attention)]

    @property
    def bytes_per_block(self) -> int:
        """K and V of one block in every layer, on this rank."""
        layers = self.attention_layers
        per_token = sum(2 * a.num_kv_heads * a.head_dim for a in layers)
        return per_token * self.block_size * self.dtype.itemsize

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """Bind zeroed K/V tensors to every attention layer (padded gathers read finite data)."""
        self.num_blocks = num_blocks
        for layer in self.attention_layers:
            shape = self.backend.kv_cache_shape(
                num_blocks, self.block_size, layer.num_kv_heads, layer.head_dim
            )
            layer.kv_cache = (
                torch.zeros(shape, dtype=self.dtype, device=self.platform.device),
                torch.zeros(shape, dtype=self.dtype, device=self.platform.device),
            )

    def free_kv_cache(self) -> None:
        for layer in self.attention_layers:
            layer.kv_cache = None
        self.num_blocks = 0
        gc.collect()

    def warm_up(self, num_prefill_tokens: int, num_decode_rows: int = 4) -> None:
        """Run one dummy step (prompts and decode rows) through `execute` on a temporary cache."""
        output, num_blocks = dummy_scheduler_output(
            num_prefill_tokens,
            num_decode_rows,
            self.block_size,
            self.spec.max_position_embeddings,
            self.spec.vocab_size,
        )
        self.allocate_kv_cache(num_blocks)
        self.execute(output)
        self.free_kv_cache()

    def profile_num_blocks(self) -> int:
        """KV blocks that fit in the memory left after weights and warm-up, within the cap."""
        cache = self.config.cache
        available = self.platform.available_memory_bytes()
        budget = int(available * cache.memory_fraction)
        cap = cache.max_kv_cache_bytes or self.platform.default_kv_cache_cap_bytes()
        if cap is not None:
            budget = min(budget, cap)
        if self.platform.name == "cpu":
            budget //= self.tp.world_size  # every rank's cache lives in the same RAM
        num_blocks = budget // self.bytes_per_block
        logger.info(
            "KV cache: %.2f GiB available x %.2f, cap %s -> %.2f GiB per rank = %d blocks of %d "
            "tokens (%d bytes each)",
            available / 2**30,
            cache.memory_fraction,
            f"{cap / 2**30:.2f} GiB" if cap else "none",
            budget / 2**30,
            num_blocks,
            self.block_size,
            self.bytes_per_block,
        )
        return num_blocks

    # ---- steps --------------------------------------------------------------------------------

    def _hidden(self, batch: ForwardBatch) -> torch.Tensor:
        metadata = self.backend.build_metadata(batch.attn)
        with torch.inference_mode(), forward_context(self.backend, metadata):
            return self.model(batch.input_ids, batch.positions)  # [T, hidden]

    @torch.inference_mode()
    def forward(self, scheduler_output: SchedulerOutput) -> torch.Tensor | None:
        """Logits [num_sampled, V] of the sampled requests, in request order (None off rank 0)."""
        batch = self.input_builder.build(scheduler_output)
        hidden = self._hidden(batch)
        return self.model.compute_logits(hidden[batch.sample_indices])

    @torch.inference_mode()
    def execute(self, scheduler_output: SchedulerOutput) -> ModelOutput | None:
        for request_id in scheduler_output.finished_request_ids:
            self._next_prompt_logprob.pop(request_id, None)
        if scheduler_output.is_empty:
            return ModelOutput() if self.tp.is_first_rank else None
        batch = self.input_builder.build(scheduler_output)
        hidden = self._hidden(batch)  # [T, hidden]
        logits = self.model.compute_logits(hidden[batch.sample_indices])  # [S, V] on rank 0
        prefill_logprobs = {
            row.request.request_id: self._prompt_logprobs(hidden, row) for row in batch.logprob_rows
        }
        if not self.tp.is_first_rank:
            return None
        sampled = self.sampler(logits.float(), batch.sampled_requests)
        return ModelOutput(
            sampled={r.request_id: t for r, t in zip(batch.sampled_requests, sampled, strict=True)},
            prefill_logprobs=prefill_logprobs,
        )

    def _prompt_logprobs(self, hidden: torch.Tensor, row: LogprobRow) -> list[float] | None:
        """Logprob of each input token of the row given the tokens before it (NaN at position 0)."""
        from pytgi.sampling.logprobs import compute_prefill_logprobs

        r = row.request
        all_ids = r.prompt_ids + r.output_ids
        end_pos = r.start_pos + r.num_tokens
        targets = list(r.input_ids[1:]) + ([all_ids[end_pos]] if end_pos < len(all_ids) else [])
        rows = hidden[row.start : row.start + len(targets)]  # [n, hidden]
        target_ids = torch.tensor(targets, dtype=torch.int64)  # [n]
        values = []
        for start in range(0, len(targets), LOGPROB_CHUNK_ROWS):
            chunk = slice(start, start + LOGPROB_CHUNK_ROWS)
            logits = self.model.compute_logits(rows[chunk])  # [C, V] on rank 0, collective on all
            if logits is not None:
                values += compute_prefill_logprobs(logits, target_ids[chunk]).tolist()
        if not self.tp.is_first_rank:
            return None
        first = (
            math.nan if r.start_pos == 0 else self._next_prompt_logprob.pop(r.request_id, math.nan)
        )
        if len(targets) == r.num_tokens:  # the next chunk's first token was predicted here
            self._next_prompt_logprob[r.request_id] = values.pop()
        return [first, *values]
