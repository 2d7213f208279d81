"""`pytgi.deploy.ray_serve`'s arguments (`serve run ... key=value`): parsed, refused in one line
when wrong, and turned into Ray Serve's deployment options (fixed replicas, or autoscaling on
queue depth). No cluster: tests/deploy/test_ray_serve.py (marker `ray`) runs one."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.serve", reason="needs the ray extra: pip install .[ray]")

from pytgi.deploy.ray_serve import RayServeConfig, build_app  # noqa: E402


def test_fixed_replicas_by_default():
    config = RayServeConfig.from_args({"num_replicas": "2", "serve_args": "--model-id 'a b'"})
    assert config.serve_args == ("--model-id", "a b")
    options = config.deployment_options()
    assert options["num_replicas"] == 2 and "autoscaling_config" not in options
    assert options["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 0.0}


def test_autoscaling_on_queue_depth():
    args = {"num_replicas": "1", "max_replicas": "4", "target_queue_depth": "8"}
    options = RayServeConfig.from_args(args).deployment_options()
    assert "num_replicas" not in options
    assert options["autoscaling_config"] == {
        "min_replicas": 1, "initial_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 8.0
    }  # fmt: skip


@pytest.mark.parametrize(
    "args, message",
    [
        ({"replicas": "2"}, "unknown argument(s) replicas"),
        ({"serve_args": "--port 80"}, "may not set --port"),
        ({"serve_args": "--hostname=0.0.0.0"}, "may not set --hostname=0.0.0.0"),
        ({"num_replicas": "3", "max_replicas": "2"}, "num_replicas <= max_replicas"),
        ({"num_replicas": "0"}, "1 <= num_replicas"),
    ],
)
def test_bad_arguments_are_refused(args, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_app(args)


def test_build_app_binds_the_replica():
    from ray.serve import Application

    assert isinstance(build_app({"num_replicas": "2"}), Application)
