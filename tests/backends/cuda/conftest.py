"""The CUDA backend's tests. Without a GPU, its Triton kernels run on CPU tensors in Triton's
interpreter (TRITON_INTERPRET=1, read when a kernel module is imported, so it is set here, before
any test module of this directory imports one); `gpu`-marked tests need the real device."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def device() -> torch.device:
    """Where the kernels run: the GPU when there is one, else CPU through the interpreter."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
