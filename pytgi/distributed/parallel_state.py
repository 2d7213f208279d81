"""Tensor-parallel process state: this process's rank and world size, set once per process.

`init_distributed` is called by the Worker (rank 0 in the engine process, ranks 1..N-1 in their own
processes) before the model is built, for a single rank too (which joins no group). The collectives
(`comm`) ask `get_tp_info()`, which raises in a process that never called it. Layers do not: they
take their shard from the build context (`layers/build_context.py`).

Two groups, two kinds of waiting:
- the default group carries the model's collectives; every wait in it is bounded by the collective
  timeout (`ParallelConfig.collective_timeout_s`), so a rank that stops answering mid-step fails
  the step on the others instead of hanging them;
- the control group (always gloo, CPU tensors) carries each step's inputs from rank 0. Ranks
  1..N-1 idle in it between steps, so their waits have no practical limit; rank 0, the only
  sender, keeps the collective timeout, so a step sent to a stuck rank fails rather than hangs.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass

import torch.distributed as dist

logger = logging.getLogger(__name__)

IDLE_WAIT = datetime.timedelta(days=365)  # ranks 1..N-1 waiting for rank 0's next step


@dataclass(frozen=True)
class TPInfo:
    rank: int
    world_size: int

    @property
    def is_first_rank(self) -> bool:
        return self.rank == 0


_TP_INFO: TPInfo | None = None
_CONTROL_GROUP = None  # gloo group for step metadata (the default group may be NCCL)


def get_tp_info() -> TPInfo:
    if _TP_INFO is None:
        raise RuntimeError("tensor-parallel state is not initialised (init_distributed)")
    return _TP_INFO


def init_distributed(
    rank: int,
    world_size: int,
    master_addr: str = "127.0.0.1",
    master_port: int = 0,
    backend: str = "gloo",
    timeout_s: float = 60.0,
) -> TPInfo:
    """Join the TP process groups (only when world_size > 1) and record this process's rank. The
    rendezvous and every collective wait are bounded by `timeout_s` (rank 0 joins once every rank
    has started, so they arrive within moments of each other). A single rank may be recorded
    again (several engines in one process, e.g. tests); a process in a group must leave it first
    (`destroy_distributed`)."""
    global _TP_INFO, _CONTROL_GROUP
    assert _TP_INFO is None or _TP_INFO.world_size == 1, f"already in a group as {_TP_INFO}"
    assert 0 <= rank < world_size, (rank, world_size)
    if world_size > 1:
        timeout = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{master_addr}:{master_port}",
            rank=rank,
            world_size=world_size,
            timeout=timeout,
        )
        _CONTROL_GROUP = dist.new_group(backend="gloo", timeout=timeout if rank == 0 else IDLE_WAIT)
        logger.info(
            "rank %d/%d joined the %s group at %s:%d",
            rank,
            world_size,
            backend,
            master_addr,
            master_port,
        )
    _TP_INFO = TPInfo(rank=rank, world_size=world_size)
    return _TP_INFO


def get_control_group():
    """The gloo group that carries step metadata (None on a single rank)."""
    return _CONTROL_GROUP


def destroy_distributed() -> None:
    """Leave the process group and forget the rank (executor shutdown; lets tests start over)."""
    global _TP_INFO, _CONTROL_GROUP
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _TP_INFO = _CONTROL_GROUP = None
