"""The contract of a vision-language model, on top of `CausalLM`: the model runner embeds the
step's tokens (`embed_input_ids`), has the vision tower encode the images whose placeholder
tokens the step runs and are not in its encoder cache (`encode_images`), writes their
embeddings over the placeholders' rows, and runs the language model on the result
(`forward(input_ids, positions, inputs_embeds)`).

A family with multimodal rotary positions (Qwen2-VL's M-RoPE) sets `uses_mrope` and gives each
prompt's [3, P] positions and the offset of the positions after it (`mrope_positions`); the
runner then passes positions [3, T] instead of [T].
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from pytgi.messages.request import MultimodalInput
from pytgi.models.base import CausalLM


class MultimodalLM(CausalLM):
    uses_mrope: bool = False
    # images reach the language model through cross-attention layers (Mllama), not merged
    # embeddings: the runner passes `forward(..., cross_attention=CrossAttentionBatch)` instead
    uses_cross_attention: bool = False
    # spans whose tokens attend to each other both ways (messages/bidirectional.py): "prompt"
    # (PaliGemma's prefix-LM), "images" (Gemma 3: each image's tokens); None: causal. The
    # scheduler runs each span whole, the runner marks the spans of each row
    bidirectional: str | None = None
    position_offset: int = 0  # the rotary position of token index i is i + position_offset

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [T] -> token embeddings [T, hidden], as the language model scales them (the
        composed `DecoderModel`'s table unless a family scales them otherwise)."""
        return self.model.embed_tokens(input_ids)

    def encode_images(self, images: Sequence[MultimodalInput]) -> list[torch.Tensor]:
        """Each image's embeddings [image.length, hidden], one per placeholder token."""
        raise NotImplementedError

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        raise NotImplementedError

    def mrope_positions(
        self, num_prompt_tokens: int, images: Sequence[MultimodalInput]
    ) -> tuple[np.ndarray, int]:
        """(positions [3, P] of the prompt, delta): a token at index p >= P has position p + delta
        in all three rows."""
        raise NotImplementedError


def is_multimodal(model: torch.nn.Module) -> bool:
    return isinstance(model, MultimodalLM)
