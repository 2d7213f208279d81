"""`Validator`: TGI's request validation (TGI_COMPATIBILITY.md §11), with its exact messages and
order of checks.

It turns `(inputs, GenerateParameters)` into a `ValidRequest`: prompt ids (truncated from the
left), resolved `SamplingParams` (do_sample, seed) and `StoppingParams` (max_new_tokens, EOS ids),
plus what `Infer` needs around the engine (stop strings, best_of, details flags). Every failure is
a `ValidationError` whose message carries the prefix "Input validation error: " (422).
"""

from __future__ import annotations

import asyncio
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING

from pytgi.config import CacheInfo, GrammarConfig, LimitsConfig
from pytgi.messages.request import EngineRequest, MultimodalInput
from pytgi.messages.sampling_params import GrammarSpec, SamplingParams, StoppingParams
from pytgi.router.errors import input_error
from pytgi.router.grammar import NOT_SUPPORTED, compile_check, parse_grammar
from pytgi.router.images.sources import has_markdown_image
from pytgi.router.params import GenerateParameters
from pytgi.tokenizer.tokenizer import Encoded, Tokenizer

if TYPE_CHECKING:
    from pytgi.router.images.pipeline import ImagePipeline

# TGI schedules max_new_tokens in chunks of this size and validates only the first chunk
# (TGI_COMPATIBILITY.md §11)
MAX_NEW_TOKENS_CHUNK = 1024
GRAMMAR_UNAVAILABLE = "Grammar is not supported by this server"


@dataclass
class ValidRequest:
    """A request that passed validation; `sampling.seed` is None when not sampling, and
    `sampling.grammar` holds the validated grammar."""

    prompt_ids: list[int]
    sampling: SamplingParams
    stopping: StoppingParams
    stop_sequences: list[str] = field(default_factory=list)
    best_of: int = 1
    details: bool = False
    decoder_input_details: bool = False
    return_full_text: bool = False
    adapter_id: str | None = None
    multimodal_inputs: tuple[MultimodalInput, ...] = ()  # images, at their placeholder tokens

    @property
    def input_length(self) -> int:
        return len(self.prompt_ids)

    @property
    def grammar(self) -> GrammarSpec | None:
        return self.sampling.grammar

    def engine_request(self, request_id: str, seed: int | None = None) -> EngineRequest:
        """The engine's view; `seed` overrides the sampling seed (best_of candidates)."""
        sampling = self.sampling
        if seed is not None:
            sampling = replace(sampling, seed=seed)
        return EngineRequest(
            request_id,
            list(self.prompt_ids),
            sampling,
            self.stopping,
            multimodal_inputs=self.multimodal_inputs,
            adapter_id=self.adapter_id,
        )


class Validator:
    """Checks parameters and limits; tokenizes and truncates the inputs."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        limits: LimitsConfig,
        cache_info: CacheInfo,
        *,
        enable_prefill_logprobs: bool = False,
        disable_grammar_support: bool = False,
        engine_supports_grammar: bool = False,
        grammar_config: GrammarConfig | None = None,
        images: ImagePipeline | None = None,
    ):
        self.tokenizer = tokenizer
        self.images = images  # a vision-language model's image pipeline; None: images are text
        self.limits = limits
        self.max_total_tokens = limits.max_total_tokens or cache_info.max_total_tokens
        self.max_input_tokens = limits.max_input_tokens or cache_info.max_input_tokens
        self.enable_prefill_logprobs = enable_prefill_logprobs
        self.disable_grammar_support = disable_grammar_support
        self.engine_supports_grammar = engine_supports_grammar
        self.grammar_config = grammar_config or GrammarConfig()
        # TGI's --validation-workers: the threads tokenizing prompts off the event loop
        self._pool = ThreadPoolExecutor(limits.validation_workers, "pytgi-validation")
        self.lora_adapters = cache_info.lora_adapters

    async def _tokenize(self, method, inputs: str, add_special_tokens: bool, *args, **kwargs):
        """Run a tokenizer method on the validation workers (a long prompt must not stall other
        streams)."""
        call = partial(method, inputs, *args, add_special_tokens=add_special_tokens, **kwargs)
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, call)
        except (TypeError, ValueError, UnicodeError) as exc:
            raise input_error(f"tokenizer error {exc}") from exc

    def check_best_of(self, params: GenerateParameters, *, stream: bool = False) -> int:
        """The checks TGI runs before taking a permit (TGI_COMPATIBILITY.md §11 step 1, §7)."""
        best_of = params.best_of or 1
        if stream and best_of != 1:
            raise input_error("`best_of` != 1 is not supported when streaming tokens")
        if stream and params.decoder_input_details:
            raise input_error(
                "`decoder_input_details` == true is not supported when streaming tokens"
            )
        if best_of > 1 and self.limits.max_best_of == 1:
            raise input_error("`best_of` != 1 is not allowed for this endpoint")
        if best_of > self.limits.max_best_of:
            raise input_error(
                f"`best_of` must be > 0 and <= {self.limits.max_best_of}. Given: {best_of}"
            )
        return best_of

    async def validate(
        self, inputs: str, params: GenerateParameters, *, add_special_tokens: bool = True
    ) -> ValidRequest:
        """Parameter checks in TGI's order, then tokenization and the token limits."""
        best_of = params.best_of or 1
        self._check_adapter(params.adapter_id)
        sampling = self._sampling_params(params, best_of)
        self._check_stop_and_top_n(params, best_of)
        if inputs == "":
            raise input_error("`inputs` cannot be empty")
        truncate = self._check_truncate(params.truncate)
        multimodal: tuple[MultimodalInput, ...] = ()
        if self.images is not None and has_markdown_image(inputs):
            ids, multimodal = await self._encode_with_images(inputs, truncate, add_special_tokens)
        elif self.images is not None and self.images.lays_out_prompt:  # PaliGemma, text only
            text, _ = await self.images.expand(inputs)
            ids = await self.encode_prompt(
                text,
                truncate,
                params.max_new_tokens,
                add_special_tokens=self.images.add_special_tokens(add_special_tokens),
            )
        else:
            ids = await self.encode_prompt(
                inputs, truncate, params.max_new_tokens, add_special_tokens=add_special_tokens
            )
        max_new_tokens = self._check_lengths(len(ids), params.max_new_tokens)
        grammar = await self._check_grammar(params)
        return ValidRequest(
            prompt_ids=ids,
            sampling=replace(sampling, grammar=grammar),
            stopping=StoppingParams(max_new_tokens, self.tokenizer.eos_token_ids),
            stop_sequences=[s for s in params.stop if s],
            best_of=best_of,
            details=params.details or params.decoder_input_details,
            decoder_input_details=params.decoder_input_details,
            return_full_text=bool(params.return_full_text),
            adapter_id=params.adapter_id,
            multimodal_inputs=multimodal,
        )

    def _check_adapter(self, adapter_id: str | None) -> None:
        """An explicit `adapter_id` must name a loaded adapter (TGI would silently serve the
        base model; the chat `model` field keeps TGI's fallback, the routes resolve it)."""
        if adapter_id is None or adapter_id in self.lora_adapters:
            return
        loaded = ", ".join(self.lora_adapters) or "none"
        raise input_error(f"`adapter_id` '{adapter_id}' is not a loaded adapter (loaded: {loaded})")

    async def _encode_with_images(
        self, inputs: str, truncate: int | None, add_special_tokens: bool
    ) -> tuple[list[int], tuple[MultimodalInput, ...]]:
        """The prompt the model's processor builds (each image's markdown replaced by its
        placeholder tokens, counted in the prompt's length) and where each image sits; a
        truncation that cuts an image is refused."""
        text, images = await self.images.expand(inputs)
        add_special_tokens = self.images.add_special_tokens(add_special_tokens)
        ids = (await self._tokenize(self.tokenizer.encode, text, add_special_tokens)).ids
        if truncate is not None and len(ids) > truncate:
            ids = ids[-truncate:]
        return ids, self.images.place(ids, images)

    def _sampling_params(self, p: GenerateParameters, best_of: int) -> SamplingParams:
        asked_sampling = p.do_sample or any(
            v is not None for v in (p.temperature, p.top_k, p.top_p, p.typical_p)
        )
        if best_of > 1 and not asked_sampling:
            raise input_error("you must use sampling when `best_of` is > 1")
        temperature = _check_temperature(p.temperature)
        repetition = _check_repetition_penalty(p.repetition_penalty)
        frequency = _check_frequency_penalty(p.frequency_penalty)
        top_p = _check_unit_open("top_p", p.top_p)
        typical_p = _check_unit_open("typical_p", p.typical_p)
        top_k = _check_top_k(p.top_k)
        if p.max_new_tokens == 0:
            raise input_error("`max_new_tokens` must be strictly positive")
        params = SamplingParams(
            do_sample=p.do_sample,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            typical_p=typical_p,
            repetition_penalty=repetition,
            frequency_penalty=frequency,
            watermark=p.watermark,
            top_n_tokens=p.top_n_tokens or 0,
            prefill_logprobs=p.decoder_input_details and self.enable_prefill_logprobs,
        )
        return replace(params, seed=self._seed(p.seed)) if params.do_sample else params

    @staticmethod
    def _seed(seed: int | None) -> int:
        """TGI draws a random u64 when the user gave none (checked against best_of later)."""
        return random.getrandbits(64) if seed is None else seed

    def _check_stop_and_top_n(self, p: GenerateParameters, best_of: int) -> None:
        max_stop = self.limits.max_stop_sequences
        if len(p.stop) > max_stop:
            raise input_error(
                f"`stop` supports up to {max_stop} stop sequences. Given: {len(p.stop)}"
            )
        if p.seed is not None and best_of > 1:
            raise input_error("`seed` must not be set when `best_of` > 1")
        max_top_n = self.limits.max_top_n_tokens
        if (p.top_n_tokens or 0) > max_top_n:
            raise input_error(
                f"`top_n_tokens` must be >= 0 and <= {max_top_n}. Given: {p.top_n_tokens}"
            )

    def _check_truncate(self, truncate: int | None) -> int | None:
        if truncate is not None and not 0 < truncate <= self.max_input_tokens:
            raise input_error(
                "`truncate` must be strictly positive and less than "
                f"{self.max_input_tokens}. Given: {truncate}"
            )
        return truncate

    async def encode(self, inputs: str, *, add_special_tokens: bool = True) -> Encoded:
        """Tokenize with offsets (`/tokenize`): refused, after counting no further than needed,
        when longer than `max_input_tokens`, so the response stays bounded."""
        await self._refuse_if_too_long(inputs, add_special_tokens, None)
        return await self._tokenize(self.tokenizer.encode, inputs, add_special_tokens)

    async def encode_prompt(
        self,
        inputs: str,
        truncate: int | None,
        max_new_tokens: int | None,
        *,
        add_special_tokens: bool = True,
    ) -> list[int]:
        """The prompt ids: the last `truncate` only (tokenizing only the end of a long text), or
        all of them after a bounded count showed they can fit."""
        if truncate is not None:
            tail = self.tokenizer.encode_tail
            return await self._tokenize(tail, inputs, add_special_tokens, truncate)
        await self._refuse_if_too_long(inputs, add_special_tokens, max_new_tokens)
        encoded = await self._tokenize(self.tokenizer.encode, inputs, add_special_tokens)
        return encoded.ids

    async def _refuse_if_too_long(
        self, inputs: str, add_special_tokens: bool, max_new_tokens: int | None
    ) -> None:
        """Counting stops a little past `max_input_tokens` (the margin covers the count's
        approximation); a prompt counted past it is refused with TGI's message and the count
        reached. Whatever passes is then tokenized whole and checked exactly."""
        if len(inputs) <= self.max_input_tokens:  # at most a few tokens per character: cheap
            return
        cap = self.max_input_tokens + self.max_input_tokens // 8 + 64
        count = self.tokenizer.count_tokens
        counted = await self._tokenize(count, inputs, add_special_tokens, stop_after=cap)
        if counted > cap:
            self._check_lengths(counted, max_new_tokens)

    def _check_lengths(self, input_length: int, max_new_tokens: int | None) -> int:
        """TGI's two token-limit checks; returns the max_new_tokens the engine runs with."""
        room = max(self.max_total_tokens - input_length, 0)
        requested = room if max_new_tokens is None else max_new_tokens
        chunk = min(requested, MAX_NEW_TOKENS_CHUNK)
        if input_length + chunk > self.max_total_tokens:
            raise input_error(
                f"`inputs` tokens + `max_new_tokens` must be <= {self.max_total_tokens}. "
                f"Given: {input_length} `inputs` tokens and {chunk} `max_new_tokens`"
            )
        if input_length > self.max_input_tokens:
            raise input_error(
                f"`inputs` must have less than {self.max_input_tokens} tokens. "
                f"Given: {input_length}"
            )
        # TGI continues chunk after chunk until the context is full; one request does the same
        return min(requested, room)

    async def _check_grammar(self, p: GenerateParameters) -> GrammarSpec | None:
        """TGI's grammar checks, then the grammar engine's (only where the engine enforces it)."""
        if p.grammar is None:
            return None
        if self.disable_grammar_support:
            raise input_error(NOT_SUPPORTED)
        spec = parse_grammar(p.grammar)
        if not self.engine_supports_grammar:
            raise input_error(GRAMMAR_UNAVAILABLE)
        await compile_check(spec, self.grammar_config)
        return spec


def _check_temperature(value: float | None) -> float:
    if value is not None and not value > 0.0:
        raise input_error("`temperature` must be strictly positive")
    return 1.0 if value is None else value


def _check_repetition_penalty(value: float | None) -> float:
    if value is not None and not value > 0.0:
        raise input_error("`repetition_penalty` must be strictly positive")
    return 1.0 if value is None else value


def _check_frequency_penalty(value: float | None) -> float:
    if value is not None and not -2.0 <= value <= 2.0:
        raise input_error("`frequency_penalty` must be >= -2.0 and <= 2.0")
    return 0.0 if value is None else value


def _check_unit_open(name: str, value: float | None) -> float:
    """top_p / typical_p: (0, 1) exclusive — TGI rejects 1.0."""
    if value is not None and not 0.0 < value < 1.0:
        raise input_error(f"`{name}` must be > 0.0 and < 1.0")
    return 1.0 if value is None else value


def _check_top_k(value: int | None) -> int:
    if value is not None and value <= 0:
        raise input_error("`top_k` must be strictly positive")
    return 0 if value is None else value
