"""A small real HTTP server that streams TGI- and OpenAI-format SSE, for testing the benchmark.

It generates `max_new_tokens` / `max_tokens` tokens (" w0", " w1", ...) with configurable delays,
reports usage (or not), can fail (HTTP errors, error events, cut streams) and counts what it
generated, so tests can check the benchmark's numbers against the server's own. It runs under
uvicorn in a background thread on a free 127.0.0.1 port.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse


@dataclass
class FakeServerConfig:
    first_token_delay_s: float = 0.0
    token_delay_s: float = 0.001
    delay_per_inflight_s: float = 0.0  # extra delay per token for every request in flight
    report_usage: bool = True  # TGI `details`, OpenAI `usage`
    error_mode: str | None = None  # None | "http" | "event" | "truncate"
    fail_every: int = 1  # with an error_mode: every Nth request fails
    error_after_tokens: int = 0
    max_tokens_cap: int | None = None  # stop early (like EOS)
    role_preamble: bool = False  # vLLM style: a role-only first chunk, no role in later ones
    empty_first_token: bool = False  # the first token decodes to "" (a held-back partial char)


@dataclass
class FakeServerStats:
    num_requests: int = 0
    num_generated_tokens: int = 0  # tokens of requests that completed without an error
    num_inflight: int = 0
    max_inflight: int = 0
    payloads: list[dict] = field(default_factory=list)


class FakeServer:
    def __init__(self) -> None:
        self.config = FakeServerConfig()
        self.stats = FakeServerStats()
        self.app = _build_app(self)
        self.url = ""
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def reset(self, **config) -> None:
        self.config = FakeServerConfig(**config)
        self.stats = FakeServerStats()

    def start(self) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off", ws="none")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]})
        self._thread.daemon = True
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake server did not start within 10 s")
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        return self.url

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)

    # --- generation -------------------------------------------------------------------------

    def begin(self, payload: dict) -> tuple[int, bool]:
        """Count a new request; returns (its number, whether it must fail)."""
        self.stats.num_requests += 1
        self.stats.payloads.append(payload)
        number = self.stats.num_requests
        fails = self.config.error_mode is not None and number % self.config.fail_every == 0
        return number, fails

    async def tokens(self, max_new_tokens: int, fails: bool):
        """Yields token indices with the configured delays; ends early on an injected error."""
        config = self.config
        num_tokens = min(max_new_tokens, config.max_tokens_cap or max_new_tokens)
        self.stats.num_inflight += 1
        self.stats.max_inflight = max(self.stats.max_inflight, self.stats.num_inflight)
        try:
            await asyncio.sleep(config.first_token_delay_s)
            for i in range(num_tokens):
                if fails and i == config.error_after_tokens:
                    return
                extra = config.delay_per_inflight_s * (self.stats.num_inflight - 1)
                await asyncio.sleep(config.token_delay_s + extra)
                if i == num_tokens - 1 and not fails:  # counted before the client can see the end
                    self.stats.num_generated_tokens += num_tokens
                yield i
        finally:
            self.stats.num_inflight -= 1


def _sse(obj: dict | str, space: bool) -> str:
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data:{' ' if space else ''}{data}\n\n"


def _build_app(server: FakeServer) -> FastAPI:
    app = FastAPI()

    def stream(events) -> StreamingResponse:
        return StreamingResponse(events, media_type="text/event-stream")

    def http_error() -> JSONResponse:
        return JSONResponse({"error": "Model is overloaded", "error_type": "overloaded"}, 503)

    @app.get("/info")
    async def info():
        return {"model_id": "fake/model", "max_total_tokens": 4096, "router": "fake"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "fake/model", "object": "model"}]}

    @app.post("/generate_stream")
    async def generate_stream(request: Request):
        payload = await request.json()
        _, fails = server.begin(payload)
        if fails and server.config.error_mode == "http":
            return http_error()
        max_new_tokens = payload["parameters"]["max_new_tokens"]
        return stream(_tgi_events(server, payload, max_new_tokens, fails))

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        payload = await request.json()
        _, fails = server.begin(payload)
        if fails and server.config.error_mode == "http":
            return http_error()
        return stream(_openai_events(server, payload, fails, chat=True))

    @app.post("/v1/completions")
    async def completions(request: Request):
        payload = await request.json()
        _, fails = server.begin(payload)
        if fails and server.config.error_mode == "http":
            return http_error()
        return stream(_openai_events(server, payload, fails, chat=False))

    return app


async def _tgi_events(server: FakeServer, payload: dict, max_new_tokens: int, fails: bool):
    text = ""
    num_tokens = min(max_new_tokens, server.config.max_tokens_cap or max_new_tokens)
    async for i in server.tokens(max_new_tokens, fails):
        text += f" w{i}"
        last = i == num_tokens - 1
        details = {
            "finish_reason": "length",
            "generated_tokens": num_tokens,
            "seed": None,
            "input_length": len(payload["inputs"].split()),
        }
        token = {"id": i, "text": f" w{i}", "logprob": -0.5, "special": False}
        yield _sse(
            {
                "index": i + 1,
                "token": token,
                "generated_text": text if last else None,
                "details": details if last and server.config.report_usage else None,
            },
            space=False,
        )
    if fails and server.config.error_mode == "event":
        yield _sse(
            {"error": "Request failed during generation: boom", "error_type": "generation"}, False
        )


async def _openai_events(server: FakeServer, payload: dict, fails: bool, chat: bool):
    max_tokens = payload["max_tokens"]
    num_tokens = min(max_tokens, server.config.max_tokens_cap or max_tokens)
    vllm_style = chat and server.config.role_preamble
    if vllm_style:
        yield _sse(_chunk(chat, "", None, role=True), space=True)
    async for i in server.tokens(max_tokens, fails):
        finish = "length" if i == num_tokens - 1 else None
        text = "" if i == 0 and server.config.empty_first_token else f" w{i}"
        yield _sse(_chunk(chat, text, finish, role=chat and not vllm_style), space=True)
    if fails:
        if server.config.error_mode == "event":
            error = {"message": "Input validation error: boom", "http_status_code": 422}
            yield _sse({"error": error}, space=True)
            yield _sse("[DONE]", space=True)
        return
    wants_usage = (payload.get("stream_options") or {}).get("include_usage")
    if wants_usage and server.config.report_usage:
        prompt_tokens = len(str(payload.get("prompt") or payload.get("messages")).split())
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": num_tokens}
        usage["total_tokens"] = prompt_tokens + num_tokens
        yield _sse({"object": "chunk", "choices": [], "usage": usage}, space=True)
    yield _sse("[DONE]", space=True)


def _chunk(chat: bool, text: str, finish: str | None, role: bool) -> dict:
    if chat:
        delta = {"role": "assistant", "content": text} if role else {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"object": "chat.completion.chunk", "choices": [choice], "usage": None}
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return {"object": "text_completion", "choices": [choice]}
