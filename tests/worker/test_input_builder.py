"""InputBuilder: decode rows first, slots from block tables, logits rows in request order."""

from __future__ import annotations

from pytgi.engine.outputs import ScheduledRequest, SchedulerOutput
from pytgi.engine.sampling_params import SamplingParams
from pytgi.worker.input_builder import InputBuilder


def req(rid, ids, start, blocks, sample=True, logprobs=False):
    return ScheduledRequest(
        rid, ids, start, blocks, sample, SamplingParams(), [], [], prefill_logprobs=logprobs
    )


def test_flat_batch_layout():
    out = SchedulerOutput(
        [
            req("prefill", [11, 12, 13], 0, [5], sample=False, logprobs=True),
            req("decode", [21], 5, [2, 7]),
            req("chunk", [31, 32], 3, [9, 4]),
        ]
    )
    batch = InputBuilder(block_size=4).build(out)
    assert batch.input_ids.tolist() == [21, 11, 12, 13, 31, 32]
    assert batch.positions.tolist() == [5, 0, 1, 2, 3, 4]
    # slot = block_ids[pos // 4] * 4 + pos % 4
    assert batch.attn.slot_mapping.tolist() == [7 * 4 + 1, 20, 21, 22, 9 * 4 + 3, 4 * 4 + 0]
    assert batch.attn.num_decode_rows == 1
    assert batch.attn.query_starts == [0, 1, 4]
    assert batch.attn.start_positions == [5, 0, 3]
    assert [r.request_id for r in batch.sampled_requests] == ["decode", "chunk"]
    assert batch.sample_indices.tolist() == [0, 5]
    assert [(r.request.request_id, r.start, r.num_tokens) for r in batch.logprob_rows] == [
        ("prefill", 1, 3)
    ]
