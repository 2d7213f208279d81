"""Helpers to build server apps and run them: in process (httpx + ASGITransport) or through a
uvicorn server on 127.0.0.1 in a thread (streaming, disconnects, real client libraries).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import httpx
import uvicorn
from server.fakes import CACHE_INFO, FakeEngine, ScriptedInfer

from pytgi.config import LimitsConfig, ServerConfig
from pytgi.server.app import create_app

MODEL_ID = "pytgi/tiny-llama"
SCRIPT = " The quick brown fox jumps over the lazy dog."


def server_config(**overrides) -> ServerConfig:
    limits = overrides.pop("limits", None) or LimitsConfig(max_concurrent_requests=8)
    return ServerConfig(model_id=MODEL_ID, limits=limits, **overrides)


def scripted_app(infer: ScriptedInfer | None = None, **config_overrides):
    """An app on `ScriptedInfer` (server-only behaviour)."""
    keep_alive_s = config_overrides.pop("keep_alive_s", 15.0)
    engine = FakeEngine([5])
    return create_app(
        infer or ScriptedInfer(),
        engine,
        server_config(**config_overrides),
        CACHE_INFO,
        model_info={"model_id": MODEL_ID},
        keep_alive_s=keep_alive_s,
    )


def asgi_client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


@contextlib.contextmanager
def serve(app) -> Iterator[str]:
    """Run `app` with uvicorn on an ephemeral 127.0.0.1 port in a thread; yields the base URL."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
