"""`HttpSender`: streams one request to a TGI- or OpenAI-compatible server and times it.

Every failure becomes `RequestResult.error` with a readable message (connection refused, an HTTP
status with the server's message, an error event, a stream cut short, a timeout), so a run
against a broken server ends with a summary instead of a traceback. It only ever talks to the
base URL it was given.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import httpx

from pytgi.benchmark.http.apis import OpenAIApi, StreamProtocolError, StreamState, TgiApi
from pytgi.benchmark.http.records import RequestResult, RequestSpec, StreamRecorder
from pytgi.benchmark.http.sse import SSEDecoder

CONNECT_TIMEOUT_S = 10.0


def normalize_base_url(url: str) -> str:
    """`http://host:8000/v1/` → `http://host:8000` (the routes carry their own `/v1`)."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class HttpSender:
    """A `RequestSender` over one pooled httpx client. Create it inside the running event loop."""

    def __init__(
        self,
        base_url: str,
        api: TgiApi | OpenAIApi,
        request_timeout_s: float,
        max_connections: int,
        api_key: str | None = None,
    ):
        self.base_url = normalize_base_url(base_url)
        self.api = api
        self.request_timeout_s = request_timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(
                request_timeout_s, connect=min(CONNECT_TIMEOUT_S, request_timeout_s)
            ),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
        )

    async def send(self, spec: RequestSpec) -> RequestResult:
        recorder = StreamRecorder(spec)
        state = StreamState()
        try:
            await asyncio.wait_for(self._stream(spec, recorder, state), self.request_timeout_s)
        except asyncio.TimeoutError:
            state.error = f"timed out after {self.request_timeout_s:g} s"
        except httpx.ConnectError as exc:
            state.error = f"cannot connect to {self.base_url}: {exc or type(exc).__name__}"
        except httpx.HTTPError as exc:
            state.error = f"{type(exc).__name__}: {exc or 'connection lost'}"
        except StreamProtocolError as exc:
            state.error = str(exc)
        return recorder.finish(state.error, state.server_output_tokens, state.server_prompt_tokens)

    async def _stream(
        self, spec: RequestSpec, recorder: StreamRecorder, state: StreamState
    ) -> None:
        payload = self.api.build_payload(spec)
        async with self._client.stream("POST", self.api.path, json=payload) as response:
            if response.status_code != 200:
                state.error = await _http_error(response)
                return
            decoder = SSEDecoder()
            async for line in response.aiter_lines():
                data = decoder.feed_line(line)
                if data is not None and self._read(data, recorder, state):
                    return
            data = decoder.flush()
            if data is not None and self._read(data, recorder, state):
                return
            if not state.finished:
                state.error = f"stream ended before {self.api.end_marker}"

    def _read(self, data: str, recorder: StreamRecorder, state: StreamState) -> bool:
        """Handles one event; returns whether the stream is over (error, `[DONE]`, TGI's last)."""
        if self.api.read_event(data, state):
            recorder.record_token_event()
        if state.retract_first_token:
            recorder.drop_first_token_event()
            state.retract_first_token = False
        return state.error is not None or state.ended

    async def aclose(self) -> None:
        await self._client.aclose()


async def _http_error(response: httpx.Response) -> str:
    body = (await response.aread()).decode("utf-8", errors="replace")
    message = body.strip()[:300]
    try:
        parsed = json.loads(body)
    except json.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict) and parsed.get("error") is not None:
        error = parsed["error"]
        message = error.get("message", str(error)) if isinstance(error, dict) else str(error)
    return f"HTTP {response.status_code}: {message or response.reason_phrase}"


async def discover_model_name(
    base_url: str, api_key: str | None = None, api: str = "chat"
) -> str | None:
    """The served model's id, or None: `GET /info` (TGI, pytgi) for the `tgi` API, else the first
    id of `GET /v1/models` (vLLM and llama.cpp expect it in the `model` field)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    path = "/info" if api == "tgi" else "/v1/models"
    try:
        async with httpx.AsyncClient(base_url=normalize_base_url(base_url), timeout=5.0) as client:
            body = (await client.get(path, headers=headers)).json()
    except (httpx.HTTPError, json.JSONDecodeError):
        return None
    if not isinstance(body, dict):
        return None
    if api == "tgi":
        model = body.get("model_id")
    else:
        models = body.get("data")
        model = models[0].get("id") if models and isinstance(models[0], dict) else None
    return model if isinstance(model, str) else None


@dataclass(frozen=True)
class ServerLimits:
    """A TGI-style server's per-request token limits, from `GET /info`."""

    max_input_tokens: int
    max_total_tokens: int


async def discover_server_limits(base_url: str, api_key: str | None = None) -> ServerLimits | None:
    """`max_input_tokens` / `max_total_tokens` from `GET /info` (TGI, pytgi); None elsewhere."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with httpx.AsyncClient(base_url=normalize_base_url(base_url), timeout=5.0) as client:
            body = (await client.get("/info", headers=headers)).json()
    except (httpx.HTTPError, httpx.InvalidURL, json.JSONDecodeError):
        return None
    if not isinstance(body, dict):
        return None
    max_input, max_total = body.get("max_input_tokens"), body.get("max_total_tokens")
    if not (isinstance(max_input, int) and isinstance(max_total, int) and 0 < max_input):
        return None
    return ServerLimits(max_input, max_total)
