"""pytgi.server: TGI's HTTP API (routes, wire formats, headers, errors, SSE) over `Infer`.

Entry point: `pytgi.server.app.create_app`. A request goes `tgi_routes` / `openai_routes` /
`completions` → `Infer` (router) → `EngineClient`; responses are formatted by `protocol` (TGI) and
`chat_format` / `completions` (OpenAI), streams by `sse`.

Where we differ from TGI 3.3.6, and why (each choice keeps every client in ecosystem §1.2 working):

- SSE events are `data: <json>` with a space (TGI: `data:<json>`): huggingface_hub only ends a
  stream on the exact `data: [DONE]`, vLLM's benchmark strips `data: `; all parse the spaced form.
- Body errors (bad JSON 400, wrong shape 422, non-JSON content type 415) keep the
  `{"error", "error_type"}` JSON shape; TGI's extractor answers them as plain text.
- `--api-key` is compared exactly and in constant time (TGI: case-insensitive `==`); it guards
  every POST but `/chat_tokenize`, so an unknown POST path is 401, not 404, when a key is set.
  CORS also allows the `authorization` header (TGI: `content-type` only), for browser clients.
- 429 `overloaded` carries `Retry-After`; while draining, POSTs get 503 `unavailable`.
- A client that disconnects from a non-streaming request cancels its generation (TGI keeps it).
- Chat and completions responses name the served model (TGI echoes the request's `model`);
  `model` still picks a loaded LoRA adapter, as in TGI. An explicit unknown `adapter_id` is a
  422 (TGI serves the base model); /info adds `lora_adapters` (docs/TGI_COMPATIBILITY.md).
- Streamed tool calls end with a chunk carrying `finish_reason` (TGI sends none); when the
  output is not in TGI's streamable `{"function": {"_name": …}}` form, the call is parsed whole
  at the end and sent in one chunk.
- `/v1/completions` maps `eos_token` to `"stop"` in streams too (TGI streams send `eos_token`),
  returns choices sorted by `index`, and does not set `decoder_input_details` (no prefill
  logprobs are computed for a response that never shows them).
- `/info` adds `pytgi_version`, `max_batch_total_tokens`, `max_top_n_tokens`, `kv_cache`,
  `model_architecture` / `model_implementation` (`native`, or `transformers` for the fallback),
  and for quantized weights `quantize` (the `--quantize` method, or `gguf`) and `weight_types`
  (a GGUF file's tensor types).
- Not served: `/vertex` and the KServe routes (TGI feature builds).
"""
