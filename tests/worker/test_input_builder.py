"""InputBuilder: decode rows first, slots from block tables, sampled rows in request order (one per
draft token too), prompt-logprob spans; RequestStates applies each step's deltas."""

from __future__ import annotations

from pytgi.messages.outputs import NewRequestData, ScheduledRequest, SchedulerOutput
from pytgi.messages.sampling_params import SamplingParams
from pytgi.worker.input_builder import InputBuilder
from pytgi.worker.request_states import RequestStates


def new(rid, prompt):
    return NewRequestData(rid, prompt, SamplingParams())


def test_flat_batch_layout():
    states = RequestStates()
    out = SchedulerOutput(
        requests=[
            ScheduledRequest("prefill", 0, 3, new_block_ids=[5], prefill_logprobs=True),
            ScheduledRequest("decode", 5, 1, new_token_ids=[21], new_block_ids=[2, 7], sample=True),
            ScheduledRequest("chunk", 3, 2, new_block_ids=[9, 4], sample=True),
        ],
        new_requests=[
            new("prefill", [11, 12, 13, 14]),
            new("decode", [1, 2, 3, 4, 5]),
            new("chunk", [0, 0, 0, 31, 32]),
        ],
    )
    states.update(out)
    inputs, plan = InputBuilder(block_size=4).build(out, states)
    assert inputs.input_ids.tolist() == [21, 11, 12, 13, 31, 32]
    assert inputs.positions.tolist() == [5, 0, 1, 2, 3, 4]
    # slot = block_ids[pos // 4] * 4 + pos % 4
    assert inputs.attn.slot_mapping.tolist() == [7 * 4 + 1, 20, 21, 22, 9 * 4 + 3, 4 * 4 + 0]
    assert inputs.attn.num_decode_rows == 1
    assert inputs.attn.query_start_loc.tolist() == [0, 1, 4, 6]
    assert inputs.attn.start_positions.tolist() == [5, 0, 3]
    assert inputs.attn.block_table.tolist() == [[2, 7], [5, 0], [9, 4]]
    assert [r.request_id for r in plan.sample_rows] == ["decode", "chunk"]
    assert inputs.logits_indices.tolist() == [0, 5]
    assert [r.output_index for r in plan.sample_rows] == [1, 0]
    assert inputs.logprob_spans == [(1, 3)]
    assert plan.logprob_requests[0].target_ids == [12, 13, 14]


def test_draft_tokens_follow_the_history_and_get_a_row_each():
    states = RequestStates()
    first = SchedulerOutput(
        requests=[ScheduledRequest("a", 0, 3, new_block_ids=[0, 1], sample=True)],
        new_requests=[new("a", [10, 11, 12])],
    )
    states.update(first)
    step = SchedulerOutput(
        requests=[ScheduledRequest("a", 3, 1, new_token_ids=[13], draft_ids=[14, 15], sample=True)]
    )
    states.update(step)
    assert states["a"].token_ids == [10, 11, 12, 13]  # drafts never enter the history
    inputs, plan = InputBuilder(block_size=4).build(step, states)
    assert inputs.input_ids.tolist() == [13, 14, 15]
    assert inputs.positions.tolist() == [3, 4, 5]
    assert inputs.attn.num_decode_rows == 0  # three queries: attention treats it as a prefill row
    assert inputs.logits_indices.tolist() == [0, 1, 2]
    assert [r.drafts for r in plan.sample_rows] == [[], [14], [14, 15]]
    assert [r.output_index for r in plan.sample_rows] == [1, 2, 3]
    assert plan.num_rows_per_request == [("a", 3)]


def test_request_states_apply_deltas_and_frees():
    states = RequestStates()
    states.update(
        SchedulerOutput(
            requests=[ScheduledRequest("a", 0, 2, new_block_ids=[3])],
            new_requests=[new("a", [1, 2])],
        )
    )
    states.update(
        SchedulerOutput(
            requests=[ScheduledRequest("a", 2, 1, new_token_ids=[9], new_block_ids=[4])]
        )
    )
    assert states["a"].token_ids == [1, 2, 9] and states["a"].block_ids == [3, 4]
    states.update(SchedulerOutput(requests=[], freed_request_ids=["a"]))
    assert "a" not in states
