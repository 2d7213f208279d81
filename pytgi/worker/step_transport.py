"""Rank 0 → ranks 1..N-1: each step's `ForwardInputs` as two int64 tensors over the control group.

The header says the sizes (or that the ranks must stop); the payload holds every index tensor of
the step back to back. The other ranks need nothing else: they keep no request state and never
sample, they run the same forward (and the LM head's gathers for the sampled and prompt-logprob
rows) on their shard.
"""

from __future__ import annotations

import torch

from pytgi.backends.base import AttentionBatch
from pytgi.distributed.comm import control_broadcast
from pytgi.worker.input_builder import ForwardInputs

HEADER = 9  # num tokens (-1: stop), rows, block-table width, sampled rows, logprob spans,
# decode rows, block size, 1 when the step carries LoRA adapter slots, KV groups


def send_step(inputs: ForwardInputs | None) -> None:
    """Rank 0: broadcast the step (None tells the other ranks to leave their loop)."""
    if inputs is None:
        control_broadcast(torch.tensor([-1] + [0] * (HEADER - 1), dtype=torch.int64))
        return
    attn = inputs.attn
    num_rows, width = attn.block_table.shape
    header = [
        inputs.num_tokens,
        num_rows,
        width,
        inputs.logits_indices.shape[0],
        len(inputs.logprob_spans),
        attn.num_decode_rows,
        attn.block_size,
        int(inputs.adapter_slots is not None),
        attn.num_groups,
    ]
    spans = torch.tensor(inputs.logprob_spans, dtype=torch.int64).reshape(-1)
    parts = (
        inputs.input_ids,
        inputs.positions,
        attn.slot_mapping,
        attn.query_start_loc,
        attn.seq_lens,
        attn.block_table.reshape(-1),
        inputs.logits_indices,
        spans,
    )
    if inputs.adapter_slots is not None:
        parts += (inputs.adapter_slots,)
    for table, slots in attn.group_tables:  # every group's table is [rows, width]
        parts += (table.reshape(-1), slots)
    control_broadcast(torch.tensor(header, dtype=torch.int64))
    control_broadcast(torch.cat([p.cpu() for p in parts]))


def receive_step(device: torch.device) -> ForwardInputs | None:
    """Ranks 1..N-1: the next step's inputs, or None when rank 0 says stop."""
    header = control_broadcast(torch.empty(HEADER, dtype=torch.int64)).tolist()
    num_tokens, num_rows, width, num_sampled, num_spans, num_decode_rows, block_size = header[:7]
    if num_tokens < 0:
        return None
    num_adapter_slots = num_tokens if header[7] else 0
    sizes = [num_tokens] * 3 + [num_rows + 1, num_rows, num_rows * width, num_sampled]
    sizes += [2 * num_spans, num_adapter_slots]
    num_groups = header[8]
    sizes += [num_rows * width, num_tokens] * (num_groups - 1)
    payload = torch.empty(sum(sizes), dtype=torch.int64)
    control_broadcast(payload)
    parts = payload.split(sizes)
    input_ids, positions, slots, starts, seq_lens, table, logits_indices, spans = parts[:8]
    attn = AttentionBatch(
        query_start_loc=starts,
        seq_lens=seq_lens,
        block_table=table.view(num_rows, width),
        slot_mapping=slots.to(device),
        block_size=block_size,
        num_decode_rows=num_decode_rows,
        group_tables=tuple(
            (parts[i].view(num_rows, width), parts[i + 1].to(device))
            for i in range(9, 9 + 2 * (num_groups - 1), 2)
        ),
    )
    return ForwardInputs(
        input_ids=input_ids.to(device),
        positions=positions.to(device),
        attn=attn,
        logits_indices=logits_indices.to(device),
        logprob_spans=[tuple(s) for s in spans.view(-1, 2).tolist()],
        adapter_slots=parts[8].to(device) if header[7] else None,
    )
