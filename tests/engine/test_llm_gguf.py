"""`LLM("model.gguf")` works as a checkpoint does: constrained decoding on (its vocabulary from
the file's tokenizer) and `pytgi serve`'s step budget for the device."""

from __future__ import annotations

import json

from pytgi.config import default_max_batch_prefill_tokens
from pytgi.messages.sampling_params import GrammarSpec, SamplingParams
from pytgi.runtime.llm import LLM


def test_llm_on_a_gguf_file_constrains_and_uses_the_serve_budget(smollm2_gguf):
    llm = LLM(str(smollm2_gguf), num_blocks=32)
    try:
        assert llm.core.grammar is not None  # constrained decoding is on
        budget = llm.config.scheduler.max_batch_prefill_tokens
        assert budget == default_max_batch_prefill_tokens(llm.core.cache_info.device)
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
        grammar = GrammarSpec("json", json.dumps(schema))
        params = SamplingParams(grammar=grammar)
        (out,) = llm.generate(["A JSON object:"], params, max_new_tokens=16)
        assert out.text.lstrip().startswith("{")
    finally:
        llm.close()
