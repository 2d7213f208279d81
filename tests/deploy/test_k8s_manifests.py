"""deploy/k8s: the core objects validate offline against the Kubernetes schemas
(kubernetes-validate, strict: unknown fields fail); the PodMonitor (a prometheus-operator CRD,
whose schema that package does not carry) and the prometheus-adapter rule are checked field by
field; the container's args parse with pytgi's own launcher flags and the grace period covers the
drain."""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import pytest
import yaml

from pytgi.cli.flags import SERVE_FLAGS, add_flags

kubernetes_validate = pytest.importorskip("kubernetes_validate")

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
KUBERNETES_VERSION = "1.37.0"
CORE = ["deployment.yaml", "service.yaml", "hpa.yaml"]
LABELS = {"app.kubernetes.io/name": "pytgi"}


def load(name: str) -> dict:
    return yaml.safe_load((K8S / name).read_text())


def container() -> dict:
    [c] = load("deployment.yaml")["spec"]["template"]["spec"]["containers"]
    return c


@pytest.mark.parametrize("name", CORE)
def test_core_objects_match_the_kubernetes_schema(name):
    kubernetes_validate.validate(load(name), KUBERNETES_VERSION, strict=True)


def test_the_schema_check_can_fail():
    broken = copy.deepcopy(load("deployment.yaml"))
    broken["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "soon"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)
    typo = copy.deepcopy(load("service.yaml"))
    typo["spec"]["portz"] = typo["spec"].pop("ports")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, KUBERNETES_VERSION, strict=True)


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_flags(parser, SERVE_FLAGS)
    return parser.parse_args(container()["args"])  # exits on an unknown flag


def test_probes_and_grace_period():
    c = container()
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    assert c["ports"] == [{"name": "http", "containerPort": 80, "protocol": "TCP"}]
    grace = load("deployment.yaml")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    drain = _args().graceful_termination_timeout
    assert drain < grace <= drain + 10  # the drain ends before the kubelet's SIGKILL
    assert {"name": "data", "mountPath": "/data"} in c["volumeMounts"]  # HF_HOME in the image


def test_service_and_selectors_reach_the_pods():
    deployment = load("deployment.yaml")
    assert deployment["spec"]["selector"]["matchLabels"] == LABELS
    assert deployment["spec"]["template"]["metadata"]["labels"] == LABELS
    service = load("service.yaml")
    assert service["spec"]["selector"] == LABELS
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def test_pod_monitor_scrapes_metrics():
    monitor = load("podmonitor.yaml")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["kind"] == "PodMonitor"
    assert monitor["spec"]["selector"] == {"matchLabels": LABELS}
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"
    assert set(monitor["spec"]) <= {"selector", "podMetricsEndpoints", "namespaceSelector"}


def test_hpa_scales_the_deployment_on_the_queue_metric_the_adapter_serves():
    hpa = load("hpa.yaml")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": load("deployment.yaml")["metadata"]["name"],
    }
    [metric] = hpa["spec"]["metrics"]
    name = metric["pods"]["metric"]["name"]
    assert metric["type"] == "Pods" and name == "tgi_queue_size"
    [rule] = load("prometheus-adapter-values.yaml")["rules"]["custom"]
    assert rule["name"]["as"] == name and name in rule["seriesQuery"]
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}


def test_the_queue_metric_is_one_pytgi_exports():
    from pytgi import metrics

    assert "tgi_queue_size" in metrics.render().decode()
