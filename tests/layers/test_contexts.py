"""A missing context is an error, never another code path: a layer built outside a build context
and a layer run outside a forward context raise."""

from __future__ import annotations

import contextvars

import pytest

from pytgi.layers.build_context import BuildContext, build_context, current_build_context
from pytgi.layers.forward_context import forward_context, get_forward_context
from pytgi.layers.linear import ColumnParallelLinear
from pytgi.layers.norm import RMSNorm


def outside_any_context(function, *args):
    """Runs `function` in an empty context (the tests' reference build context is not set)."""
    return contextvars.Context().run(function, *args)


@pytest.mark.parametrize("build", [lambda: RMSNorm(8), lambda: ColumnParallelLinear(8, 4)])
def test_a_layer_built_outside_a_build_context_raises(build):
    with pytest.raises(RuntimeError, match="outside a build context"):
        outside_any_context(build)


def test_build_contexts_nest_and_restore():
    outer = current_build_context()
    inner = BuildContext(max_model_len=7)
    with build_context(inner):
        assert current_build_context() is inner
    assert current_build_context() is outer


def test_a_layer_run_outside_a_forward_context_raises():
    with pytest.raises(RuntimeError, match="outside a forward_context"):
        get_forward_context()
    with forward_context(None, {}), pytest.raises(RuntimeError, match="does not nest"):
        with forward_context(None, {}):
            pass
    with pytest.raises(RuntimeError, match="outside a forward_context"):
        get_forward_context()
