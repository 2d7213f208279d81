"""OpenTelemetry tracing (TGI's `--otlp-endpoint`, `--otlp-service-name`): a span per HTTP request,
named after TGI's handler (`generate`, `generate_stream`, `chat_completions`, ...), continuing the
client's W3C `traceparent` when it sends one, with the phases of a generation as child spans
(`validate`, `queued`, `infer`) and TGI's timing fields as attributes. Spans are batched and
exported with OTLP over gRPC, as TGI's router exports them.

Off unless `setup()` ran: then every function here is a no-op and OpenTelemetry is not imported
(it is the optional extra `pytgi[otlp]`). Only the API process traces; the engine has no spans.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

from pytgi.errors import ConfigError

logger = logging.getLogger(__name__)

EXPORT_TIMEOUT_S = 5  # per export: an unreachable collector must not hold up a shutdown for long
_provider = None  # the SDK's TracerProvider once setup() ran
_tracer = None

# TGI's handler names (its spans are named after the instrumented router functions)
SPAN_NAMES = {
    "/": "compat_generate",
    "/generate": "generate",
    "/generate_stream": "generate_stream",
    "/v1/chat/completions": "chat_completions",
    "/v1/completions": "completions",
    "/chat_tokenize": "get_chat_tokenize",
    "/tokenize": "tokenize",
    "/invocations": "sagemaker_compatibility",
    "/vertex": "vertex_compatibility",
    "/health": "health",
    "/info": "get_model_info",
}


def setup(endpoint: str, service_name: str) -> None:
    """Export spans to the OTLP/gRPC collector at `endpoint` (e.g. http://localhost:4317)."""
    global _provider, _tracer
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise ConfigError(
            "--otlp-endpoint needs the OpenTelemetry exporter: pip install 'pytgi[otlp]'"
        ) from None
    insecure = not endpoint.startswith("https://")
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    exporter = OTLPSpanExporter(endpoint=endpoint, insecure=insecure, timeout=EXPORT_TIMEOUT_S)
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
    _provider, _tracer = provider, provider.get_tracer("pytgi")
    logger.info("Exporting OpenTelemetry spans to %s as %s", endpoint, service_name)


def shutdown() -> None:
    """Export what is left (at most a few seconds) and stop."""
    global _provider, _tracer
    if _provider is not None:
        _provider.shutdown()
    _provider = _tracer = None


def enabled() -> bool:
    return _tracer is not None


@contextlib.contextmanager
def request_span(method: str, path: str, headers: Mapping[str, str]) -> Iterator[Any]:
    """The span of one HTTP request (current for everything the request runs), child of the
    client's `traceparent` if any; yields it (None when tracing is off)."""
    if _tracer is None:
        yield None
        return
    from opentelemetry.propagate import extract
    from opentelemetry.trace import SpanKind

    name = SPAN_NAMES.get(path, path)
    attributes = {"http.request.method": method, "url.path": path}
    with _tracer.start_as_current_span(
        name, context=extract(headers), kind=SpanKind.SERVER, attributes=attributes
    ) as span:
        yield span


def end_request_span(span: Any, status: int) -> None:
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_status(Status(StatusCode.ERROR))


def record_generation(timings, generated_tokens: int, seed: int | None = None) -> None:
    """After a generation finished: TGI's fields on the current request span, and its phases as
    child spans laid end to end back from now (validation, queue, inference)."""
    if _tracer is None:
        return
    from opentelemetry import trace

    span = trace.get_current_span()
    per_token = timings.per_token_s(generated_tokens)
    fields = {
        "total_time": f"{timings.total_s * 1000:.3f}ms",
        "validation_time": f"{timings.validation_s * 1000:.3f}ms",
        "queue_time": f"{timings.queue_s * 1000:.3f}ms",
        "inference_time": f"{timings.inference_s * 1000:.3f}ms",
        "time_per_token": f"{per_token * 1000:.3f}ms",
        "generated_tokens": generated_tokens,
    }
    if seed is not None:
        fields["seed"] = str(seed)
    span.set_attributes(fields)
    start = time.time_ns() - int(timings.total_s * 1e9)
    for name, seconds in (
        ("validate", timings.validation_s),
        ("queued", timings.queue_s),
        ("infer", timings.inference_s),
    ):
        end = start + int(seconds * 1e9)
        _tracer.start_span(name, start_time=start).end(end_time=end)
        start = end
