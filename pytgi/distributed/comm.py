"""Collectives over the tensor-parallel group. Each is a no-op (or identity) on a single rank."""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from pytgi.distributed.parallel_state import get_control_group, get_tp_info


def tp_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum `x` over ranks, in place; returns `x`."""
    if get_tp_info().world_size > 1:
        dist.all_reduce(x)
    return x


def tp_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's `x` along `dim` (all ranks get the result)."""
    world_size = get_tp_info().world_size
    if world_size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(world_size)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=dim)


def tp_gather_to_first_rank(x: torch.Tensor, dim: int = -1) -> torch.Tensor | None:
    """Concatenate every rank's `x` along `dim` on rank 0; other ranks get None."""
    info = get_tp_info()
    if info.world_size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(info.world_size)] if info.rank == 0 else None
    dist.gather(x.contiguous(), parts, dst=0)
    return torch.cat(parts, dim=dim) if info.rank == 0 else None


def control_broadcast(tensor: torch.Tensor) -> torch.Tensor:
    """Broadcast a CPU int64 tensor from rank 0 over the control group, in place; the other
    ranks pass a buffer of the right shape. Ranks 1..N-1 may wait here indefinitely (between
    steps); rank 0's send is bounded by the collective timeout."""
    if get_tp_info().world_size > 1:
        dist.broadcast(tensor, src=0, group=get_control_group())
    return tensor


def tp_barrier(timeout_s: float) -> None:
    """Wait up to `timeout_s` until every rank gets here (e.g. all have loaded their shard, so that
    the collective timeout of the steps that follow measures skew within a step, not load time)."""
    if get_tp_info().world_size == 1:
        return
    if dist.get_backend() == "gloo":  # names the rank that did not arrive
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=timeout_s))
    else:
        dist.barrier()


def tp_min(value: int) -> int:
    """The minimum of an integer over ranks (e.g. the KV blocks every rank can hold), on the
    control group (a host value; the default group may be NCCL, which takes device tensors)."""
    if get_tp_info().world_size == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=get_control_group())
    return int(t.item())
