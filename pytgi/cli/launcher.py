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
from pathlib import Path

from pytgi import envs
from pytgi.cli import configs
from pytgi.errors import ConfigError, ModelLoadError

logger = logging.getLogger("pytgi.launcher")


def serve(args: argparse.Namespace) -> int:
    from pytgi.utils.logging import setup_logging

    setup_logging(json_output=args.json_output)
    envs.set_default_threading_env()
    try:
        engine, infer, server_cfg = start_engine_and_router(args)
    except (ConfigError, ModelLoadError) as exc:
        logger.error("%s", exc.message)
        return 1
    from pytgi.server.app import create_app

    model_info = _model_info(server_cfg, args)
    app = create_app(infer, engine, server_cfg, engine.cache_info, model_info=model_info)
    return asyncio.run(run_http(app, server_cfg, engine))


def start_engine_and_router(args: argparse.Namespace):
    from pytgi.engine.multiproc_client import MultiprocEngineClient
    from pytgi.router.infer import Infer
    from pytgi.tokenizer.tokenizer import Tokenizer
    from pytgi.utils.hub import resolve_model_dir

    model = configs.model_config(args)
    engine_cfg = configs.engine_config(args, model)
    start = time.perf_counter()
    model_dir = resolve_model_dir(model)
    logger.info(
        "Resolved %s to %s in %.2fs", model.model_id, model_dir, time.perf_counter() - start
    )
    engine_cfg = replace(engine_cfg, model=replace(model, model_id=str(model_dir)))
    tokenizer = Tokenizer.from_dir(model_dir, config_path=model.tokenizer_config_path)
    start = time.perf_counter()
    engine = MultiprocEngineClient.start(engine_cfg, json_logs=args.json_output)
    cache = engine.cache_info
    logger.info(
        "Engine ready in %.2fs: %d KV blocks of %d tokens, dtype %s on %s",
        time.perf_counter() - start, cache.num_blocks, cache.block_size, cache.dtype, cache.device,
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
    )
    return engine, infer, server_cfg


async def run_http(app, server_cfg, engine) -> int:
    """Serve until SIGTERM/SIGINT (drain, exit 0) or until the engine dies (exit 1)."""
    import uvicorn

    config = uvicorn.Config(
        app,
        host=server_cfg.hostname,
        port=server_cfg.port,
        log_config=None,
        timeout_graceful_shutdown=int(server_cfg.graceful_termination_timeout_s),
        timeout_keep_alive=5,
    )
    server = _DrainingServer(config, app)
    supervisor = asyncio.create_task(_supervise(server, app, engine))
    metrics_task = _start_prometheus_port(server_cfg, engine)
    logger.info("Connected: listening on %s:%d", server_cfg.hostname, server_cfg.port)
    await server.serve()
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


class _DrainingServer:
    """uvicorn.Server that flips /health to draining (503) as soon as a signal arrives."""

    def __new__(cls, config, app):
        import uvicorn

        class Server(uvicorn.Server):
            drained_by_signal = False

            def handle_exit(self, sig, frame):
                self.drained_by_signal = True
                app.state.health.set("draining")
                logger.info("Signal %s received: draining in-flight requests", sig)
                super().handle_exit(sig, frame)
                # uvicorn re-raises captured signals after serving; a drained exit is a clean exit
                self._captured_signals.clear()

        return Server(config)


async def _supervise(server, app, engine) -> None:
    while True:
        await asyncio.sleep(0.5)
        if not engine.is_alive:
            app.state.health.set("dead")
            logger.warning("The engine is gone: /health answers 503; shutting down")
            server.should_exit = True
            return


def _start_prometheus_port(server_cfg, engine) -> asyncio.Task | None:
    """TGI's extra Prometheus listener: the metrics on any GET path of `--prometheus-port`."""
    if not server_cfg.prometheus_port:
        return None
    import uvicorn

    from pytgi.server.app import create_metrics_app

    app = create_metrics_app(engine, engine.cache_info)
    config = uvicorn.Config(
        app, host=server_cfg.hostname, port=server_cfg.prometheus_port, log_config=None
    )
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # the main server owns the signals
    return asyncio.create_task(server.serve())


def _model_sha(model_dir: Path) -> str | None:
    """Hub snapshots live in `snapshots/<commit sha>/`; a local directory has no sha."""
    if model_dir.parent.name == "snapshots" and len(model_dir.name) == 40:
        return model_dir.name
    return None


def _model_info(server_cfg, args: argparse.Namespace) -> dict:
    num_shard = configs.num_shard(args)
    return {
        "model_id": server_cfg.model_id,
        "model_sha": server_cfg.model_sha,
        "validation_workers": args.validation_workers,
        "compute_type": envs.compute_type() or f"{num_shard}-cpu",
    }
