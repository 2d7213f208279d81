"""SchedulerOutput -> the flat, ragged tensors of one step, filled into buffers reused every step.

Token order inside the batch is the worker's business: rows with a single query token (decodes) go
first so attention can batch them (see `backends.base.AttentionBatch`), prefill rows and rows with
draft tokens follow. Sampled rows are listed in the scheduler's request order (a request with k
drafts has k + 1 consecutive rows), so sampled outputs line up with its requests.

`ForwardInputs` is what every tensor-parallel rank needs for the forward (rank 0 sends it to the
others as one int64 tensor, `worker.step_transport`); `StepPlan` is what only rank 0 needs to
sample and to report prompt logprobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from pytgi.backends.base import AttentionBatch
from pytgi.messages.bidirectional import spans_in, spans_of
from pytgi.messages.outputs import SchedulerOutput
from pytgi.sampling.metadata import SampleRow
from pytgi.worker.request_states import RequestStates


@dataclass
class ForwardInputs:
    input_ids: torch.Tensor  # [T] int64, on the device
    positions: torch.Tensor  # [T] int64, on the device
    attn: AttentionBatch
    logits_indices: torch.Tensor  # [S] int64, on the device: flat rows whose next token is chosen
    logprob_spans: list[tuple[int, int]]  # (first flat row, count): prompt-logprob rows
    # [T] int64 on the device: each token's LoRA adapter slot (0: the base model); None when no
    # row of the step runs an adapter
    adapter_slots: torch.Tensor | None = None
    # rank 0 only (never sent to other ranks): each request's first flat row, and a
    # vision-language model's input embeddings [T, hidden] with its images merged
    flat_starts: dict[str, int] = field(default_factory=dict)
    inputs_embeds: torch.Tensor | None = None
    # a cross-attention model's (Mllama) rows with images: models/mllama.CrossAttentionBatch
    cross_attention: Any = None

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]


@dataclass
class LogprobRequest:
    """A request that asked for prompt logprobs: the targets of its rows in this step."""

    request_id: str
    start_pos: int
    num_tokens: int
    target_ids: list[int]  # the token after each of its rows, where known


@dataclass
class StepPlan:
    sample_rows: list[SampleRow]  # aligned with ForwardInputs.logits_indices
    num_rows_per_request: list[tuple[str, int]]  # (request id, rows): 1 + its number of drafts
    logprob_requests: list[LogprobRequest]  # aligned with ForwardInputs.logprob_spans


class StagingBuffers:
    """Host int64 buffers reused every step (grown when a step needs more) and their device
    copies. On CPU the device tensor is the host buffer itself (no copy)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pinned = device.type == "cuda"
        self._host: dict[str, torch.Tensor] = {}
        self._device: dict[str, torch.Tensor] = {}

    def host(self, name: str, n: int) -> np.ndarray:
        buffer = self._host.get(name)
        if buffer is None or buffer.numel() < n:
            size = max(n, 2 * (buffer.numel() if buffer is not None else 256))
            buffer = torch.empty(size, dtype=torch.int64, pin_memory=self.pinned)
            self._host[name] = buffer
            self._device.pop(name, None)
        return buffer.numpy()[:n]

    def host_tensor(self, name: str, n: int) -> torch.Tensor:
        return self._host[name][:n]

    def to_device(self, name: str, n: int) -> torch.Tensor:
        host = self._host[name][:n]
        if self.device.type == "cpu":
            return host
        device = self._device.get(name)
        if device is None:
            device = torch.empty(self._host[name].numel(), dtype=torch.int64, device=self.device)
            self._device[name] = device
        return device[:n].copy_(host, non_blocking=True)


class InputBuilder:
    def __init__(self, block_size: int, device: torch.device | None = None):
        self.block_size = block_size
        self.buffers = StagingBuffers(device or torch.device("cpu"))
        self.lora_slots: dict[str, int] = {}  # adapter id -> slot (set once adapters are loaded)
        # the model's bidirectional spans mode (messages/bidirectional.py), None: causal
        self.bidirectional: str | None = None
        self.num_kv_groups = 1  # KV groups (block tables per request), set with the caches

    def build(
        self, scheduler_output: SchedulerOutput, states: RequestStates
    ) -> tuple[ForwardInputs, StepPlan]:
        requests = scheduler_output.requests
        assert requests, "empty step"
        order = sorted(range(len(requests)), key=lambda i: requests[i].num_scheduled_tokens > 1)
        rows = [requests[i] for i in order]
        row_states = [states[r.request_id] for r in rows]
        counts = np.array([r.num_scheduled_tokens for r in rows], dtype=np.int64)  # [R]
        starts = np.array([r.start_pos for r in rows], dtype=np.int64)  # [R]
        num_rows, num_tokens = len(rows), int(counts.sum())
        b = self.buffers
        query_start_loc = b.host("query_start_loc", num_rows + 1)
        query_start_loc[0] = 0
        np.cumsum(counts, out=query_start_loc[1:])
        seq_lens = b.host("seq_lens", num_rows)
        np.add(starts, counts, out=seq_lens)
        width = max(len(s.block_ids) for s in row_states)
        table = self._table("block_table", [s.block_ids for s in row_states], width)
        input_ids = b.host("input_ids", num_tokens)
        input_ids[:] = [
            t for r, s in zip(rows, row_states, strict=True) for t in s.step_token_ids(r)
        ]
        row_of_token = np.repeat(np.arange(num_rows), counts)  # [T]
        offset_in_row = np.arange(num_tokens) - query_start_loc[row_of_token]  # [T]
        positions = b.host("positions", num_tokens)
        np.add(starts[row_of_token], offset_in_row, out=positions)
        slots = b.host("slot_mapping", num_tokens)
        bs = self.block_size
        np.add(table[row_of_token, positions // bs] * bs, positions % bs, out=slots)
        flat_start = dict(zip([r.request_id for r in rows], query_start_loc.tolist(), strict=False))
        group_tables = []
        for g in range(1, self.num_kv_groups):  # each group's table and slots, in its own blocks
            name = f"block_table_{g}"
            group = self._table(name, [s.group_table(g) for s in row_states], width)
            np.add(group[row_of_token, positions // bs] * bs, positions % bs,
                   out=b.host(f"slot_mapping_{g}", num_tokens))  # fmt: skip
            group_tables.append(
                (
                    b.host_tensor(name, num_rows * width).view(num_rows, width),
                    b.to_device(f"slot_mapping_{g}", num_tokens),
                )
            )
        attn = AttentionBatch(
            query_start_loc=b.host_tensor("query_start_loc", num_rows + 1),
            seq_lens=b.host_tensor("seq_lens", num_rows),
            block_table=b.host_tensor("block_table", num_rows * width).view(num_rows, width),
            slot_mapping=b.to_device("slot_mapping", num_tokens),
            block_size=bs,
            num_decode_rows=int((counts == 1).sum()),
            bidirectional_spans=self._bidirectional_spans(row_states, starts, counts),
            group_tables=tuple(group_tables),
        )
        logits_indices, plan = self._plan(requests, states, flat_start)
        adapter_slots = self._adapter_slots(row_states, row_of_token)
        inputs = ForwardInputs(
            input_ids=b.to_device("input_ids", num_tokens),
            positions=b.to_device("positions", num_tokens),
            attn=attn,
            logits_indices=logits_indices,
            logprob_spans=[
                (flat_start[r.request_id], len(r.target_ids)) for r in plan.logprob_requests
            ],
            adapter_slots=adapter_slots,
            flat_starts=flat_start,
        )
        return inputs, plan

    def _table(self, name: str, tables: list[list[int]], width: int) -> np.ndarray:
        """The rows' block tables in host buffer `name`, [R, width], padded with block 0."""
        table = self.buffers.host(name, len(tables) * width).reshape(len(tables), width)
        table.fill(0)
        for i, ids in enumerate(tables):
            table[i, : len(ids)] = ids
        return table

    def _bidirectional_spans(self, row_states, starts: np.ndarray, counts: np.ndarray):
        """Each row's bidirectional spans (those inside its scheduled tokens; the scheduler never
        cuts one), None when no row has any."""
        if self.bidirectional is None:
            return None
        rows = tuple(
            spans_in(spans_of(self.bidirectional, s.num_prompt_tokens, s.multimodal_inputs),
                     start, start + n)
            for s, start, n in zip(row_states, starts.tolist(), counts.tolist(), strict=True)
        )  # fmt: skip
        return rows if any(rows) else None

    def _adapter_slots(self, row_states, row_of_token: np.ndarray) -> torch.Tensor | None:
        """Each token's adapter slot [T]; an id no adapter has (never sent by the router for
        /generate) runs the base model, as TGI serves an unknown chat `model`."""
        if not self.lora_slots:
            return None
        per_row = np.array([self.lora_slots.get(s.adapter_id, 0) for s in row_states])  # [R]
        if not per_row.any():
            return None
        n = row_of_token.shape[0]
        self.buffers.host("adapter_slots", n)[:] = per_row[row_of_token]
        return self.buffers.to_device("adapter_slots", n)

    def _plan(self, requests, states: RequestStates, flat_start: dict[str, int]):
        """The sampled rows (scheduler order) and the prompt-logprob requests of the step."""
        indices, sample_rows, per_request, logprobs = [], [], [], []
        for r in requests:
            state = states[r.request_id]
            if r.sample:
                last = flat_start[r.request_id] + r.num_tokens - 1  # the last history token
                masks = r.grammar_bitmask  # int32 [1 + drafts, W] or None
                for j in range(len(r.draft_ids) + 1):
                    indices.append(last + j)
                    sample_rows.append(
                        SampleRow(
                            r.request_id,
                            state.sampling,
                            state.token_ids,
                            r.draft_ids[:j],
                            state.num_output_tokens + j,
                            None if masks is None else masks[j],
                        )
                    )
                per_request.append((r.request_id, len(r.draft_ids) + 1))
            if r.prefill_logprobs:
                end = r.start_pos + r.num_tokens
                targets = state.token_ids[r.start_pos + 1 : end + 1]
                logprobs.append(LogprobRequest(r.request_id, r.start_pos, r.num_tokens, targets))
        host = self.buffers.host("logits_indices", len(indices))
        host[:] = indices
        device = self.buffers.to_device("logits_indices", len(indices))
        return device, StepPlan(sample_rows, per_request, logprobs)
