"""The engine benchmark (`pytgi bench --model-id …`): pytgi's EngineCore against transformers.

Reading order: `workloads` (what runs), `pytgi_runner` and `hf_runner` (how each system serves it,
recording a `trace`), `metrics` and `roofline` (what is reported), `suite` (the run), `report` and
`results` (the outputs), `cli` (the flags).
"""
