"""pytgi on Ray Serve: N replicas of `pytgi serve` behind Ray Serve's HTTP proxy.

    serve run pytgi.deploy.ray_serve:build_app num_replicas=2 serve_args="--model-id org/name"

Each replica is a Ray actor that runs one `pytgi serve` process on a free local port and forwards
every HTTP request to it unchanged (any route: TGI's, OpenAI's, /metrics), streaming the answer
back as it comes, so SSE streams pass through. Ray Serve does the rest: it places the replicas
on the cluster's nodes, routes each request to a replica with room (`max_ongoing_requests`; the
others wait in Ray's queue, not on a replica), autoscales on that queue depth (Ray's ongoing
requests per replica, against `target_queue_depth`) when `max_replicas` is above `num_replicas`,
and replaces a replica whose actor dies or whose health check fails (the server exited or
`/health` is not 200). A replica that dies takes only its in-flight requests with it: Ray
answers those with an error; queued ones go to another replica.

Arguments (`key=value` after the import path, all optional):
  num_replicas        replicas to start (and the autoscaling minimum); default 1
  max_replicas        autoscaling maximum; default num_replicas (no autoscaling)
  target_queue_depth  ongoing requests per replica the autoscaler aims at; default 16
  max_ongoing_requests  requests one replica takes at a time; default 32
  num_cpus, num_gpus  Ray resources per replica; default 1 and 0
  serve_args          `pytgi serve` flags for every replica, as one shell-quoted string
                      (the replica sets --hostname, --port and --prometheus-port itself)
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx
from ray import serve
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import StreamingResponse

# set per hop (RFC 9110 §7.6.1) or recomputed by the next server: never forwarded
_HOP_HEADERS = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host",
     "content-length", "proxy-connection"}
)  # fmt: skip
_OWN_FLAGS = ("--hostname", "--port", "-p", "--prometheus-port")
REPLICA_HEADER = "x-pytgi-replica"  # which replica answered: "<actor pid>@<server port>"


@dataclass(frozen=True)
class RayServeConfig:
    num_replicas: int = 1
    max_replicas: int | None = None
    target_queue_depth: float = 16.0
    max_ongoing_requests: int = 32
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    serve_args: tuple[str, ...] = ()
    startup_timeout_s: float = 600.0

    @classmethod
    def from_args(cls, args: dict[str, str]) -> RayServeConfig:
        kinds = {"num_replicas": int, "max_replicas": int, "target_queue_depth": float,
                 "max_ongoing_requests": int, "num_cpus": float, "num_gpus": float,
                 "startup_timeout_s": float}  # fmt: skip
        unknown = sorted(set(args) - set(kinds) - {"serve_args"})
        if unknown:
            raise ValueError(f"unknown argument(s) {', '.join(unknown)}; known: {sorted(kinds)}")
        values = {key: kinds[key](value) for key, value in args.items() if key in kinds}
        serve_args = tuple(shlex.split(str(args.get("serve_args", ""))))
        own = [flag for flag in serve_args if flag.split("=")[0] in _OWN_FLAGS]
        if own:
            raise ValueError(f"serve_args may not set {', '.join(own)}: each replica sets it")
        config = cls(serve_args=serve_args, **values)
        most = config.max_replicas or config.num_replicas
        if not 1 <= config.num_replicas <= most:
            raise ValueError("need 1 <= num_replicas <= max_replicas")
        return config

    def deployment_options(self) -> dict:
        options = {
            "max_ongoing_requests": self.max_ongoing_requests,
            "ray_actor_options": {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus},
            "health_check_period_s": 5.0,
            "health_check_timeout_s": 10.0,
        }
        if self.max_replicas and self.max_replicas > self.num_replicas:
            options["autoscaling_config"] = {
                "min_replicas": self.num_replicas,
                "initial_replicas": self.num_replicas,
                "max_replicas": self.max_replicas,
                "target_ongoing_requests": self.target_queue_depth,
            }
        else:
            options["num_replicas"] = self.num_replicas
        return options


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PytgiReplica:
    """One `pytgi serve` process, started in the constructor; requests are forwarded to it."""

    def __init__(self, serve_args: tuple[str, ...], startup_timeout_s: float):
        port = _free_port()
        self._url = f"http://127.0.0.1:{port}"
        self.replica_id = f"{os.getpid()}@{port}"
        cmd = [sys.executable, "-m", "pytgi.deploy.replica_process", "serve", *serve_args,
               "--hostname", "127.0.0.1", "--port", str(port),
               "--prometheus-port", "0"]  # fmt: skip
        # stdin: the pipe whose closing (this actor gone) kills the server (replica_process)
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE)
        self._wait_ready(startup_timeout_s)
        self._client = httpx.AsyncClient(base_url=self._url, timeout=httpx.Timeout(None, connect=5))

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"pytgi serve exited with code {self._proc.returncode}")
            try:
                if httpx.get(f"{self._url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self._proc.kill()
        raise TimeoutError(f"pytgi serve not ready after {timeout_s:.0f}s")

    async def __call__(self, request: Request) -> StreamingResponse:
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS]
        upstream = self._client.build_request(
            request.method,
            request.url.path,
            params=request.url.query,
            headers=headers,
            content=await request.body(),
        )
        response = await self._client.send(upstream, stream=True)
        out = {k: v for k, v in response.headers.items() if k.lower() not in _HOP_HEADERS}
        out[REPLICA_HEADER] = self.replica_id
        return StreamingResponse(
            response.aiter_raw(),
            status_code=response.status_code,
            headers=out,
            background=BackgroundTask(response.aclose),
        )

    async def check_health(self) -> None:
        """Ray Serve calls this every `health_check_period_s`; raising gets the replica replaced."""
        if self._proc.poll() is not None:
            raise RuntimeError(f"pytgi serve exited with code {self._proc.returncode}")
        status = (await self._client.get("/health", timeout=5.0)).status_code
        if status != 200:
            raise RuntimeError(f"pytgi serve /health answered {status}")

    def __del__(self) -> None:
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            proc.terminate()  # SIGTERM: the server drains its in-flight requests
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def build_app(args: dict[str, str]) -> serve.Application:
    """Ray Serve's application builder (`serve run pytgi.deploy.ray_serve:build_app k=v ...`)."""
    config = RayServeConfig.from_args(args)
    deployment = serve.deployment(PytgiReplica, name="pytgi", **config.deployment_options())
    return deployment.bind(config.serve_args, config.startup_timeout_s)
