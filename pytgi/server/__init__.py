"""pytgi.server: TGI's HTTP API (routes, wire formats, headers, errors, SSE) over `Infer`.

Entry point: `pytgi.server.app.create_app`. A request goes `tgi_routes` / `openai_routes` /
`completions` → `Infer` (router) → `EngineClient`; responses are formatted by `protocol` (TGI) and
`chat_format` / `completions` (OpenAI), streams by `sse`.

Where pytgi differs from TGI, and why, is listed in docs/TGI_COMPATIBILITY.md §17 (the rules it
follows are in the sections before it).
"""
