"""TGI's per-request Prometheus metrics, recorded where TGI records them: in the generate core.

`observe()` wraps one generate / generate_stream call: it counts the request, labels a failure by
its error type (TGI's `err` label) and, on success, records durations and token counts and logs
one line with them, as TGI does (failures are logged by the server, which knows their status).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from pytgi import metrics
from pytgi.errors import (
    GenerationError,
    IncompleteGenerationError,
    OverloadedError,
    PytgiError,
    ValidationError,
)
from pytgi.router.outputs import Timings
from pytgi.utils import tracing

logger = logging.getLogger("pytgi.router")

_FAILURE_LABELS: tuple[tuple[type[PytgiError], str], ...] = (
    (ValidationError, "validation"),
    (OverloadedError, "overloaded"),
    (IncompleteGenerationError, "incomplete"),
    (GenerationError, "generation"),
)


@contextmanager
def observe() -> Iterator[None]:
    metrics.tgi_request_count.inc()
    try:
        yield
    except PytgiError as exc:
        label = next((lbl for cls, lbl in _FAILURE_LABELS if isinstance(exc, cls)), "generation")
        metrics.tgi_request_failure.labels(err=label).inc()
        raise


def record_validated(input_length: int, max_new_tokens: int) -> None:
    metrics.tgi_request_input_length.observe(input_length)
    metrics.tgi_request_max_new_tokens.observe(max_new_tokens)


def record_success(timings: Timings, generated_tokens: int, *, prompt_tokens: int) -> None:
    logger.info(
        "Success: %d prompt + %d generated tokens in %.3fs (validation %.3fs, queue %.3fs, "
        "inference %.3fs, %.1f ms/token)",
        prompt_tokens, generated_tokens, timings.total_s, timings.validation_s, timings.queue_s,
        timings.inference_s, 1000 * timings.per_token_s(generated_tokens),
    )  # fmt: skip
    metrics.tgi_request_success.inc()
    tracing.record_generation(timings, generated_tokens)
    metrics.tgi_request_duration.observe(timings.total_s)
    metrics.tgi_request_validation_duration.observe(timings.validation_s)
    metrics.tgi_request_queue_duration.observe(timings.queue_s)
    metrics.tgi_request_inference_duration.observe(timings.inference_s)
    metrics.tgi_request_generated_tokens.observe(generated_tokens)
    if generated_tokens:
        per_token = timings.inference_s / generated_tokens
        metrics.tgi_request_mean_time_per_token_duration.observe(per_token)


def record_extra_tokens(num_tokens: int) -> None:
    """A step that gave a request several tokens (accepted speculative drafts)."""
    metrics.tgi_request_skipped_tokens.observe(num_tokens - 1)
