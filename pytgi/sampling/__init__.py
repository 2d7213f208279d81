"""Logits → tokens, batched: per-step `SamplingMetadata`, TGI's logits processors and the `Sampler`.

The worker's ModelRunner (rank 0) calls `Sampler(logits, rows)` once per step and
`compute_prefill_logprobs` for decoder_input_details. This package imports nothing above `engine`'s
plain contracts (`SampledToken`, `SamplingParams`).
"""

from pytgi.sampling.logprobs import compute_prefill_logprobs, compute_top_n
from pytgi.sampling.metadata import SampleRow, SamplingMetadata
from pytgi.sampling.sampler import Sampler

__all__ = ["SampleRow", "Sampler", "SamplingMetadata", "compute_prefill_logprobs", "compute_top_n"]
