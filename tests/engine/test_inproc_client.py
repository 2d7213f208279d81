"""InprocEngineClient: streams, early close aborts (frees blocks), failed steps fail streams."""

from __future__ import annotations

import asyncio

from engine.fakes import FakeExecutor
from engine.test_scheduler import expected_output, make_core, request

from pytgi.engine.inproc_client import InprocEngineClient


async def collect(stream):
    tokens, last = [], None
    async for delta in stream:
        tokens += [t.token_id for t in delta.new_tokens]
        last = delta
    return tokens, last


def test_concurrent_streams_get_their_own_tokens():
    async def main():
        core, _ = make_core()
        client = InprocEngineClient(core)
        prompts = {f"r{i}": [i + 1] * (3 + i) for i in range(5)}
        results = await asyncio.gather(
            *(collect(client.generate(request(rid, p, max_new=6))) for rid, p in prompts.items())
        )
        await client.shutdown()
        return prompts, results

    prompts, results = asyncio.run(main())
    for prompt, (tokens, last) in zip(prompts.values(), results, strict=True):
        assert tokens == expected_output(prompt, 6)
        assert last.finished


def test_closing_a_stream_aborts_and_frees_blocks():
    async def main():
        core, _ = make_core(max_batch_size=1)
        client = InprocEngineClient(core)
        stream = client.generate(request("long", [1, 2, 3], max_new=10_000))
        queued = client.generate(request("queued", [4, 5], max_new=5))
        async for _ in stream:
            break
        await stream.aclose()
        tokens, last = await collect(queued)
        for _ in range(50):
            if not core.has_unfinished():
                break
            await asyncio.sleep(0.02)
        kv = core.scheduler.kv
        await client.shutdown()
        return kv, tokens, core

    kv, tokens, core = asyncio.run(main())
    assert tokens == expected_output([4, 5], 5)
    assert core.scheduler.num_aborts == 1
    assert kv.num_free_blocks == kv.num_blocks


def generate_on_failing_steps(error: type[Exception], message: str):
    """One request on an engine whose every step raises error(message): (tokens, last delta,
    whether the client is still alive)."""

    class Failing(FakeExecutor):
        def execute(self, out, grammar_masks=None):
            raise error(message)

    async def main():
        core, _ = make_core()
        core.executor = Failing()
        client = InprocEngineClient(core)
        tokens, last = await collect(client.generate(request("x", [1, 2], max_new=3)))
        alive = client.is_alive
        await client.shutdown()
        return tokens, last, alive

    return asyncio.run(main())


def test_a_dead_engine_fails_open_streams():
    tokens, last, alive = generate_on_failing_steps(SystemError, "boom")
    assert tokens == [] and last.finished and "boom" in last.error
    assert alive  # a failed step fails its batch; the engine keeps serving


def test_an_engine_dead_error_in_a_step_ends_the_engine():
    """A dead tensor-parallel rank is not one batch's failure: the engine stops serving."""
    from pytgi.errors import EngineDeadError

    died = "tensor-parallel rank 1 died (exit code -9: SIGKILL)"
    tokens, last, alive = generate_on_failing_steps(EngineDeadError, died)
    assert tokens == [] and last.finished
    assert last.error == f"EngineDeadError: {died}"
    assert not alive
