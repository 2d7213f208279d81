"""HTTP load generator for TGI- and OpenAI-compatible servers (`pytgi bench --url ...`).

Data flows one way: `workload` builds `RequestSpec`s from a tokenizer, `runner`/`sweep` drive a
`RequestSender` (the HTTP one lives in `client`) at a concurrency or a Poisson rate, `stats` turns
`RequestResult`s into per-step summaries, and `report`/`plots`/`compare` write what people read.
Nothing here imports torch: this is a client.
"""
