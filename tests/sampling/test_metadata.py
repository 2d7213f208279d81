"""SamplingMetadata builds only what the batch needs."""

from __future__ import annotations

from pytgi.sampling.metadata import SamplingMetadata

from .conftest import build_request

VOCAB = 50


def test_all_greedy_batch_builds_nothing():
    requests = [build_request(), build_request(top_n_tokens=3)]
    md = SamplingMetadata.from_rows(requests, VOCAB, "cpu")
    assert md.all_greedy and not md.any_penalty and not md.any_watermark and not md.any_warper
    assert md.top_n == [0, 3] and md.max_top_n == 3


def test_warpers_switch_to_sampling_and_pick_rows():
    requests = [
        build_request(do_sample=True, seed=7, output_ids=[1, 2]),
        build_request(top_k=5),  # warper without do_sample: samples, seed 0 stands in
        build_request(),
        build_request(top_p=0.5, temperature=0.5, seed=9),
    ]
    md = SamplingMetadata.from_rows(requests, VOCAB, "cpu")
    assert md.sample_rows == [0, 1, 3]
    assert md.sample_seeds == [7, 0, 9]
    assert md.sample_steps == [2, 0, 0]
    assert md.top_k.rows.tolist() == [1] and md.top_k.values.tolist() == [5]
    assert md.top_p.rows.tolist() == [3]
    assert md.typical_p is None
    assert md.temperature.tolist() == [1.0, 1.0, 1.0, 0.5]


def test_row_params_cover_all_rows_without_indices():
    requests = [build_request(top_k=2, seed=1), build_request(top_k=3, seed=2)]
    md = SamplingMetadata.from_rows(requests, VOCAB, "cpu")
    assert md.top_k.rows is None and md.top_k.values.tolist() == [2, 3]


def test_penalty_pairs():
    requests = [
        build_request(prompt_ids=[3, 4], output_ids=[4], repetition_penalty=1.5),
        build_request(),
        build_request(prompt_ids=[7], output_ids=[7, 8, 7], frequency_penalty=0.5),
    ]
    penalties = SamplingMetadata.from_rows(requests, VOCAB, "cpu").penalties
    assert penalties.token_index.tolist() == [3, 4, 2 * VOCAB + 7, 2 * VOCAB + 8]
    assert penalties.counts.tolist() == [1.0, 2.0, 3.0, 1.0]
    assert penalties.seq_lens.tolist() == [3.0, 3.0, 4.0, 4.0]
    assert penalties.repetition_penalty.tolist() == [1.5, 1.5, 1.0, 1.0]
    assert penalties.frequency_penalty.tolist() == [0.0, 0.0, 0.5, 0.5]


def test_no_frequency_tensor_when_unused():
    requests = [build_request(repetition_penalty=1.2)]
    penalties = SamplingMetadata.from_rows(requests, VOCAB, "cpu").penalties
    assert penalties.frequency_penalty is None and penalties.repetition_penalty is not None


def test_watermark_previous_token():
    requests = [
        build_request(prompt_ids=[3, 4], watermark=True),
        build_request(prompt_ids=[3, 4], output_ids=[9], watermark=True),
    ]
    md = SamplingMetadata.from_rows(requests, VOCAB, "cpu")
    assert md.watermark_rows == [0, 1] and md.watermark_prev_tokens == [4, 9]
