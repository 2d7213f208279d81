"""MultiprocEngineClient: the EngineCore runs in its own process, so the HTTP event loop never waits
for a forward pass. Commands go down one queue, per-step deltas (with a stats snapshot) come back
on another; a reader thread routes them to the per-request streams. The engine process exits when
its parent dies. When a tensor-parallel rank dies (or the ranks fall out of step) the engine sends
("dead", reason) at once and ends: the client is dead from then on and every stream fails with the
reason.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import os
import queue
import threading
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from pytgi.config import CacheInfo, EngineConfig
from pytgi.engine.client import EngineStats, apply_commands
from pytgi.engine.stream import OutputRouter
from pytgi.errors import EngineDeadError, ModelLoadError, PytgiError

if TYPE_CHECKING:
    from pytgi.engine.engine_core import EngineCore
from pytgi.messages.outputs import RequestOutput
from pytgi.messages.request import EngineRequest

logger = logging.getLogger(__name__)

# (config, on_rank_death) -> a started engine; runs in the engine process
BuildCore = Callable[[EngineConfig, Callable[[str], None]], "EngineCore"]


class MultiprocEngineClient:
    def __init__(self, process, commands, results, cache_info: CacheInfo, stats: EngineStats):
        self._process = process
        self._commands = commands
        self._results = results
        self.cache_info = cache_info
        self._router = OutputRouter(self._send_abort)
        self._stats = stats  # the engine's own snapshot at ready: every KV block free
        self._dead = False
        self._death: str | None = None  # why the engine ended, as it reported it
        self._reader = threading.Thread(target=self._read, name="pytgi-engine-reader", daemon=True)
        self._reader.start()

    @classmethod
    def start(
        cls,
        config: EngineConfig,
        build_core: BuildCore,
        timeout_s: float = 3600.0,
        json_logs: bool = False,
    ) -> MultiprocEngineClient:
        """Spawn the engine process and wait until it has loaded and warmed up the model.

        `build_core` (a module-level function, so that it pickles) builds the engine in the new
        process: pytgi.runtime.build_engine_core."""
        ctx = mp.get_context("spawn")
        commands, results = ctx.Queue(), ctx.Queue()
        args = (config, build_core, commands, results, os.getpid(), json_logs)
        process = ctx.Process(target=run_engine, args=args, name="pytgi-engine")
        process.start()
        kind, payload, stats = _wait_ready(process, results, timeout_s)
        if kind != "ready":  # "error", or "dead": a rank failed while rank 0 may still be loading
            _end_process(process, grace_s=5.0)
            raise ModelLoadError(payload)
        return cls(process, commands, results, payload, stats)

    def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        if self._dead:
            raise EngineDeadError()
        stream = self._router.open(request.request_id)
        self._commands.put(("add", request))
        return stream

    async def abort(self, request_id: str) -> None:
        self._send_abort(request_id)

    def _send_abort(self, request_id: str) -> None:
        if not self._dead:
            self._commands.put(("abort", request_id))

    def stats(self) -> EngineStats:
        return self._stats

    @property
    def is_alive(self) -> bool:
        return not self._dead and self._process.is_alive()

    @property
    def death_reason(self) -> str:
        """Why the engine ended (a shard's death, in the engine's words), once it has."""
        return self._death or "the engine process is gone"

    @property
    def pid(self) -> int | None:
        return self._process.pid

    async def shutdown(self) -> None:
        await asyncio.to_thread(self.close)

    def close(self, timeout_s: float = 10.0) -> None:
        if self._process.is_alive():
            self._commands.put(("stop", None))
            self._process.join(timeout_s)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)
        self._dead = True

    def _read(self) -> None:
        stopped = False
        while not stopped:
            try:
                kind, outputs, stats = self._results.get(timeout=0.5)
            except queue.Empty:
                if not self._process.is_alive():
                    break
                continue
            except (EOFError, OSError):
                break
            if kind == "outputs":
                self._stats = stats
                self._router.deliver(outputs)
            elif kind == "dead":  # the payload is the reason; the launcher ends with it
                self._death = outputs
                break
            stopped = kind == "stopped"
        self._dead = True
        if stopped and self._death is None:  # a clean shutdown that `close` asked for
            logger.info("engine process stopped")
            self._death = "engine stopped"
        elif self._death is None:
            code = self._process.exitcode
            logger.error("engine process exited (code %s)", code)
            self._death = f"engine process exited (code {code})"
        self._router.fail_all(self._death)


def _end_process(process, grace_s: float) -> None:
    process.join(grace_s)
    if process.is_alive():
        process.kill()  # its ranks exit by themselves once their parent is gone
        process.join(5)


def _wait_ready(process, results, timeout_s: float) -> tuple[str, object, EngineStats | None]:
    waited = 0.0
    while waited < timeout_s:
        try:
            return results.get(timeout=1.0)
        except queue.Empty:
            waited += 1.0
            if not process.is_alive():
                code = process.exitcode
                return "error", f"engine process exited during start-up (code {code})", None
    process.kill()
    return "error", f"engine did not become ready within {timeout_s:.0f}s", None


def run_engine(
    config: EngineConfig,
    build_core: BuildCore,
    commands,
    results,
    parent_pid: int,
    json_logs: bool,
) -> None:
    """Engine process entry point: load, warm up, report ready, then step until told to stop."""
    from pytgi.utils.logging import setup_logging
    from pytgi.utils.process import exit_when_orphaned, ignore_terminal_interrupts

    setup_logging(json_output=json_logs, rank=0 if config.parallel.num_shard > 1 else None)
    ignore_terminal_interrupts()  # the launcher drains on Ctrl-C, then sends "stop"
    exit_when_orphaned(parent_pid)  # a launcher killed during the model's load or warm-up

    def report_rank_death(reason: str) -> None:  # from the rank monitor thread
        results.put(("dead", reason, None))

    try:
        core = build_core(config, report_rank_death)
    except PytgiError as exc:  # a named cause: the launcher logs it, once, as its last line
        results.put(("error", exc.message, None))
        return
    except Exception as exc:  # unexpected: keep the traceback for the bug report
        logger.exception("engine start-up failed")
        results.put(("error", f"{type(exc).__name__}: {exc}", None))
        return
    results.put(("ready", core.cache_info, core.stats()))
    try:
        _loop(core, commands, results, parent_pid)
    except EngineDeadError as exc:  # a shard died or the ranks fell out of step
        results.put(("dead", exc.message, None))
        raise SystemExit(1) from None
    finally:
        core.shutdown()
        results.put(("stopped", None, None))


def _loop(core, commands, results, parent_pid: int) -> None:
    while True:
        num_applied = apply_commands(core, commands, block=not core.has_unfinished())
        if num_applied < 0 or os.getppid() != parent_pid:
            return  # told to stop, or orphaned: the launcher is gone
        outputs = core.step()
        if outputs or num_applied or core.has_unfinished():
            # stats go with every change (an abort frees blocks even when no step runs)
            results.put(("outputs", outputs, core.stats()))
