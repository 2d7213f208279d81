"""Tensor-parallel process state: this process's rank and world size, set once per process.

`init_distributed` is called by the Worker (rank 0 in the engine process, ranks 1..N-1 in their own
processes) before the model is built; layers ask `get_tp_info()` for their shard. A process that
never called it is a single rank (0 of 1), which is what single-shard serving and most tests use.

Two groups, two kinds of waiting:
- the default group carries the model's collectives; every wait in it is bounded by the collective
  timeout (`envs.tp_collective_timeout_s`), so a rank that stops answering mid-step fails the step
  on the others instead of hanging them;
- the control group (always gloo, CPU tensors) carries each step's inputs from rank 0. Ranks
  1..N-1 idle in it between steps, so their waits have no practical limit; rank 0, the only
  sender, keeps the collective timeout, so a step sent to a stuck rank fails rather than hangs.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass

import torch.distributed as dist

from pytgi import envs

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
    return _TP_INFO if _TP_INFO is not None else TPInfo(rank=0, world_size=1)


def init_distributed(
    rank: int, world_size: int, master_addr: str, master_port: int, backend: str = "gloo"
) -> TPInfo:
    """Join the TP process groups (only when world_size > 1) and record this process's rank, once.
    The rendezvous is bounded by the collective timeout too: rank 0 joins once every rank has
    started, so they arrive within moments of each other."""
    global _TP_INFO, _CONTROL_GROUP
    assert _TP_INFO is None, f"distributed state already initialised as {_TP_INFO}"
    assert 0 <= rank < world_size, (rank, world_size)
    if world_size > 1:
        timeout = datetime.timedelta(seconds=envs.tp_collective_timeout_s())
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
