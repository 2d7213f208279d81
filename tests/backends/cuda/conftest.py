"""The CUDA backend's tests. Without a GPU, its Triton kernels run on CPU tensors in Triton's
interpreter (TRITON_INTERPRET=1, set by tests/conftest.py before anything is collected);
`gpu`-marked tests need the real device."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def device() -> torch.device:
    """Where the kernels run: the GPU when there is one, else CPU through the interpreter."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
