"""CUDA graphs over decode steps: TGI's `--cuda-graphs` (default 1,2,4,8,16,32; `0` = eager).

At warm-up, once the KV caches exist, the model runner hands `CudaGraphRunner.capture` its forward:
for each batch size, largest first (the smaller graphs reuse the largest one's memory pool), one
decode step over static device buffers (`StaticDecodeInputs`: input ids, positions, slot mapping,
sequence lengths, block table) is run once eagerly (kernels compiled, workspaces allocated) and
then captured. A decode-only step of n rows later replays the smallest captured size >= n: its
inputs are copied into the first n rows of the static buffers, the padding rows get slot -1 (the
store kernel skips it; pytgi's block pool does not reserve a block 0 for padding as TGI's does)
and length 1, and the graph runs the whole forward (embedding to final norm) with no launch from
Python. Prefill, mixed steps, rows with draft tokens and batches above the largest size run
eagerly.

The graph reads the static buffers and the KV caches it was captured with, so the runner releases
the graphs before it frees the caches and captures again after allocating new ones. What the
graph machinery is comes from a `GraphRecorder` (CUDA graphs here; tests without a GPU record a
step by re-running it eagerly over the same buffers).
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from pytgi.backends.base import (
    AttentionBatch,
    AttentionMetadataBuilder,
    DecodeAccelerator,
    ModelForward,
)
from pytgi.utils.math import cdiv

logger = logging.getLogger(__name__)


def capture_sizes(requested: Iterable[int]) -> tuple[int, ...]:
    """The batch sizes to capture, largest first (TGI's order: the smaller graphs then reuse
    the largest graph's memory), each once."""
    return tuple(sorted({size for size in requested if size > 0}, reverse=True))


def bucket_for(num_rows: int, ascending: list[int]) -> int | None:
    """The smallest captured size >= num_rows (None: no graph holds that many rows)."""
    index = bisect.bisect_left(ascending, num_rows)
    return ascending[index] if index < len(ascending) else None


class StaticDecodeInputs:
    """The device buffers every captured decode step reads, for up to `max_rows` rows whose
    block tables are at most `width` blocks wide."""

    def __init__(self, max_rows: int, width: int, device: torch.device):
        self.width = width
        self.input_ids = torch.zeros(max_rows, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_rows, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((max_rows,), -1, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(max_rows, dtype=torch.int64, device=device)
        self.block_table = torch.zeros(max_rows, width, dtype=torch.int64, device=device)

    def batch(self, num_rows: int, block_size: int) -> AttentionBatch:
        """A decode batch of the first `num_rows` rows, over the buffers themselves (what a graph
        of that size is captured with)."""
        return AttentionBatch(
            query_start_loc=torch.arange(num_rows + 1),
            seq_lens=self.seq_lens[:num_rows],
            block_table=self.block_table[:num_rows],
            slot_mapping=self.slot_mapping[:num_rows],
            block_size=block_size,
            num_decode_rows=num_rows,
        )

    def load(
        self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch, size: int
    ) -> None:
        """Copy a decode step of n <= size rows into the first n rows; rows n..size-1 become
        padding: slot -1 (nothing stored) and length 1 (their ids, positions and table rows are
        whatever an earlier step left there: valid values, and their outputs are dropped)."""
        n, width = batch.num_rows, batch.block_table.shape[1]
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(batch.slot_mapping)
        self.seq_lens[:n].copy_(batch.seq_lens, non_blocking=True)  # host (pinned) rows
        self.block_table[:n, :width].copy_(batch.block_table, non_blocking=True)
        if n < size:
            self.slot_mapping[n:size].fill_(-1)
            self.seq_lens[n:size].fill_(1)


@dataclass
class RecordedStep:
    replay: Callable[[], None]
    output: torch.Tensor  # [size, D]: what the step writes at every replay
    metadata: object  # kept alive: the graph reads the tensors it holds


class GraphRecorder:
    """Records `fn` as a CUDA graph in a memory pool shared by every graph of the runner."""

    def __init__(self):
        self.pool = None

    def record(self, fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up run: Triton compiles, cuBLAS picks its kernels
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            output = fn()
        self.pool = graph.pool()
        return graph.replay, output

    def reset(self) -> None:
        self.pool = None


class CudaGraphRunner(DecodeAccelerator):
    name = "cuda-graphs"
    captures_steps = True

    def __init__(self, sizes: Iterable[int], device: torch.device, recorder=None):
        self.sizes = capture_sizes(sizes)  # largest first
        self.ascending = sorted(self.sizes)
        self.device = device
        self.recorder = recorder or GraphRecorder()
        self.static: StaticDecodeInputs | None = None
        self.steps: dict[int, RecordedStep] = {}

    def capture(
        self,
        forward: ModelForward,
        builder: AttentionMetadataBuilder,
        block_size: int,
        max_model_len: int,
    ) -> None:
        self.release()
        static = StaticDecodeInputs(self.sizes[0], cdiv(max_model_len, block_size), self.device)
        logger.info("CUDA graphs: capturing decode batch sizes %s", ",".join(map(str, self.sizes)))
        for size in self.sizes:
            metadata = builder.build(static.batch(size, block_size))
            ids, positions = static.input_ids[:size], static.positions[:size]

            def step(ids=ids, positions=positions, metadata=metadata) -> torch.Tensor:
                return forward(ids, positions, metadata)

            replay, output = self.recorder.record(step)
            self.steps[size] = RecordedStep(replay, output, metadata)
        self.static = static

    def release(self) -> None:
        self.steps = {}
        self.static = None
        self.recorder.reset()

    def run_step(
        self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch
    ) -> torch.Tensor | None:
        if not self.steps or not batch.is_decode_only:
            return None
        size = bucket_for(batch.num_rows, self.ascending)
        if size is None or batch.block_table.shape[1] > self.static.width:
            return None
        self.static.load(input_ids, positions, batch, size)
        step = self.steps[size]
        step.replay()
        return step.output[: batch.num_rows]
