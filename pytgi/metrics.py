"""Prometheus metrics with TGI's names, types and buckets (TGI_COMPATIBILITY.md §12), plus
pytgi's own.

Every metric is created at import in the dedicated `REGISTRY` and exposed as a module attribute
named exactly like the metric, so `/metrics` lists all of them before the first request. Record
from other packages through the module (`metrics.tgi_request_count.inc()`,
`metrics.tgi_request_failure.labels(err="validation").inc()`), never with
`from pytgi.metrics import <name>`: `configure()` rebuilds the three token-count histograms once
the limits are known (TGI sizes their buckets from them).

`render()` writes the exposition as TGI's exporter does: counters keep their plain names (no
`_total`) and there are no `_created` samples. Engine-side values live in another process;
`refresh()` copies an `EngineStats` snapshot into the gauges and engine counters at scrape time.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from pytgi.engine.client import EngineStats

REGISTRY = CollectorRegistry(auto_describe=True)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# TGI: every `*duration` histogram uses 35 geometric buckets 0.0001 x 1.5^k, k = 1..35.
DURATION_BUCKETS = tuple(0.0001 * 1.5**k for k in range(1, 36))
BATCH_SIZE_BUCKETS = tuple(float(2**k) for k in range(11))  # 1 .. 1024
_DEFAULT_TOKEN_LIMIT = 4096  # until configure() is called with the real limits


def linear_buckets(upper: int, count: int = 100) -> tuple[float, ...]:
    """TGI's token histograms: `count` evenly spaced buckets ending at `upper`."""
    upper = max(int(upper), 1)
    step = upper / count
    return tuple(sorted({round(step * (k + 1), 3) for k in range(count)}))


class EngineCounter(Collector):
    """A counter whose cumulative value is owned by the engine and copied in by `refresh`."""

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...] = ()):
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self._values: dict[tuple[str, ...], float] = {} if labelnames else {(): 0.0}
        REGISTRY.register(self)

    def set_total(self, value: float, **labels: str) -> None:
        key = tuple(labels[name] for name in self.labelnames)
        self._values[key] = float(value)

    def value(self, **labels: str) -> float:
        return self._values.get(tuple(labels[name] for name in self.labelnames), 0.0)

    def collect(self):
        metric = Metric(self.name, self.documentation, "counter")
        for key, value in sorted(self._values.items()):
            metric.add_sample(self.name, dict(zip(self.labelnames, key, strict=True)), value)
        yield metric

    def describe(self):
        yield Metric(self.name, self.documentation, "counter")


def _duration(name: str, doc: str, labelnames: tuple[str, ...] = ()) -> Histogram:
    return Histogram(name, doc, labelnames, registry=REGISTRY, buckets=DURATION_BUCKETS)


def _tokens(name: str, doc: str, upper: int) -> Histogram:
    return Histogram(name, doc, registry=REGISTRY, buckets=linear_buckets(upper))


# --- request lifecycle (recorded by router.Infer and the server routes) ---
tgi_request_count = Counter("tgi_request_count", "Requests received", registry=REGISTRY)
tgi_request_success = Counter("tgi_request_success", "Requests that ended well", registry=REGISTRY)
tgi_request_failure = Counter(
    "tgi_request_failure",
    "Failed requests (err: overloaded, validation, generation, incomplete, dropped, template)",
    ("err",),
    registry=REGISTRY,
)
tgi_request_duration = _duration("tgi_request_duration", "Request total duration (s)")
tgi_request_validation_duration = _duration(
    "tgi_request_validation_duration", "Arrival to queued (s)"
)
tgi_request_queue_duration = _duration("tgi_request_queue_duration", "Queued to batched (s)")
tgi_request_inference_duration = _duration("tgi_request_inference_duration", "Batched to end (s)")
tgi_request_mean_time_per_token_duration = _duration(
    "tgi_request_mean_time_per_token_duration", "Inference duration per generated token (s)"
)
tgi_request_generated_tokens = _tokens(
    "tgi_request_generated_tokens", "Generated tokens per request", _DEFAULT_TOKEN_LIMIT
)
tgi_request_input_length = _tokens(
    "tgi_request_input_length", "Prompt tokens per request", _DEFAULT_TOKEN_LIMIT
)
tgi_request_max_new_tokens = _tokens(
    "tgi_request_max_new_tokens", "max_new_tokens per request", _DEFAULT_TOKEN_LIMIT
)
tgi_request_skipped_tokens = Summary(
    "tgi_request_skipped_tokens", "Speculative extra tokens per step", registry=REGISTRY
)

# --- batching (engine side, copied in by refresh) ---
tgi_queue_size = Gauge("tgi_queue_size", "Requests waiting for a batch", registry=REGISTRY)
tgi_batch_current_size = Gauge("tgi_batch_current_size", "Running requests", registry=REGISTRY)
tgi_batch_current_max_tokens = Gauge(
    "tgi_batch_current_max_tokens", "Tokens run in the last engine step", registry=REGISTRY
)
tgi_batch_max_total_tokens = Gauge(
    "tgi_batch_max_total_tokens", "KV cache capacity in tokens", registry=REGISTRY
)
tgi_batch_next_size = Histogram(
    "tgi_batch_next_size", "Size of each new batch", registry=REGISTRY, buckets=BATCH_SIZE_BUCKETS
)
tgi_batch_concat = Counter(
    "tgi_batch_concat", "Batch concatenations", ("reason",), registry=REGISTRY
)
tgi_batch_inference_count = EngineCounter(
    "tgi_batch_inference_count", "Engine steps run", ("method",)
)
tgi_batch_inference_success = EngineCounter(
    "tgi_batch_inference_success", "Engine steps that succeeded", ("method",)
)
tgi_batch_inference_failure = EngineCounter(
    "tgi_batch_inference_failure", "Engine steps that failed", ("method",)
)
tgi_batch_inference_duration = _duration(
    "tgi_batch_inference_duration", "Batch inference duration (s)", ("method",)
)
tgi_batch_forward_duration = _duration(
    "tgi_batch_forward_duration", "Model forward duration (s)", ("method",)
)
tgi_batch_decode_duration = _duration(
    "tgi_batch_decode_duration", "Token decoding duration (s)", ("method",)
)
tgi_batch_filter_duration = _duration(
    "tgi_batch_filter_duration", "Batch filtering duration (s)", ("method",)
)
tgi_batch_concat_duration = _duration(
    "tgi_batch_concat_duration", "Batch concatenation duration (s)", ("method",)
)

# --- pytgi's own engine metrics ---
pytgi_kv_cache_usage_ratio = Gauge(
    "pytgi_kv_cache_usage_ratio", "Fraction of KV blocks in use", registry=REGISTRY
)
pytgi_kv_blocks_total = Gauge("pytgi_kv_blocks_total", "KV cache blocks", registry=REGISTRY)
pytgi_kv_blocks_free = Gauge("pytgi_kv_blocks_free", "Free KV cache blocks", registry=REGISTRY)
pytgi_prefix_cache_hit_rate = Gauge(
    "pytgi_prefix_cache_hit_rate", "Prompt tokens served from the prefix cache", registry=REGISTRY
)
pytgi_prefix_cache_queried_tokens = EngineCounter(
    "pytgi_prefix_cache_queried_tokens", "Prompt tokens looked up in the prefix cache"
)
pytgi_prefix_cache_hit_tokens = EngineCounter(
    "pytgi_prefix_cache_hit_tokens", "Prompt tokens found in the prefix cache"
)
pytgi_preemptions = EngineCounter("pytgi_preemptions", "Requests preempted to free KV blocks")
pytgi_speculative_draft_tokens = EngineCounter(
    "pytgi_speculative_draft_tokens", "Draft tokens verified (--speculate)"
)
pytgi_speculative_accepted_tokens = EngineCounter(
    "pytgi_speculative_accepted_tokens", "Draft tokens the target model accepted"
)
pytgi_speculative_acceptance_rate = Gauge(
    "pytgi_speculative_acceptance_rate", "Accepted / verified draft tokens", registry=REGISTRY
)
pytgi_speculative_tokens_per_step = Gauge(
    "pytgi_speculative_tokens_per_step",
    "Tokens a request gained per step that verified drafts (1 + accepted drafts)",
    registry=REGISTRY,
)
pytgi_speculation_steps = EngineCounter(
    "pytgi_speculation_steps",
    "Steps with running requests where the speculation policy verified drafts (decision="
    "drafted) or decoded without them (decision=skipped)",
    ("decision",),
)
pytgi_aborted_requests = EngineCounter("pytgi_aborted_requests", "Requests aborted in the engine")
pytgi_engine_forward_time = EngineCounter(
    "pytgi_engine_forward_time", "Cumulative seconds spent in model forward passes"
)

_TOKEN_HISTOGRAMS = {
    "tgi_request_input_length": ("Prompt tokens per request", "max_input_tokens"),
    "tgi_request_generated_tokens": ("Generated tokens per request", "max_total_tokens"),
    "tgi_request_max_new_tokens": ("max_new_tokens per request", "max_total_tokens"),
}
_token_limits = dict.fromkeys(_TOKEN_HISTOGRAMS, _DEFAULT_TOKEN_LIMIT)


def configure(max_input_tokens: int, max_total_tokens: int) -> None:
    """Size the token histograms' buckets from the limits, as TGI does (call once at start-up)."""
    limits = {"max_input_tokens": max_input_tokens, "max_total_tokens": max_total_tokens}
    for name, (doc, limit) in _TOKEN_HISTOGRAMS.items():
        if _token_limits.get(name) == limits[limit]:
            continue
        REGISTRY.unregister(globals()[name])
        globals()[name] = _tokens(name, doc, limits[limit])
        _token_limits[name] = limits[limit]


def refresh(stats: EngineStats, max_batch_total_tokens: int | None = None) -> None:
    """Copy an engine snapshot into the engine-side metrics (called at scrape time)."""
    tgi_queue_size.set(stats.num_waiting)
    tgi_batch_current_size.set(stats.num_running)
    tgi_batch_current_max_tokens.set(stats.num_batch_tokens)
    if max_batch_total_tokens is not None:
        tgi_batch_max_total_tokens.set(max_batch_total_tokens)
    tgi_batch_inference_count.set_total(stats.num_steps, method="decode")
    tgi_batch_inference_success.set_total(stats.num_steps, method="decode")
    pytgi_kv_blocks_total.set(stats.num_kv_blocks)
    pytgi_kv_blocks_free.set(stats.num_free_kv_blocks)
    pytgi_kv_cache_usage_ratio.set(stats.kv_cache_usage)
    queried, hit = stats.prefix_cache_queried_tokens, stats.prefix_cache_hit_tokens
    pytgi_prefix_cache_queried_tokens.set_total(queried)
    pytgi_prefix_cache_hit_tokens.set_total(hit)
    pytgi_prefix_cache_hit_rate.set(hit / queried if queried else 0.0)
    pytgi_preemptions.set_total(stats.num_preemptions)
    drafts, accepted = stats.num_draft_tokens, stats.num_accepted_draft_tokens
    pytgi_speculative_draft_tokens.set_total(drafts)
    pytgi_speculative_accepted_tokens.set_total(accepted)
    pytgi_speculative_acceptance_rate.set(accepted / drafts if drafts else 0.0)
    steps = stats.num_draft_steps
    pytgi_speculative_tokens_per_step.set((steps + accepted) / steps if steps else 0.0)
    pytgi_speculation_steps.set_total(stats.num_speculation_steps_drafted, decision="drafted")
    pytgi_speculation_steps.set_total(stats.num_speculation_steps_skipped, decision="skipped")
    pytgi_aborted_requests.set_total(stats.num_aborts)
    pytgi_engine_forward_time.set_total(stats.forward_time_s)


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _sample_line(name: str, labels: dict[str, str], value: float) -> str:
    if labels:
        label_text = ",".join(f'{key}="{_escape(val)}"' for key, val in sorted(labels.items()))
        name = f"{name}{{{label_text}}}"
    return f"{name} {floatToGoString(value)}\n"


def _render_metric(metric: Metric) -> list[str]:
    kind = "untyped" if metric.type == "unknown" else metric.type
    doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
    lines = [f"# HELP {metric.name} {doc}\n", f"# TYPE {metric.name} {kind}\n"]
    for sample in metric.samples:
        if sample.name.endswith("_created"):
            continue
        name = metric.name if sample.name == metric.name + "_total" else sample.name
        lines.append(_sample_line(name, sample.labels, sample.value))
    return lines


def render(registry: CollectorRegistry = REGISTRY) -> bytes:
    """The Prometheus text exposition with TGI's exact metric names."""
    lines: list[str] = []
    for metric in registry.collect():
        lines.extend(_render_metric(metric))
    return "".join(lines).encode("utf-8")
