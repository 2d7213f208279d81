"""Fixtures for the launcher tests."""

import logging

import pytest


@pytest.fixture
def restore_logging():
    """The launcher points the root logger at this test's (captured, then closed) stderr: put
    the handlers back so later tests do not log into a closed stream."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
