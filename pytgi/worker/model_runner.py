"""ModelRunner: one rank's model, KV caches and step execution.

Life cycle (driven by the Worker): `load_model` -> `warm_up` (a dummy step through `execute`, on a
temporary cache, then the accelerator's capture, measured and released) -> `profile_num_blocks`
(from the memory left, the released capture's memory still held by the allocator) ->
`allocate_kv_cache(num_blocks)` -> `capture_decode_steps`; then `execute` per step on rank 0,
`execute_inputs` on the other ranks (which get each step's inputs from rank 0).

The runner owns what a step needs besides the model: the workers' request states, the input
builder, the attention backend's metadata builder, the KV caches (allocated from the layers'
`KVCacheSpec`s and handed to them through the forward context), the decode-step accelerator
(asked per step whether it runs the decoder stack), and on rank 0 the sampler, which also verifies
draft tokens.
"""

from __future__ import annotations

import logging
import math
import time

import torch

from pytgi.backends.base import (
    KV_CACHE_TORCH_DTYPES,
    KVCache,
    KVCacheSpec,
    Platform,
    kv_group_of,
    kv_group_windows,
)
from pytgi.config import EngineConfig
from pytgi.distributed.parallel_state import TPInfo
from pytgi.errors import ConfigError
from pytgi.layers.attention import Attention
from pytgi.layers.build_context import BuildContext
from pytgi.layers.forward_context import forward_context
from pytgi.layers.lora import LoRABatch
from pytgi.layers.rotary import RotaryEmbedding
from pytgi.messages.outputs import ModelOutput, PendingMasks, SampledToken, SchedulerOutput
from pytgi.models.config import read_model_type
from pytgi.models.loader import build_model
from pytgi.models.multimodal import is_multimodal
from pytgi.worker.input_builder import ForwardInputs, InputBuilder, StepPlan
from pytgi.worker.kv_groups import window_group_blocks
from pytgi.worker.request_states import RequestStates
from pytgi.worker.step_transport import send_step
from pytgi.worker.warmup import dummy_scheduler_output

logger = logging.getLogger(__name__)

LOGPROB_CHUNK_ROWS = 512  # prompt rows per LM-head call when prefill logprobs are asked for


class ModelRunner:
    def __init__(self, config: EngineConfig, platform: Platform, rank: int = 0):
        self.config = config
        self.platform = platform
        self.tp = TPInfo(rank, config.parallel.num_shard)
        self.device = platform.device_for_rank(rank)
        self.block_size = config.cache.block_size
        dtype = config.model.dtype
        self.dtype = getattr(torch, dtype) if dtype else None  # None: the platform's, at load
        self.attention = None
        self.input_builder = InputBuilder(self.block_size, self.device)
        self.states = RequestStates()
        self.model = None
        self.spec = None
        self.sampler = None
        self.speculator = None  # trained draft heads (rank 0), models/speculators.py
        self._sampled_hidden = None  # the last step's hidden states of its sampled rows [S, H]
        self.accelerator = None
        self.kv_specs: dict[str, KVCacheSpec] = {}
        self.rotary_tables: list[RotaryEmbedding] = []
        self.kv_caches: dict[str, KVCache] = {}
        self.metadata_builder = None
        self.num_blocks = 0
        # KV groups (kv_group_windows): each group's window and block count, each layer's group
        self.kv_group_windows: tuple[int | None, ...] = (None,)
        self.kv_group_blocks: tuple[int, ...] = ()
        self.layer_groups: dict[str, int] = {}
        self.multimodal = None  # a vision-language model's step helper (worker/multimodal.py)
        # the logprob of a prompt chunk's first token comes from the previous chunk's last row
        self._next_prompt_logprob: dict[str, float] = {}

    # ---- set-up -------------------------------------------------------------------------------

    def load_model(self, model_dir) -> None:
        if self.dtype is None:
            self.dtype = self.platform.default_dtype(read_model_type(model_dir))
        self.attention = self.platform.attention_backend(self.dtype)
        context = BuildContext(
            platform_name=self.platform.name,
            kernels=self.platform.kernels_for(self.dtype),
            attention=self.attention,
            dtype=self.dtype,
            kv_cache_dtype=KV_CACHE_TORCH_DTYPES.get(self.config.cache.kv_cache_dtype),
            max_model_len=self.config.model.max_model_len,
            tp=self.tp,
            quant_ops=self.platform.quant_ops(self.dtype),
        )
        self.model, self.spec = build_model(self.config.model, model_dir, context, self.device)
        self._load_lora_adapters()
        self._load_speculator()
        self.kv_specs = {
            m.layer_name: m.kv_cache_spec()
            for m in self.model.modules()
            if isinstance(m, Attention)
        }
        self.rotary_tables = [m for m in self.model.modules() if isinstance(m, RotaryEmbedding)]
        self._set_up_kv_groups()
        self.accelerator = self.platform.decode_accelerator(self.model, self.kv_cache_dtype)
        if self.accelerator is not None and len(self.kv_group_windows) > 1:
            set_kv_groups = getattr(self.accelerator, "set_kv_groups", None)
            if set_kv_groups is not None:  # the fused CPU stack reads per-layer tables
                set_kv_groups(self.layer_groups)
            else:
                logger.info(
                    "%s off: the model's windowed and full layers keep separate block tables",
                    self.accelerator.name,
                )
                self.accelerator = None
        if is_multimodal(self.model):
            self._set_up_multimodal()
        if self.tp.is_first_rank:
            from pytgi.sampling.sampler import Sampler

            watermark = self.config.watermark
            self.sampler = Sampler(self.spec.vocab_size, watermark.gamma, watermark.delta)

    def _set_up_kv_groups(self) -> None:
        """One KV group per window when the backend reads per-group tables (a model mixing
        windowed and full layers frees its windowed layers' old blocks), else one group."""
        specs = self.kv_specs.values()
        groups = kv_group_windows(specs)
        if len(groups) > 1 and not self.attention.supports_kv_groups:
            groups = (None,)  # the windowed layers keep every block
        self.kv_group_windows = groups
        self.layer_groups = {
            name: kv_group_of(spec.sliding_window, groups) for name, spec in self.kv_specs.items()
        }
        self.input_builder.num_kv_groups = len(groups)

    def _load_lora_adapters(self) -> None:
        adapters = self.config.model.lora_adapters
        if not adapters:
            return
        from pytgi.models.lora import load_lora_adapters
        from pytgi.models.resolve import resolve_adapter

        dirs = [(a.id, resolve_adapter(a, self.config.model)) for a in adapters]
        self.input_builder.lora_slots = load_lora_adapters(
            self.model, dirs, self.dtype, self.device
        )
        logger.info("loaded %d LoRA adapter(s): %s", len(dirs), ", ".join(a.id for a in adapters))

    def _load_speculator(self) -> None:
        spec = self.config.model.speculator
        if spec is None:
            return
        if self.tp.world_size > 1:
            raise ConfigError(
                f"the {spec.kind} speculator runs on one shard only in pytgi: drop --num-shard or "
                "serve the base model with n-gram speculation"
            )
        from pytgi.models.speculators import load_speculator

        self.speculator = load_speculator(spec, self.model.compute_logits, self.dtype, self.device)
        logger.info(
            "loaded the %s speculator (%d heads) from %s", spec.kind, spec.num_heads, spec.path
        )

    def _set_up_multimodal(self) -> None:
        """Vision-language models run eagerly on one rank (their input embeddings are built on
        rank 0, and the decode accelerators take token ids)."""
        from pytgi.errors import ModelLoadError
        from pytgi.worker.multimodal import MultimodalStep

        if self.tp.world_size > 1:
            raise ModelLoadError(
                f"{self.spec.architecture} runs on one shard only (got --num-shard "
                f"{self.tp.world_size})"
            )
        if self.model.bidirectional is not None:
            if not self.attention.supports_bidirectional_spans:
                raise ModelLoadError(
                    f"{self.spec.architecture}'s bidirectional attention over its "
                    f"{self.model.bidirectional} is not implemented by the {self.attention.name} "
                    "attention backend"
                )
            self.input_builder.bidirectional = self.model.bidirectional
        self.accelerator = None
        if self.model.uses_cross_attention:
            from pytgi.worker.cross_attention import CrossAttentionStep

            self.multimodal = CrossAttentionStep(self.model)
            logger.info("multimodal model: its cross-attention layers attend to the images")
            return
        self.multimodal = MultimodalStep(self.model)
        logger.info("multimodal model: images are encoded by its vision tower")

    @property
    def kv_cache_dtype(self) -> torch.dtype:
        """The caches' storage dtype (every layer's: one --kv-cache-dtype for the model)."""
        dtypes = {spec.dtype for spec in self.kv_specs.values()}
        return dtypes.pop() if len(dtypes) == 1 else self.dtype

    @property
    def sliding_window(self) -> int | None:
        """The largest window when every attention layer has one (the scheduler frees blocks
        below it), else None."""
        windows = [spec.sliding_window for spec in self.kv_specs.values()]
        if not windows or None in windows:
            return None
        return max(windows)

    @property
    def group_bytes_per_block(self) -> tuple[int, ...]:
        """Each KV group's layers' cache for one block of tokens, on this rank."""
        out = [0] * len(self.kv_group_windows)
        for name, spec in self.kv_specs.items():
            out[self.layer_groups[name]] += spec.bytes_per_token * self.block_size
        return tuple(out)

    def group_num_blocks(self, num_blocks: int) -> tuple[int, ...]:
        """Each KV group's block count when the full (first) group has `num_blocks`: a window
        group never needs more than its windows of the running requests (`window_group_blocks`),
        nor more than the full group."""
        windows = self.kv_group_windows[1:]
        return (num_blocks, *(min(num_blocks, self._window_blocks(w)) for w in windows))

    def _window_blocks(self, window: int) -> int:
        scheduler = self.config.scheduler
        step_tokens = scheduler.max_batch_prefill_tokens
        if (
            self.bidirectional is not None
        ):  # a prompt runs whole in one step, past the budget if long
            max_len = self.config.model.max_model_len or self.spec.max_position_embeddings
            step_tokens = max(step_tokens, max_len)
        return window_group_blocks(
            window,
            self.block_size,
            scheduler.max_batch_size,
            step_tokens,
            scheduler.num_speculative_tokens,
        )

    @property
    def bidirectional(self) -> str | None:
        return self.input_builder.bidirectional

    @property
    def bytes_per_block(self) -> int:
        """Every layer's cache for one block of tokens, on this rank."""
        return sum(spec.bytes_per_token for spec in self.kv_specs.values()) * self.block_size

    def allocate_kv_cache(self, num_blocks: int | tuple[int, ...]) -> None:
        """Zeroed caches for every attention layer (padded reads see finite data), each with its
        KV group's `num_blocks` (one count: every group's)."""
        if isinstance(num_blocks, int):
            num_blocks = (num_blocks,) * len(self.kv_group_windows)
        self.num_blocks = num_blocks[0]
        self.kv_group_blocks = tuple(num_blocks)
        self.kv_caches = {
            name: self.attention.allocate_kv_cache(
                spec, num_blocks[self.layer_groups[name]], self.block_size, self.device
            )
            for name, spec in self.kv_specs.items()
        }
        self.metadata_builder = self.attention.metadata_builder(
            self.kv_specs.values(),
            num_blocks if len(num_blocks) > 1 else num_blocks[0],
            self.block_size,
        )

    def free_kv_cache(self) -> None:
        if self.accelerator is not None:
            self.accelerator.release()  # what it captured reads these caches
        self.kv_caches = {}
        self.metadata_builder = None
        self.num_blocks = 0

    def warm_up(self, num_prefill_tokens: int, num_decode_rows: int = 4) -> None:
        """Run one dummy step (prompts and decode rows) on a temporary cache; every rank builds
        the same step itself."""
        output, num_blocks = dummy_scheduler_output(
            num_prefill_tokens,
            num_decode_rows,
            self.block_size,
            self.spec.max_position_embeddings,
            self.spec.vocab_size,
            len(self.kv_group_windows),
        )
        self.allocate_kv_cache(num_blocks)
        self.states.update(output)
        # the dummy decode rows end their prompts mid-way, which bidirectional spans never allow
        bidirectional, self.input_builder.bidirectional = self.input_builder.bidirectional, None
        try:
            inputs, plan = self.input_builder.build(output, self.states)
        finally:
            self.input_builder.bidirectional = bidirectional
        logits, _ = self.execute_inputs(inputs)
        if self.sampler is not None:
            self.sampler(logits.float(), plan.sample_rows)
        self.states.clear()
        self.capture_decode_steps()  # its memory stays with the allocator while the KV is sized
        self.free_kv_cache()

    @torch.inference_mode()
    def capture_decode_steps(self) -> None:
        """Let the decode-step accelerator record its steps over the current KV caches (CUDA
        graphs), logging the time and memory it took; nothing for accelerators that record none."""
        accelerator = self.accelerator
        if accelerator is None or not accelerator.captures_steps:
            return
        available = self.platform.available_memory_bytes()
        start_s = time.perf_counter()
        max_model_len = self.config.model.max_model_len or self.spec.max_position_embeddings
        accelerator.capture(
            self._forward_with, self.metadata_builder, self.block_size, max_model_len
        )
        self.platform.synchronize()
        used = max(0, available - self.platform.available_memory_bytes())
        logger.info(
            "%s: captured in %.2f s, %.1f MiB of device memory",
            accelerator.name,
            time.perf_counter() - start_s,
            used / 2**20,
        )

    def profile_num_blocks(self) -> int:
        """KV blocks that fit in the memory left after weights and warm-up, within the cap."""
        cache = self.config.cache
        available = self.platform.available_memory_bytes()
        grammars = self._grammar_cache_bytes()
        budget = int(max(0, available - grammars) * cache.memory_fraction)
        cap = cache.max_kv_cache_bytes or self.platform.default_kv_cache_cap_bytes()
        if cap is not None:
            budget = min(budget, cap)
        if self.platform.ranks_share_memory():
            budget //= self.tp.world_size  # every rank's cache lives in the same memory
        num_blocks = budget // self.bytes_per_block
        block_bytes, which = self.bytes_per_block, ""
        if len(self.kv_group_windows) > 1:  # the window groups' blocks, the rest to the full one
            sizes = self.group_bytes_per_block
            windows = self.group_num_blocks(num_blocks)[1:]
            windows_bytes = sum(n * b for n, b in zip(windows, sizes[1:], strict=True))
            num_blocks = (budget - windows_bytes) // sizes[0]
            block_bytes, which = sizes[0], " in the full-attention group"
        logger.info(
            "KV cache: (%.2f GiB available - %.2f GiB of grammar cache) x %.2f, cap %s -> %.2f "
            "GiB per rank = %d blocks of %d tokens%s (%d bytes each, %s)",
            available / 2**30,
            grammars / 2**30,
            cache.memory_fraction,
            f"{cap / 2**30:.2f} GiB" if cap else "none",
            budget / 2**30,
            num_blocks,
            self.block_size,
            which,
            block_bytes,
            str(self.kv_cache_dtype).removeprefix("torch."),
        )
        return num_blocks

    def _grammar_cache_bytes(self) -> int:
        """The compiled-grammar cache's bound when it shares the KV cache's memory (host memory:
        the engine process holds it), else 0."""
        grammar = self.config.grammar
        return grammar.cache_bytes if grammar is not None and self.device.type == "cpu" else 0

    # ---- steps --------------------------------------------------------------------------------

    @torch.inference_mode()
    def execute(
        self, scheduler_output: SchedulerOutput, grammar_masks: PendingMasks | None = None
    ) -> ModelOutput:
        """Rank 0: run the step (sending its inputs to the other ranks first) and sample, once
        the step's grammar masks (filled by the engine while the forward runs) are in."""
        self.states.update(scheduler_output)
        for request_id in scheduler_output.freed_request_ids:
            self._next_prompt_logprob.pop(request_id, None)
        if self.multimodal is not None:
            self.multimodal.forget(scheduler_output.freed_request_ids)
        if scheduler_output.is_empty:
            return ModelOutput()
        inputs, plan = self.input_builder.build(scheduler_output, self.states)
        self._add_multimodal(scheduler_output, inputs)
        if self.tp.world_size > 1:
            send_step(inputs)
        logits, prompt_logits = self.execute_inputs(inputs)
        if grammar_masks is not None:
            grammar_masks.wait()
        sampled = accept_drafts(plan, self.sampler(logits.float(), plan.sample_rows))
        return ModelOutput(
            sampled=sampled,
            prefill_logprobs=self._prompt_logprobs(plan, prompt_logits),
            draft_ids=self._propose_drafts(scheduler_output, plan, sampled),
        )

    def _propose_drafts(
        self, scheduler_output: SchedulerOutput, plan: StepPlan, sampled: dict
    ) -> dict[str, list[int]]:
        """The speculator's drafts after the newest token of each request the scheduler asked
        drafts for (`propose_drafts`), from the hidden state of the row that chose it (the row
        after its last accepted draft)."""
        k = self.config.scheduler.num_speculative_tokens
        if self.speculator is None or k == 0 or not sampled:
            return {}
        wanted = {r.request_id for r in scheduler_output.requests if r.propose_drafts}
        rows, tokens, ids, first = [], [], [], 0
        for request_id, num_rows in plan.num_rows_per_request:
            if request_id in wanted:
                kept = sampled[request_id]
                rows.append(first + len(kept) - 1)
                tokens.append(kept[-1].token_id)
                ids.append(request_id)
            first += num_rows
        if not ids:
            return {}
        device = self._sampled_hidden.device
        hidden = self._sampled_hidden[torch.tensor(rows, device=device)]  # [R, H]
        newest = torch.tensor(tokens, device=device)  # [R]
        drafts = self.speculator.propose(hidden, newest, k).tolist()  # [R, k]
        return dict(zip(ids, drafts, strict=True))

    @torch.inference_mode()
    def execute_inputs(self, inputs: ForwardInputs):
        """Every rank: the forward, the sampled rows' logits [S, V] and each prompt-logprob span's
        logits chunks (rank 0 only; the other ranks join the LM head's gathers and get None)."""
        hidden = self._hidden(inputs)  # [T, hidden]
        self._sampled_hidden = hidden[inputs.logits_indices]  # [S, hidden]
        logits = self.model.compute_logits(self._sampled_hidden)  # [S, V] on rank 0
        prompt_logits = [self._span_logits(hidden, *span) for span in inputs.logprob_spans]
        return logits, prompt_logits

    def _span_logits(self, hidden: torch.Tensor, start: int, num_rows: int) -> list:
        """Logits of hidden rows [start, start + num_rows), LOGPROB_CHUNK_ROWS at a time (a
        collective on every rank; the chunks on rank 0, None elsewhere)."""
        rows = hidden[start : start + num_rows]  # [n, hidden]
        return [
            self.model.compute_logits(rows[i : i + LOGPROB_CHUNK_ROWS])
            for i in range(0, num_rows, LOGPROB_CHUNK_ROWS)
        ]

    @torch.inference_mode()
    def forward(self, scheduler_output: SchedulerOutput) -> torch.Tensor:
        """Logits [num_sampled_rows, V] of a step, in request order (tests; rank 0)."""
        self.states.update(scheduler_output)
        inputs, _ = self.input_builder.build(scheduler_output, self.states)
        self._add_multimodal(scheduler_output, inputs)
        return self.execute_inputs(inputs)[0]

    def _add_multimodal(self, scheduler_output: SchedulerOutput, inputs: ForwardInputs) -> None:
        """A vision-language model's step: image embeddings merged into the input embeddings,
        M-RoPE positions [3, T] in place of the token indices."""
        mm = self.multimodal
        if mm is None:
            return
        if self.model.uses_cross_attention:
            inputs.cross_attention = mm.batch(scheduler_output, self.states, inputs.flat_starts)
            return
        slices = mm.slices(scheduler_output, self.states, inputs.flat_starts)
        inputs.inputs_embeds = mm.embeddings(inputs.input_ids, slices)
        if self.model.uses_mrope:
            host = self.input_builder.buffers.host_tensor("positions", inputs.num_tokens)
            table = mm.mrope_positions(
                scheduler_output, self.states, inputs.flat_starts, host.numpy()
            )
            inputs.positions = torch.from_numpy(table).to(self.device)  # [3, T]

    def _hidden(self, inputs: ForwardInputs) -> torch.Tensor:
        longest = int(inputs.attn.seq_lens.max())  # host tensor: no device sync
        longest += getattr(self.model, "position_offset", 0)  # PaliGemma's rotary counts from 1
        grown = [table.reserve(longest) for table in self.rotary_tables]
        lora = None
        if inputs.adapter_slots is not None:
            lora = LoRABatch.from_slots(inputs.adapter_slots)
        accelerator = self.accelerator
        if accelerator is not None and any(grown) and accelerator.captures_steps:
            self.capture_decode_steps()  # the recorded steps read the old tables
        # recorded steps (CUDA graphs) run base weights only: a step with adapter rows is not
        # replayed; the fused CPU stack takes adapter rows itself (or declines the step)
        if accelerator is not None and lora is None:
            hidden = accelerator.run_step(inputs.input_ids, inputs.positions, inputs.attn)
            if hidden is not None:  # replayed: no metadata built, no layer run from Python
                return hidden
        metadata = self.metadata_builder.build(inputs.attn)
        fused = None
        if accelerator is not None:
            slots = inputs.adapter_slots if lora is not None else None
            fused = accelerator.for_step(inputs.attn, metadata, self.kv_caches, slots)
        return self._forward_with(
            inputs.input_ids, inputs.positions, metadata, fused, inputs.inputs_embeds, lora,
            inputs.cross_attention,
        )  # fmt: skip

    def _forward_with(
        self, input_ids, positions, metadata, fused=None, inputs_embeds=None, lora=None,
        cross_attention=None,
    ) -> torch.Tensor:  # fmt: skip
        """The model's forward over this runner's KV caches: hidden [T, hidden]."""
        with forward_context(metadata, self.kv_caches, fused, lora):
            if cross_attention is not None:  # Mllama: the step's rows with images
                return self.model(input_ids, positions, cross_attention=cross_attention)
            if inputs_embeds is not None:  # a multimodal step: image embeddings merged in
                return self.model(input_ids, positions, inputs_embeds=inputs_embeds)
            return self.model(input_ids, positions)

    def _prompt_logprobs(self, plan: StepPlan, prompt_logits) -> dict[str, list[float]]:
        """Logprob of each input token of a row given the tokens before it (NaN at position 0)."""
        from pytgi.sampling.logprobs import compute_prefill_logprobs

        out = {}
        for request, chunks in zip(plan.logprob_requests, prompt_logits, strict=True):
            targets = torch.tensor(request.target_ids, dtype=torch.int64)  # [n]
            values = []
            for i, logits in enumerate(chunks):
                chunk = targets[i * LOGPROB_CHUNK_ROWS : (i + 1) * LOGPROB_CHUNK_ROWS]
                values += compute_prefill_logprobs(logits, chunk).tolist()
            rid = request.request_id
            first = self._next_prompt_logprob.pop(rid, math.nan) if request.start_pos else math.nan
            if len(values) == request.num_tokens:  # the next chunk's first token is predicted here
                self._next_prompt_logprob[rid] = values.pop()
            out[rid] = [first, *values]
        return out


def accept_drafts(plan: StepPlan, sampled: list[SampledToken]) -> dict[str, list[SampledToken]]:
    """Per request, the tokens to keep: the token at row j is valid while every draft before it
    matched the token chosen at its row; the first mismatch (or the row after the last draft)
    gives the new token. Without drafts: the one sampled token."""
    out, row = {}, 0
    for request_id, num_rows in plan.num_rows_per_request:
        tokens = sampled[row : row + num_rows]
        drafts = plan.sample_rows[row + num_rows - 1].drafts  # the last row follows every draft
        keep = 1
        while keep < num_rows and tokens[keep - 1].token_id == drafts[keep - 1]:
            keep += 1
        out[request_id] = tokens[:keep]
        row += num_rows
    return out
