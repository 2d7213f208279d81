"""CUDA-graph decode steps: bucket choice and padding as pure functions, then a whole model on the
CUDA platform's Triton path (the interpreter on CPU) whose decode steps are replayed from static
buffers (interpreted.py: a recorder that re-runs the step), against the CPU reference runner."""

from __future__ import annotations

import pytest
import torch
from backends.cuda.interpreted import InterpretedCudaPlatform
from models.runner_utils import BlockAllocator, prompt, scheduled, step

from pytgi.backends.base import AttentionBatch
from pytgi.backends.cpu.platform import CpuPlatform
from pytgi.backends.cuda.graphs import StaticDecodeInputs, bucket_for, capture_sizes
from pytgi.config import DeviceConfig, EngineConfig, ModelConfig
from pytgi.worker.model_runner import ModelRunner


def test_capture_sizes_are_unique_and_largest_first():
    assert capture_sizes([1, 2, 4, 8, 16, 32]) == (32, 16, 8, 4, 2, 1)
    assert capture_sizes([4, 0, 4, 1]) == (4, 1)
    assert capture_sizes([]) == ()


@pytest.mark.parametrize(
    ("rows", "bucket"), [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (32, 32), (33, None)]
)
def test_a_step_replays_the_smallest_size_that_holds_it(rows, bucket):
    assert bucket_for(rows, sorted(capture_sizes([1, 2, 4, 8, 16, 32]))) == bucket


def decode_batch(seq_lens: list[int], tables: list[list[int]], slots: list[int]) -> AttentionBatch:
    width = max(len(t) for t in tables)
    table = torch.zeros(len(tables), width, dtype=torch.int64)
    for i, t in enumerate(tables):
        table[i, : len(t)] = torch.tensor(t)
    return AttentionBatch(
        query_start_loc=torch.arange(len(seq_lens) + 1),
        seq_lens=torch.tensor(seq_lens),
        block_table=table,
        slot_mapping=torch.tensor(slots),
        block_size=4,
        num_decode_rows=len(seq_lens),
    )


def test_static_inputs_pad_rows_store_nothing_and_read_one_key():
    static = StaticDecodeInputs(max_rows=4, width=3, device=torch.device("cpu"))
    first = decode_batch([9, 5, 2], [[7, 3, 1], [2, 6], [4]], [4 * 1 + 0, 4 * 6 + 0, 4 * 4 + 1])
    static.load(torch.tensor([11, 12, 13]), torch.tensor([8, 4, 1]), first, size=4)
    assert static.slot_mapping.tolist() == [4, 24, 17, -1]
    assert static.seq_lens.tolist() == [9, 5, 2, 1]
    assert static.block_table[:3].tolist() == [[7, 3, 1], [2, 6, 0], [4, 0, 0]]
    second = decode_batch([10], [[7, 3, 1]], [4 * 1 + 1])
    static.load(torch.tensor([21]), torch.tensor([9]), second, size=2)
    assert static.input_ids[:1].tolist() == [21] and static.positions[:1].tolist() == [9]
    assert static.slot_mapping[:2].tolist() == [5, -1]  # row 1 is padding now
    assert static.seq_lens[:2].tolist() == [10, 1]
    view = static.batch(2, block_size=4)
    assert view.is_decode_only and view.block_table.data_ptr() == static.block_table.data_ptr()


def make_runners(model_dir):
    """The CUDA platform's runner (graphs of 2 rows) and the CPU reference runner, both bf16."""
    torch.set_num_threads(1)
    config = EngineConfig(model=ModelConfig(model_id=str(model_dir), dtype="bfloat16"))
    platform = InterpretedCudaPlatform(cuda_graphs=(2,))
    triton_runner = ModelRunner(config, platform)
    reference = ModelRunner(config, CpuPlatform(DeviceConfig(kernels=False)))
    for runner in (triton_runner, reference):
        runner.load_model(model_dir)
        runner.allocate_kv_cache(32)
    triton_runner.capture_decode_steps()
    return triton_runner, reference, platform.recorder


def run_and_compare(runners, seqs, tables, num_prompt, rids, start) -> None:
    """One step of `rids` from `start` on both runners; the reference's greedy token is then
    appended to every row (teacher-forced: both see the same tokens)."""
    triton_runner, reference, _ = runners
    out = step(
        *(scheduled(r, seqs[r], start[r], len(seqs[r]), tables[r], num_prompt=num_prompt[r])
          for r in rids)
    )  # fmt: skip
    ours, expected = triton_runner.forward(out), reference.forward(out)
    torch.testing.assert_close(ours.float(), expected.float(), atol=3e-2, rtol=3e-2)
    for row, rid in enumerate(rids):
        seqs[rid] = seqs[rid] + [int(expected[row].argmax())]


def test_decode_steps_replayed_over_static_buffers_match_the_reference(tiny_model_factory):
    runners = make_runners(tiny_model_factory("llama", num_hidden_layers=1))
    recorder = runners[2]
    blocks = BlockAllocator()  # the first request owns block 0: a padding row writing there shows
    seqs = {rid: prompt(n, seed=n) for rid, n in (("a", 9), ("b", 17), ("c", 3))}
    tables = {rid: blocks.take(len(ids) + 4) for rid, ids in seqs.items()}
    num_prompt = {rid: len(ids) for rid, ids in seqs.items()}
    run_and_compare(runners, seqs, tables, num_prompt, ["a", "b", "c"], dict.fromkeys(seqs, 0))
    for rids, replays in ((["a", "b", "c"], 0), (["b"], 1), (["a", "c"], 2), (["a", "b"], 3)):
        start = {r: len(seqs[r]) - 1 for r in rids}
        run_and_compare(runners, seqs, tables, num_prompt, rids, start)  # 3 rows: eager
        assert recorder.replays[2] == replays


def test_a_grown_rotary_table_is_captured_again(tiny_model_factory):
    """Positions past the table (a model of 60 positions, blocks of 16: the graph's block table
    holds 64) make the runner rebuild the cos/sin table; the graphs read the old one, so the
    runner records them again before replaying."""
    model_dir = tiny_model_factory("llama", num_hidden_layers=1, max_position_embeddings=60)
    runners = make_runners(model_dir)
    recorder = runners[2]
    assert recorder.records == 1
    seqs = {"a": prompt(61, seed=7)}
    tables, num_prompt = {"a": [0, 1, 2, 3]}, {"a": 61}
    run_and_compare(runners, seqs, tables, num_prompt, ["a"], {"a": 0})  # table: 60 -> 120
    assert recorder.records == 2
    run_and_compare(runners, seqs, tables, num_prompt, ["a"], {"a": 61})  # replayed at 61
    assert recorder.replays[2] == 1


@pytest.mark.parametrize("arch", ["gemma2", "gptj", "falcon_rw", "gpt2"])
def test_family_decode_steps_on_the_cuda_platform(arch, tiny_model_factory):
    """Families through the CUDA platform's layers (Triton kernels where they apply: soft-cap and
    ALiBi in the attention kernel; the reference where they do not: Gemma's (1 + w) RMSNorm,
    interleaved rotary, LayerNorm, GELU) and its graph replay, against the CPU reference."""
    runners = make_runners(tiny_model_factory(arch, num_hidden_layers=1))
    seqs = {rid: prompt(n, seed=n) for rid, n in (("a", 30), ("b", 5))}
    blocks = BlockAllocator()
    tables = {rid: blocks.take(len(ids) + 3) for rid, ids in seqs.items()}
    num_prompt = {rid: len(ids) for rid, ids in seqs.items()}
    run_and_compare(runners, seqs, tables, num_prompt, ["a", "b"], dict.fromkeys(seqs, 0))
    for _ in range(2):
        start = {r: len(seqs[r]) - 1 for r in seqs}
        run_and_compare(runners, seqs, tables, num_prompt, ["a", "b"], start)
    assert runners[2].replays[2] == 2
