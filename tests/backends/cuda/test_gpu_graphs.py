"""Real CUDA graphs: replayed decode steps (padded up to a captured size) equal eager ones, the
engine captures after sizing and allocating the KV cache and logs time and memory, and
`CUDA_GRAPHS=0` decodes eagerly to the same tokens."""

from __future__ import annotations

import logging

import torch
from backends.cuda.gpu import cuda_runner, requires_gpu
from models.runner_utils import BlockAllocator, prompt, scheduled, step

pytestmark = requires_gpu


def test_replayed_decode_steps_equal_eager_steps(tiny_model_factory):
    model_dir = tiny_model_factory("qwen3")  # q/k norms: two more Triton kernels in the graph
    graphs = cuda_runner(model_dir, "float32", (1, 2, 4))
    eager = cuda_runner(model_dir, "float32", ())
    replayed = []
    run_step = graphs.accelerator.run_step
    graphs.accelerator.run_step = lambda *a: replayed.append(out := run_step(*a)) or out
    blocks = BlockAllocator()
    seqs = {f"r{i}": prompt(3 + 7 * i, seed=i) for i in range(5)}
    tables = {rid: blocks.take(len(ids) + 8) for rid, ids in seqs.items()}
    num_prompt = {rid: len(ids) for rid, ids in seqs.items()}
    for rids in (list(seqs), list(seqs), ["r0", "r2", "r4"], ["r1"], ["r1", "r3"], list(seqs)):
        fresh = all(len(seqs[r]) == num_prompt[r] for r in rids)
        work = step(
            *(scheduled(r, seqs[r], 0 if fresh else len(seqs[r]) - 1, len(seqs[r]), tables[r],
                        num_prompt=num_prompt[r]) for r in rids)
        )  # fmt: skip
        ours, expected = graphs.forward(work), eager.forward(work)
        torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
        for row, r in enumerate(rids):
            seqs[r] = seqs[r] + [int(expected[row].argmax())]
    # prefill and 5 rows (above the largest graph) ran eagerly; 3, 1 and 2 rows were replayed
    assert [out is not None for out in replayed] == [False, False, True, True, True, False]


def small_memory_fraction(headroom_bytes: int = 512 << 20) -> str:
    """A --cuda-memory-fraction leaving about `headroom_bytes` usable beyond what is in use now
    (a tiny model would otherwise get millions of KV blocks on a large GPU)."""
    free, total = torch.cuda.mem_get_info()
    return f"{(total - free + headroom_bytes) / total:.6f}"


def test_engine_captures_after_kv_sizing_and_matches_eager(tiny_model_factory, monkeypatch, caplog):
    from pytgi.runtime.llm import LLM

    model_dir = tiny_model_factory("llama")
    prompts = [prompt(9, seed=1), prompt(30, seed=2), prompt(4, seed=3)]
    outputs = {}
    monkeypatch.setenv("CUDA_MEMORY_FRACTION", small_memory_fraction())
    for graphs in ("1,2,4", "0"):
        monkeypatch.setenv("CUDA_GRAPHS", graphs)
        caplog.clear()
        with caplog.at_level(logging.INFO):
            llm = LLM(str(model_dir), dtype="float32")
            try:
                runner = llm.core.executor.worker.runner
                outputs[graphs] = llm.generate(prompts, max_new_tokens=32, ignore_eos=True)
                captured = runner.accelerator is not None and bool(runner.accelerator.steps)
                num_blocks = runner.num_blocks
            finally:
                llm.close()
        assert captured == (graphs != "0")
        assert num_blocks > 1000  # sized from the GPU's memory, not the warm-up cache
        logged = [r.getMessage() for r in caplog.records if "captured in" in r.getMessage()]
        assert len(logged) == (2 if graphs != "0" else 0), logged  # warm-up, then final caches
    for on, off in zip(outputs["1,2,4"], outputs["0"], strict=True):
        assert on.token_ids == off.token_ids
