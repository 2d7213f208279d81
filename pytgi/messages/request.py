"""What the API process hands the engine for one request, and why a request ended.

Plain picklable dataclasses: they cross the API/engine process boundary as-is.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytgi.messages.sampling_params import SamplingParams, StoppingParams


class FinishReason(str, enum.Enum):
    """TGI's finish reasons (wire values)."""

    LENGTH = "length"
    EOS_TOKEN = "eos_token"
    STOP_SEQUENCE = "stop_sequence"
    # client gone or stop string matched by the router; never reported to a client
    ABORTED = "aborted"


@dataclass(frozen=True)
class MultimodalInput:
    """A non-text input placed in the prompt: the `length` placeholder tokens from `offset` stand
    for it, and the model's embeddings of it replace theirs. `features` are what the model's image
    processor made of it (name -> numpy array, e.g. pixel_values, image_grid_thw), computed in the
    API process; `content_hash` (of the encoded image bytes) keys the prefix cache and the
    workers' encoder cache, so two different images never share either."""

    modality: str  # e.g. "image"
    offset: int
    length: int
    content_hash: str = ""
    features: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    # the model's states of every token of the request depend on this input, not only those
    # from its placeholders on (Mllama: rows before the first image attend over all images), so
    # the prefix cache keys every block of the request by it
    keys_whole_request: bool = False

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass
class EngineRequest:
    """What the API process submits: token ids and parameters, never text."""

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stopping: StoppingParams = field(default_factory=StoppingParams)
    arrival_time_s: float = field(default_factory=time.monotonic)
    adapter_id: str | None = None  # LoRA adapter; an unknown id uses the base model (as TGI)
    multimodal_inputs: tuple[MultimodalInput, ...] = ()
