"""Tensor-parallel process state: this process's rank and world size, set once per process.

`init_distributed` is called by the Worker (rank 0 in the engine process, ranks 1..N-1 in their own
processes) before the model is built; layers ask `get_tp_info()` for their shard. A process that
never called it is a single rank (0 of 1), which is what single-shard serving and most tests use.

Two groups: the default group carries the model's collectives (gloo on CPU, NCCL on GPU); the
control group (always gloo, CPU tensors) carries each step's inputs from rank 0 to the others.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass

import torch.distributed as dist

logger = logging.getLogger(__name__)

INIT_TIMEOUT_S = 120.0


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
    """Join the TP process group (only when world_size > 1) and record this process's rank, once."""
    global _TP_INFO, _CONTROL_GROUP
    assert _TP_INFO is None, f"distributed state already initialised as {_TP_INFO}"
    assert 0 <= rank < world_size, (rank, world_size)
    if world_size > 1:
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{master_addr}:{master_port}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=INIT_TIMEOUT_S),
        )
        _CONTROL_GROUP = dist.new_group(backend="gloo")
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
