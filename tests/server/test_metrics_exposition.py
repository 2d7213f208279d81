"""`pytgi.metrics`: every TGI metric registered at import, TGI's exact names in the exposition."""

from __future__ import annotations

import re

import httpx
import pytest
from server.fakes import CACHE_INFO, FakeEngine
from server.harness import asgi_client, scripted_app

from pytgi import metrics
from pytgi.engine.client import EngineStats
from pytgi.server.app import create_metrics_app

TGI_METRICS = {
    "tgi_request_count": "counter",
    "tgi_request_success": "counter",
    "tgi_request_failure": "counter",
    "tgi_request_duration": "histogram",
    "tgi_request_validation_duration": "histogram",
    "tgi_request_queue_duration": "histogram",
    "tgi_request_inference_duration": "histogram",
    "tgi_request_mean_time_per_token_duration": "histogram",
    "tgi_request_generated_tokens": "histogram",
    "tgi_request_input_length": "histogram",
    "tgi_request_max_new_tokens": "histogram",
    "tgi_request_skipped_tokens": "summary",
    "tgi_queue_size": "gauge",
    "tgi_batch_current_size": "gauge",
    "tgi_batch_current_max_tokens": "gauge",
    "tgi_batch_max_total_tokens": "gauge",
    "tgi_batch_next_size": "histogram",
    "tgi_batch_concat": "counter",
    "tgi_batch_inference_count": "counter",
    "tgi_batch_inference_success": "counter",
    "tgi_batch_inference_failure": "counter",
    "tgi_batch_inference_duration": "histogram",
    "tgi_batch_forward_duration": "histogram",
    "tgi_batch_decode_duration": "histogram",
    "tgi_batch_filter_duration": "histogram",
    "tgi_batch_concat_duration": "histogram",
    "pytgi_kv_cache_usage_ratio": "gauge",
    "pytgi_kv_blocks_total": "gauge",
    "pytgi_kv_blocks_free": "gauge",
    "pytgi_prefix_cache_hit_rate": "gauge",
    "pytgi_prefix_cache_hit_tokens": "counter",
    "pytgi_prefix_cache_queried_tokens": "counter",
    "pytgi_preemptions": "counter",
    "pytgi_aborted_requests": "counter",
}


def _types(text: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.M))


def test_every_metric_is_a_module_attribute_and_exposed_with_its_type():
    types = _types(metrics.render().decode())
    for name, kind in TGI_METRICS.items():
        assert hasattr(metrics, name), name
        assert types.get(name) == kind, name


def test_counters_keep_tgi_names_without_total_or_created():
    metrics.tgi_request_success.inc()
    metrics.tgi_request_failure.labels(err="validation").inc()
    text = metrics.render().decode()
    assert re.search(r"^tgi_request_success \d", text, flags=re.M)
    assert re.search(r'^tgi_request_failure\{err="validation"\} \d', text, flags=re.M)
    counters = {name for name, kind in _types(text).items() if kind == "counter"}
    samples = {re.split(r"[{ ]", line)[0] for line in text.splitlines() if line[:1] != "#"}
    assert not {f"{name}_total" for name in counters} & samples
    assert "_created" not in text


def test_duration_buckets_are_tgi_geometric_series():
    assert len(metrics.DURATION_BUCKETS) == 35
    assert metrics.DURATION_BUCKETS[0] == pytest.approx(0.00015)
    assert metrics.DURATION_BUCKETS[-1] == pytest.approx(0.0001 * 1.5**35)


def test_configure_sizes_token_histograms_from_limits():
    metrics.configure(max_input_tokens=200, max_total_tokens=400)
    metrics.tgi_request_input_length.observe(7)
    text = metrics.render().decode()
    assert 'tgi_request_input_length_bucket{le="200.0"} ' in text
    assert 'tgi_request_generated_tokens_bucket{le="400.0"} ' in text
    assert text.count("# TYPE tgi_request_input_length histogram") == 1


def test_refresh_copies_engine_stats():
    stats = EngineStats(
        num_running=3,
        num_waiting=2,
        num_kv_blocks=10,
        num_free_kv_blocks=4,
        prefix_cache_queried_tokens=100,
        prefix_cache_hit_tokens=25,
        num_preemptions=1,
        num_aborts=6,
    )
    metrics.refresh(stats, max_batch_total_tokens=160)
    text = metrics.render().decode()
    for line in (
        "tgi_queue_size 2.0",
        "tgi_batch_current_size 3.0",
        "tgi_batch_max_total_tokens 160.0",
        "pytgi_kv_cache_usage_ratio 0.6",
        "pytgi_kv_blocks_free 4.0",
        "pytgi_prefix_cache_hit_rate 0.25",
        "pytgi_preemptions 1.0",
        "pytgi_aborted_requests 6.0",
    ):
        assert line in text.splitlines(), line


@pytest.mark.anyio
async def test_metrics_route_before_any_request():
    async with asgi_client(scripted_app()) as client:
        response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    types = _types(response.text)
    assert set(TGI_METRICS) <= set(types)
    assert "pytgi_kv_blocks_total 64.0" in response.text.splitlines()


@pytest.mark.anyio
async def test_prometheus_port_app_answers_any_get_path():
    app = create_metrics_app(FakeEngine([5]), CACHE_INFO)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://m") as client:
        response = await client.get("/anything")
        refused = await client.post("/")
    assert response.status_code == 200
    assert "# TYPE tgi_request_count counter" in response.text
    assert refused.status_code == 405
