"""Server fixtures: the offline tokenizer, the engine to run the real router on, and apps.

`engine_factory` is the one place to swap `FakeEngine` for the real in-process engine.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.tiny_models import build_tokenizer
from server.fakes import CACHE_INFO, FakeEngine
from server.harness import MODEL_ID, SCRIPT, server_config

from pytgi.server.app import create_app
from pytgi.tokenizer.tokenizer import Tokenizer


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("server-tok")
    build_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir) -> Tokenizer:
    return Tokenizer.from_dir(tokenizer_dir)


@pytest.fixture
def engine_factory(tokenizer):
    """`factory(**kw) -> EngineClient` emitting SCRIPT then EOS (the fixture to swap)."""

    def factory(*, text: str = SCRIPT, eos: bool = True, delay_s: float = 0.0):
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        return FakeEngine(ids + list(tokenizer.eos_token_ids if eos else []), delay_s=delay_s)

    return factory


@pytest.fixture
def real_app(tokenizer, engine_factory):
    """`factory(engine=None, **config) -> (app, engine)` on the real router."""
    from pytgi.router.infer import Infer

    def factory(engine=None, **config_overrides):
        engine = engine or engine_factory()
        config = server_config(**config_overrides)
        infer = Infer(engine, tokenizer, config.limits, CACHE_INFO)
        model_info = {"model_id": MODEL_ID}
        return create_app(infer, engine, config, CACHE_INFO, model_info=model_info), engine

    return factory
