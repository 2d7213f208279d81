"""The request lifecycle above the engine: `Validator` (TGI's limits and messages), `Infer`
(permits, best_of, details, streams, stop strings), chat rendering and tools. No torch."""
