"""Router fixtures: the shared offline tokenizer, limits, and a scripted fake EngineClient."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.tiny_models import build_tokenizer

from pytgi.config import CacheInfo, LimitsConfig
from pytgi.tokenizer.tokenizer import Tokenizer


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("router-tok")
    build_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir) -> Tokenizer:
    return Tokenizer.from_dir(tokenizer_dir)


@pytest.fixture
def limits() -> LimitsConfig:
    return LimitsConfig(max_input_tokens=40, max_total_tokens=64, max_concurrent_requests=4)


@pytest.fixture
def cache_info() -> CacheInfo:
    return CacheInfo(
        num_blocks=64,
        block_size=16,
        max_total_tokens=512,
        max_input_tokens=511,
        max_batch_total_tokens=1024,
        max_position_embeddings=512,
        dtype="float32",
        device="cpu",
    )


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run on asyncio via anyio's pytest plugin (`pytest.mark.anyio`)."""
    return "asyncio"
