"""pytgi.messages: the plain data that crosses the engine's boundaries.

API process → engine: `EngineRequest` with its `SamplingParams` and `StoppingParams`.
Engine → workers: `SchedulerOutput`; workers → engine: `ModelOutput`; engine → API process:
`RequestOutput`. `Executor` is the engine's view of the workers. This package sits below the
engine, the workers and the sampler, which all speak these types, and imports none of them.
"""
