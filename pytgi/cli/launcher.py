"""`pytgi serve` / `text-generation-launcher`: resolve the model, start the engine process, wait for
its warm-up, then open the HTTP port. Supervises the engine (its death, or the death of one of its
tensor-parallel ranks, ends the server with exit code 1 and the reason as the last line) and drains
in-flight requests on SIGTERM for up to `--graceful-termination-timeout` seconds (exit code 0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

from pytgi import envs
from pytgi.cli import configs, preflight, startup_notes
from pytgi.errors import ConfigError, ModelLoadError
from pytgi.utils import tracing

logger = logging.getLogger("pytgi.launcher")


def serve(args: argparse.Namespace) -> int:
    from pytgi.utils.logging import setup_logging

    setup_logging(json_output=args.json_output)
    if args.env:
        from pytgi.cli.runtime_env import describe_environment

        logger.info("Runtime environment:\n%s", describe_environment())
    try:
        sock = preflight.bind_port(configs.hostname(args.hostname), args.port)
        if args.otlp_endpoint:
            tracing.setup(args.otlp_endpoint, args.otlp_service_name)
    except ConfigError as exc:
        logger.error("%s", exc.message)
        return 1
    with sock:
        try:
            return _serve_on(sock, args)
        finally:
            tracing.shutdown()  # the spans still batched are exported before the process ends


def _serve_on(sock, args: argparse.Namespace) -> int:
    try:
        engine, infer, server_cfg, plan = start_engine_and_router(args)
    except (ConfigError, ModelLoadError) as exc:
        logger.error("%s", exc.message)
        return 1
    from pytgi.server.app import create_app

    model_info = _model_info(server_cfg, args, plan, engine.cache_info.device)
    app = create_app(infer, engine, server_cfg, engine.cache_info, model_info=model_info)
    return asyncio.run(run_http(app, server_cfg, engine, sock))


def start_engine_and_router(args: argparse.Namespace):
    from pytgi.engine.multiproc_client import MultiprocEngineClient
    from pytgi.models.resolve import resolve_model, resolve_speculator
    from pytgi.router.infer import Infer
    from pytgi.runtime.build import build_engine_core
    from pytgi.tokenizer.tokenizer import Tokenizer

    model = configs.model_config(args)
    # a Medusa / MLP-speculator checkpoint: serve its base model, speculate with its heads
    model, args.speculate = resolve_speculator(model, args.speculate)
    if model.speculator is not None:
        logger.info(
            "Using speculation %s with %d input ids.", model.speculator.kind, args.speculate
        )
    engine_cfg = configs.engine_config(args, model)
    startup_notes.warn_waiting_flags(args)
    startup_notes.warn_slow_dtype(model.dtype, configs.expected_platform(engine_cfg.device))
    startup_notes.log_speculation(engine_cfg.scheduler.num_speculative_tokens)
    start = time.perf_counter()
    checks = dict(
        implementation=model.implementation,
        trust_remote_code=model.trust_remote_code,
        num_shard=engine_cfg.parallel.num_shard,
    )
    # config.json is checked before any weight is downloaded, the weight files once they are in
    check_config = partial(preflight.check_model_config, **checks)
    model_dir = resolve_model(model, check_config=check_config)
    logger.info(
        "Resolved %s to %s in %.2fs", model.model_id, model_dir, time.perf_counter() - start
    )
    plan = preflight.check_model_dir(
        model_dir, allow_pickle_weights=model.allow_pickle_weights, quantize=model.quantize,
        dtype=model.dtype, weights_dir=model.weights_dir, **checks,
    )  # fmt: skip
    platform = configs.expected_platform(engine_cfg.device)
    if plan.quantize == "gguf" and platform != "cpu":
        raise ConfigError(
            f"GGUF models run on pytgi's CPU kernels only, and the engine would run on {platform} "
            "(PYTGI_DEVICE=cpu serves them)"
        )
    configs.check_visible_gpus(engine_cfg.parallel.num_shard, platform)
    logger.info("Serving %s", plan.description)
    resolved = replace(model, model_id=str(model_dir), gguf_file=None)
    engine_cfg = replace(engine_cfg, model=resolved)
    tokenizer = Tokenizer.from_dir(model_dir, config_path=model.tokenizer_config_path)
    images = _image_pipeline(model_dir, tokenizer, configs.image_config(args))  # before the engine
    start = time.perf_counter()
    engine = MultiprocEngineClient.start(engine_cfg, build_engine_core, json_logs=args.json_output)
    cache = engine.cache_info
    logger.info(
        "Engine ready in %.2fs: %d KV blocks of %d tokens (%s cache), dtype %s on %s",
        time.perf_counter() - start, cache.num_blocks, cache.block_size, cache.kv_cache_dtype,
        cache.dtype, cache.device,
    )  # fmt: skip
    try:
        limits = configs.limits_config(args, cache, tokenizer.model_max_length)
    except ConfigError:
        engine.close()
        raise
    server_cfg = configs.server_config(args, limits, model.model_id, _model_sha(model_dir))
    infer = Infer(
        engine,
        tokenizer,
        limits,
        cache,
        enable_prefill_logprobs=args.enable_prefill_logprobs,
        disable_grammar_support=args.disable_grammar_support,
        engine_supports_grammar=cache.supports_grammar,
        grammar_config=engine_cfg.grammar,
        images=images,
    )
    return engine, infer, server_cfg, plan


def _image_pipeline(model_dir, tokenizer, image_config):
    """A vision-language model's image pipeline (None for a text model, whose markdown images
    stay text as in TGI). Only then does this process import transformers' image processors
    (and torch, which they import)."""
    from pytgi.models.config import read_model_type
    from pytgi.router.images.processors import is_vision_model_type

    if not is_vision_model_type(read_model_type(model_dir)):
        return None
    from pytgi.router.images.pipeline import ImagePipeline

    pipeline = ImagePipeline.for_model(model_dir, tokenizer.backend.token_to_id, image_config)
    logger.info("Multimodal model: images in prompts are processed by its image processor")
    return pipeline


async def run_http(app, server_cfg, engine, sock) -> int:
    """Serve until SIGTERM/SIGINT (drain, exit 0) or until the engine dies (exit 1)."""
    import uvicorn

    from pytgi.server.http_protocol import with_deadlines

    config = uvicorn.Config(
        app,
        host=server_cfg.hostname,
        port=server_cfg.port,
        log_config=None,
        timeout_graceful_shutdown=_FLUSH_S,  # the drain itself happens before (see _supervise)
        timeout_keep_alive=5,
        http=with_deadlines(server_cfg.request_header_timeout_s, server_cfg.request_body_timeout_s),
        limit_concurrency=server_cfg.max_connections,
    )
    server = _DrainingServer(config, app)
    drain_s = server_cfg.graceful_termination_timeout_s
    supervisor = asyncio.create_task(_supervise(server, app, engine, drain_s))
    metrics_task = _start_prometheus_port(server_cfg, engine)
    logger.info("Connected: listening on %s:%d", server_cfg.hostname, server_cfg.port)
    await server.serve(sockets=[sock])
    supervisor.cancel()
    if metrics_task is not None:
        metrics_task.cancel()
    engine_died = not engine.is_alive and not server.drained_by_signal
    await engine.shutdown()
    if engine_died:
        logger.error("Shard failed: %s", engine.death_reason)  # the last line: why it ended
        return 1
    logger.info("Shut down cleanly")
    return 0


_FLUSH_S = 2  # after the drain: time for uvicorn to finish responses before it cancels them
# after the engine died: how long /health answers 503 (and open streams get their error event)
# before the port closes, so that a probe polling every second sees the 503 and not only a refusal
_DEAD_GRACE_S = 2


class _DrainingServer:
    """uvicorn.Server that, on the first SIGTERM/SIGINT, only flips the health to draining: it
    keeps listening, so new connections get 503 (and `/health` says "draining") while in-flight
    requests finish; `_supervise` then stops it. A second signal stops it at once."""

    def __new__(cls, config, app):
        import uvicorn

        class Server(uvicorn.Server):
            drained_by_signal = False

            def handle_exit(self, sig, frame):
                if self.drained_by_signal:
                    self.should_exit = self.force_exit = True
                    return
                self.drained_by_signal = True
                app.state.health.set("draining")
                logger.info("Signal %s received: draining in-flight requests", sig)

        return Server(config)


async def _supervise(server, app, engine, drain_s: float) -> None:
    """Ends the server when the engine dies, or once a signal's drain is over."""
    health = app.state.health
    while not server.drained_by_signal:
        await asyncio.sleep(0.2)
        if not engine.is_alive:
            health.set("dead")
            logger.warning("The engine is gone: /health answers 503; shutting down")
            await asyncio.sleep(_DEAD_GRACE_S)
            server.should_exit = True
            return
    if not await health.wait_idle(drain_s):
        logger.warning(
            "Graceful termination timeout (%.0fs): stopping %d in-flight requests",
            drain_s, health.num_inflight,
        )  # fmt: skip
    server.should_exit = True


def _start_prometheus_port(server_cfg, engine) -> asyncio.Task | None:
    """TGI's extra Prometheus listener: the metrics on any GET path of `--prometheus-port` (9000
    by default, 0 = none). A port already taken is a warning, not a failed start: several servers
    can run on one host, each still serving `/metrics` on its main port."""
    if not server_cfg.prometheus_port:
        return None
    import uvicorn

    from pytgi.server.app import create_metrics_app

    try:
        sock = preflight.bind_port(server_cfg.hostname, server_cfg.prometheus_port)
    except ConfigError as exc:
        logger.warning("%s: no Prometheus port (/metrics is still on the main port)", exc.message)
        return None
    app = create_metrics_app(engine, engine.cache_info)
    config = uvicorn.Config(
        app, host=server_cfg.hostname, port=server_cfg.prometheus_port, log_config=None
    )
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # the main server owns the signals
    logger.info("Prometheus metrics on %s:%d", server_cfg.hostname, server_cfg.prometheus_port)
    return asyncio.create_task(_serve_closing(server, sock))


async def _serve_closing(server, sock) -> None:
    with sock:
        await server.serve(sockets=[sock])


def _model_sha(model_dir: Path) -> str | None:
    """Hub snapshots live in `snapshots/<commit sha>/`; a local directory has no sha."""
    if model_dir.parent.name == "snapshots" and len(model_dir.name) == 40:
        return model_dir.name
    return None


def _model_info(server_cfg, args: argparse.Namespace, plan, device: str) -> dict:
    num_shard = configs.num_shard(args)
    return {
        "model_id": server_cfg.model_id,
        "model_sha": server_cfg.model_sha,
        "validation_workers": args.validation_workers,
        "compute_type": envs.compute_type() or f"{num_shard}-{device}",
        "model_architecture": plan.architecture,
        "model_implementation": plan.implementation,
        "quantize": plan.quantize,
        "weight_types": plan.weight_types,
        "speculate": args.speculate or None,
    }
