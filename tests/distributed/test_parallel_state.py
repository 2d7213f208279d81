"""An uninitialised tensor-parallel state is an error, not a single rank: the collectives ask
for it and raise until the Worker has recorded its rank (a single rank included)."""

from __future__ import annotations

import pytest
import torch

from pytgi.distributed import comm, parallel_state
from pytgi.distributed.parallel_state import TPInfo, get_tp_info, init_distributed


def test_uninitialised_state_raises(monkeypatch):
    monkeypatch.setattr(parallel_state, "_TP_INFO", None)
    with pytest.raises(RuntimeError, match="not initialised"):
        get_tp_info()
    with pytest.raises(RuntimeError, match="not initialised"):
        comm.tp_all_reduce(torch.ones(2))


def test_a_single_rank_is_recorded_and_may_be_recorded_again(monkeypatch):
    monkeypatch.setattr(parallel_state, "_TP_INFO", None)
    assert init_distributed(0, 1) == TPInfo(0, 1)
    assert init_distributed(0, 1) == get_tp_info() == TPInfo(0, 1)  # a second engine
    x = torch.ones(2)
    assert comm.tp_all_reduce(x) is x
