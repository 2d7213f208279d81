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

from pytgi import envs
from pytgi.config import (
    CacheConfig,
    EngineConfig,
    GrammarConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    default_max_batch_prefill_tokens,
)
from pytgi.engine.engine_core import EngineCore
from pytgi.engine.outputs import RequestOutput
from pytgi.engine.request import EngineRequest, FinishReason
from pytgi.engine.sampling_params import SamplingParams, StoppingParams


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
        self.config = engine_config(model_id, **options)
        self.core = EngineCore.from_config(self.config)
        self.tokenizer = _load_tokenizer(self.config.model)

    def generate(
        self,
        prompts: str | list[str] | list[list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
        *,
        max_new_tokens: int = 20,
        ignore_eos: bool = False,
    ) -> list[GenerationOutput]:
        """Run every prompt to completion, batched continuously; results in prompt order."""
        prompt_list = [prompts] if isinstance(prompts, str) else list(prompts)
        params_list = params if isinstance(params, list) else [params] * len(prompt_list)
        results: dict[str, GenerationOutput] = {}
        for prompt, sampling in zip(prompt_list, params_list, strict=True):
            request = self._request(prompt, sampling, max_new_tokens, ignore_eos)
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


def engine_config(
    model_id: str | None = None,
    *,
    dtype: str | None = None,
    revision: str | None = None,
    block_size: int = 16,
    num_blocks: int | None = None,
    enable_prefix_caching: bool = True,
    max_batch_prefill_tokens: int | None = None,
    max_batch_total_tokens: int | None = None,
    max_batch_size: int | None = None,
    num_shard: int = 1,
    num_threads: int | None = None,
    speculate: int = 0,
    grammar: GrammarConfig | bool = True,
    implementation: str = "auto",
    trust_remote_code: bool = False,
    allow_pickle_weights: bool = False,
    quantize: str | None = None,
    gguf_file: str | None = None,
) -> EngineConfig:
    """An EngineConfig from keyword options (the offline API's defaults match `pytgi serve`).

    `grammar`: constrained decoding (`SamplingParams.grammar`) with these limits, or the defaults
    (True), or off (False: no vocabulary is built; grammar requests fail).
    `max_batch_prefill_tokens`: None = `pytgi serve`'s default for the device (smaller on CPU)."""
    if model_id is None:
        from pytgi.demo_model import demo_model_path

        model_id = demo_model_path()
    device = envs.device_config()
    if max_batch_prefill_tokens is None:
        max_batch_prefill_tokens = default_max_batch_prefill_tokens(_platform(device.device))
    return EngineConfig(
        model=ModelConfig(
            model_id=model_id,
            revision=revision,
            dtype=dtype,
            implementation=implementation,
            trust_remote_code=trust_remote_code,
            allow_pickle_weights=allow_pickle_weights,
            quantize=quantize,
            gguf_file=gguf_file,
        ),
        cache=CacheConfig(
            block_size=block_size,
            num_blocks=num_blocks,
            enable_prefix_caching=enable_prefix_caching,
        ),
        scheduler=SchedulerConfig(
            max_batch_prefill_tokens=max_batch_prefill_tokens,
            max_batch_total_tokens=max_batch_total_tokens,
            max_batch_size=max_batch_size,
            num_speculative_tokens=speculate,
        ),
        grammar=GrammarConfig() if grammar is True else grammar or None,
        parallel=ParallelConfig(num_shard=num_shard),
        device=device,
        num_threads=num_threads,
    )


def _platform(device: str) -> str:
    """The platform the engine will pick (backends/selector.py)."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _load_tokenizer(model: ModelConfig):
    from pytgi.models.resolve import resolve_model
    from pytgi.tokenizer.tokenizer import Tokenizer

    return Tokenizer.from_dir(resolve_model(model), config_path=model.tokenizer_config_path)
