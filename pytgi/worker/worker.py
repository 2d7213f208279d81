"""Worker: one tensor-parallel rank. Joins the process group, owns a ModelRunner, and (ranks > 0)
follows rank 0's steps: each step's inputs arrive over the control group (`step_transport`), a stop
header means shut down.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import torch

from pytgi.backends.selector import select_platform
from pytgi.config import CacheInfo, EngineConfig
from pytgi.distributed.comm import tp_barrier, tp_min
from pytgi.distributed.parallel_state import destroy_distributed, init_distributed
from pytgi.errors import ModelLoadError, PytgiError
from pytgi.worker.model_runner import ModelRunner
from pytgi.worker.step_transport import receive_step
from pytgi.worker.warmup import MAX_WARMUP_PREFILL_TOKENS

logger = logging.getLogger(__name__)

LOAD_WAIT_TIMEOUT_S = 600.0  # how long ranks wait for each other to finish loading their shard


class Worker:
    def __init__(self, config: EngineConfig, rank: int):
        self.config = config
        self.rank = rank
        world_size = config.parallel.num_shard
        self.platform = select_platform(config.device)
        self.platform.bind_rank(rank)
        num_threads = config.num_threads or self.platform.threads_per_rank(world_size)
        if num_threads:
            torch.set_num_threads(num_threads)
        parallel = config.parallel
        init_distributed(  # a single rank joins no group, but is recorded for the collectives
            rank,
            world_size,
            parallel.master_addr,
            parallel.master_port,
            self.platform.dist_backend,
            parallel.collective_timeout_s,
        )
        self.runner = ModelRunner(config, self.platform, rank)

    def initialize(self, model_dir: Path) -> CacheInfo:
        """Load, warm up, size and allocate the KV cache; all ranks end with the same num_blocks."""
        t0 = time.perf_counter()
        _inject_test_fault(self.config.parallel.test_rank_fault, self.rank, "load")
        self.runner.load_model(model_dir)
        tp_barrier(LOAD_WAIT_TIMEOUT_S)  # from here on, ranks wait on each other only within a step
        t1 = time.perf_counter()
        prefill_tokens = min(
            self.config.scheduler.max_batch_prefill_tokens, MAX_WARMUP_PREFILL_TOKENS
        )
        _inject_test_fault(self.config.parallel.test_rank_fault, self.rank, "warmup")
        self.runner.warm_up(prefill_tokens)
        t2 = time.perf_counter()
        num_blocks = tp_min(self._num_blocks())
        if num_blocks < 1:
            raise ModelLoadError(
                "not enough memory for a single KV cache block; lower the model "
                "size or raise --max-kv-cache-bytes / memory fraction"
            )
        group_blocks = self.runner.group_num_blocks(num_blocks)
        self.runner.allocate_kv_cache(group_blocks)
        if len(group_blocks) > 1:
            self._log_kv_groups(group_blocks)
        self.runner.capture_decode_steps()
        t3 = time.perf_counter()
        logger.info(
            "rank %d ready: load %.2fs, warm-up (%d prefill tokens) %.2fs, KV alloc and capture "
            "%.2fs",
            self.rank,
            t1 - t0,
            prefill_tokens,
            t2 - t1,
            t3 - t2,
        )
        return self._cache_info(num_blocks, warmup_s=t2 - t1)

    def _log_kv_groups(self, group_blocks: tuple[int, ...]) -> None:
        runner = self.runner
        parts = [
            f"{'full attention' if w is None else f'window {w}'}: {n} blocks of {b} bytes"
            for w, n, b in zip(
                runner.kv_group_windows, group_blocks, runner.group_bytes_per_block, strict=True
            )
        ]
        logger.info(
            "KV cache groups: %s; holds %d tokens (the full group's blocks x %d)",
            ", ".join(parts),
            group_blocks[0] * self.config.cache.block_size,
            self.config.cache.block_size,
        )

    def _num_blocks(self) -> int:
        cache, scheduler = self.config.cache, self.config.scheduler
        if cache.num_blocks is not None:
            return cache.num_blocks
        if scheduler.max_batch_total_tokens is not None:
            return scheduler.max_batch_total_tokens // cache.block_size
        return self.runner.profile_num_blocks()

    def _cache_info(self, num_blocks: int, warmup_s: float) -> CacheInfo:
        block_size = self.config.cache.block_size
        max_position = self.runner.spec.max_position_embeddings
        max_total = min(num_blocks * block_size, max_position)
        return CacheInfo(
            num_blocks=num_blocks,
            block_size=block_size,
            max_total_tokens=max_total,
            max_input_tokens=max_total - 1,
            max_batch_total_tokens=num_blocks * block_size,
            max_position_embeddings=max_position,
            dtype=str(self.runner.dtype).removeprefix("torch."),
            device=self.platform.name,
            kv_cache_dtype=str(self.runner.kv_cache_dtype).removeprefix("torch."),
            kv_bytes_per_token=self.runner.bytes_per_block // block_size,
            sliding_window=self.runner.sliding_window,
            kv_groups=self._kv_groups(),
            bidirectional=self.runner.bidirectional,
            warmup_s=warmup_s,
            vocab_size=self.runner.spec.vocab_size,
            lora_adapters=tuple(self.runner.input_builder.lora_slots),
        )

    def _kv_groups(self) -> tuple[tuple[int | None, int], ...]:
        """(window, num_blocks) per KV group when there are several (else empty)."""
        runner = self.runner
        if len(runner.kv_group_windows) == 1:
            return ()
        return tuple(zip(runner.kv_group_windows, runner.kv_group_blocks, strict=True))

    def shutdown(self) -> None:
        self.runner.free_kv_cache()
        destroy_distributed()


def _inject_test_fault(fault: tuple[int, str] | None, rank: int, stage: str) -> None:
    """Tests only: `ParallelConfig.test_rank_fault` (PYTGI_TEST_RANK_FAULT="<rank>:<stage>") makes
    that rank fail at that stage."""
    if fault == (rank, stage):
        raise RuntimeError(f"fault injected at {stage} by PYTGI_TEST_RANK_FAULT")


def run_worker(config: EngineConfig, rank: int, model_dir: Path, reports, parent_pid: int) -> None:
    """Entry point of ranks 1..N-1 (spawned by RankSupervisor). `reports` (a multiprocessing
    queue) gets ("started", rank, "") before the rank joins the group and ("failed", rank, error)
    if it fails, so that rank 0 can say why a shard died; a failed rank then exits with code 1. A
    rank whose engine process (`parent_pid`) is gone exits at once: nobody else would end it."""
    from pytgi.utils.logging import setup_logging
    from pytgi.utils.process import exit_when_orphaned, ignore_terminal_interrupts

    setup_logging(rank=rank)
    ignore_terminal_interrupts()
    exit_when_orphaned(parent_pid)
    reports.put(("started", rank, ""))
    try:
        worker = Worker(config, rank)
        worker.initialize(model_dir)
        while (inputs := receive_step(worker.runner.device)) is not None:
            worker.runner.execute_inputs(inputs)
    except Exception as exc:
        _report_failure(reports, rank, exc)
        sys.exit(1)
    worker.shutdown()


def _report_failure(reports, rank: int, exc: Exception) -> None:
    """Send the reason to rank 0, which names it when it ends the engine. A typed error's message
    says it all; anything else is logged here with its traceback."""
    reports.put(("failed", rank, f"{type(exc).__name__}: {exc}"))
    if not isinstance(exc, PytgiError):
        logger.exception("tensor-parallel rank %d failed", rank)
