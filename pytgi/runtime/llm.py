"""LLM: the offline API. `LLM(model_id).generate(prompts, params)` runs the EngineCore in this
thread.

from pytgi import LLM, SamplingParams
llm = LLM()  # the bundled demo model
out = llm.generate(["And God said"], SamplingParams(do_sample=True, temperature=0.8, seed=1))

LLM("model.gguf") serves a GGUF file; LLM(model_id, quantize="eetq") quantizes a full-precision
checkpoint on the fly (TGI's --quantize values).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from pytgi.config import EngineConfig, ModelConfig
from pytgi.messages.outputs import RequestOutput
from pytgi.messages.request import EngineRequest, FinishReason
from pytgi.messages.sampling_params import SamplingParams, StoppingParams
from pytgi.runtime.build import build_engine_core, engine_config


@dataclass
class GenerationOutput:
    request_id: str
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None
    prefill_logprobs: list[float] | None = None
    num_cached_tokens: int = 0


class LLM:
    def __init__(self, model_id: str | None = None, **options):
        self.config = _resolved(engine_config(model_id, **options))
        self.core = build_engine_core(self.config)
        self.tokenizer = _load_tokenizer(self.config.model)

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLM:
        """An LLM over a ready EngineConfig (options `engine_config` does not take)."""
        llm = cls.__new__(cls)
        llm.config = config
        llm.core = build_engine_core(config)
        llm.tokenizer = _load_tokenizer(config.model)
        return llm

    def generate(
        self,
        prompts: str | list[str] | list[list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
        *,
        max_new_tokens: int = 20,
        ignore_eos: bool = False,
        adapter_ids: str | list[str | None] | None = None,
    ) -> list[GenerationOutput]:
        """Run every prompt to completion, batched continuously; results in prompt order.
        `adapter_ids`: the LoRA adapter of every prompt (one id for all, or one per prompt)."""
        prompt_list = [prompts] if isinstance(prompts, str) else list(prompts)
        params_list = params if isinstance(params, list) else [params] * len(prompt_list)
        if not isinstance(adapter_ids, list):
            adapter_ids = [adapter_ids] * len(prompt_list)
        requests = [
            replace(self._request(prompt, sampling, max_new_tokens, ignore_eos), adapter_id=adapter)
            for prompt, sampling, adapter in zip(prompt_list, params_list, adapter_ids, strict=True)
        ]
        return self.run(requests)

    def run(self, requests: list[EngineRequest]) -> list[GenerationOutput]:
        """Run engine requests (e.g. with images: `EngineRequest.multimodal_inputs`) to
        completion, batched continuously; results in request order."""
        results: dict[str, GenerationOutput] = {}
        for request in requests:
            results[request.request_id] = GenerationOutput(request.request_id, request.prompt_ids)
            self.core.add_request(request)
        for delta in self._drain():
            _apply(results[delta.request_id], delta)
        for out in results.values():
            out.text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
        return list(results.values())

    def stream(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        *,
        max_new_tokens: int = 20,
        ignore_eos: bool = False,
    ) -> Iterator[RequestOutput]:
        """Yield the deltas of one request as they are produced."""
        request = self._request(prompt, params, max_new_tokens, ignore_eos)
        self.core.add_request(request)
        yield from self._drain()

    def _request(self, prompt, sampling, max_new_tokens: int, ignore_eos: bool) -> EngineRequest:
        sampling = sampling or SamplingParams()
        if sampling.do_sample and sampling.seed is None:
            sampling = replace(sampling, seed=random.getrandbits(63))
        ids = self.tokenizer.encode(prompt).ids if isinstance(prompt, str) else list(prompt)
        stopping = StoppingParams(
            max_new_tokens=max_new_tokens,
            eos_token_ids=tuple(self.tokenizer.eos_token_ids),
            ignore_eos_token=ignore_eos,
        )
        return EngineRequest(uuid.uuid4().hex, ids, sampling, stopping)

    def _drain(self) -> Iterator[RequestOutput]:
        while self.core.has_unfinished():
            yield from self.core.step()

    def close(self) -> None:
        self.core.shutdown()


def _apply(out: GenerationOutput, delta: RequestOutput) -> None:
    if delta.error:
        raise RuntimeError(f"request {delta.request_id} failed: {delta.error}")
    for token in delta.new_tokens:
        out.token_ids.append(token.token_id)
        out.logprobs.append(token.logprob)
    if delta.prefill_logprobs is not None:
        out.prefill_logprobs = delta.prefill_logprobs
    if delta.finished:
        out.finish_reason = delta.finish_reason
        out.num_cached_tokens = delta.num_cached_tokens


def _resolved(config):
    """The config with its model resolved to the local directory every part reads, as the
    launcher does: a GGUF file's prepared directory (its tokenizer, for the grammar engine too)."""
    from pytgi.models.resolve import resolve_model

    model = replace(config.model, model_id=str(resolve_model(config.model)), gguf_file=None)
    return replace(config, model=model)


def _load_tokenizer(model: ModelConfig):
    from pytgi.models.resolve import resolve_model
    from pytgi.tokenizer.tokenizer import Tokenizer

    return Tokenizer.from_dir(resolve_model(model), config_path=model.tokenizer_config_path)
