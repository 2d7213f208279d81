"""Layers built by hand in these tests get the reference build context (tests/conftest.py)."""

import pytest


@pytest.fixture(autouse=True)
def _reference_build_context(reference_build_context):
    return reference_build_context
