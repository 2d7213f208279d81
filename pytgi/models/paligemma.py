"""PaliGemma 1 and 2: a Gemma (1) or Gemma 2 language model whose prompt is the images' tokens,
`<bos>`, the text and a newline, every image a fixed run of `image_seq_length` <image> tokens
(one per patch of the SigLIP tower, `models/siglip.py`, at its one input size). A single linear
layer projects the tower's last hidden state to the language model's width; the result is divided
by sqrt(hidden) before the language model's sqrt(hidden) embedding scale, so image rows enter it
as projected.

What differs from the other families:
- prefix-LM attention: every prompt token (images and text) sees every other prompt token, the
  generated ones attend causally (`bidirectional = PROMPT`: the scheduler runs a prompt whole in
  one step and takes no prefix hit inside it, the attention backend opens the prompt's mask);
- rotary positions count from 1 (transformers' PaliGemma passes position_ids = index + 1);
- Gemma 2 (PaliGemma 2) keeps its soft-caps and alternating windows (the windows only act past
  their length; transformers' PaliGemma mask ignores them, the same below that length).

Checkpoint names: `language_model.model.*` (or `model.language_model.*`), `vision_tower.
vision_model.*`, `multi_modal_projector.linear`, an optional `lm_head` (tied to the embeddings);
the tower's pooling head (`vision_tower.vision_model.head.*`) is not used.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from pytgi.errors import ModelLoadError
from pytgi.layers.embedding import ParallelLMHead
from pytgi.layers.quantization.base import QuantConfig
from pytgi.messages.bidirectional import PROMPT
from pytgi.messages.request import MultimodalInput
from pytgi.models.config import OUTSIDE, DecoderSpec
from pytgi.models.decoder import LLAMA_PACKED_MODULES, DecoderForCausalLM, DecoderModel
from pytgi.models.gemma import Gemma2ForCausalLM, GemmaForCausalLM
from pytgi.models.multimodal import MultimodalLM
from pytgi.models.siglip import SiglipVisionModel, qkv_renames

LANGUAGE_MODELS = {"gemma": GemmaForCausalLM, "gemma2": Gemma2ForCausalLM}


@dataclass(frozen=True, kw_only=True)
class PaliGemmaSpec(DecoderSpec):
    vision: dict = field(metadata=OUTSIDE)


class PaliGemmaForConditionalGeneration(MultimodalLM):
    packed_modules_mapping = LLAMA_PACKED_MODULES
    bidirectional = PROMPT
    position_offset = 1
    weight_renames = (
        (r"^language_model\.model\.", "model."),
        (r"^language_model\.lm_head\.", "lm_head."),
        (r"^model\.language_model\.", "model."),
        (r"^(model\.)?vision_tower\.vision_model\.", "vision_tower."),
        (r"^model\.multi_modal_projector\.", "multi_modal_projector."),
        *qkv_renames(r"vision_tower"),
    )
    ignored_weights = (
        *MultimodalLM.ignored_weights,
        r"^(model\.)?vision_tower\.vision_model\.head\.",
    )

    @classmethod
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict) -> PaliGemmaSpec:
        text = hf_config.text_config
        language = LANGUAGE_MODELS.get(text.model_type)
        if language is None:
            raise ModelLoadError(
                f"PaliGemma with a {text.model_type!r} language model is not supported "
                f"(only {', '.join(LANGUAGE_MODELS)})"
            )
        base = language.spec_from_hf(text, architecture, flags)
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        fields["tie_word_embeddings"] = bool(getattr(hf_config, "tie_word_embeddings", True))
        return PaliGemmaSpec(**fields, vision=hf_config.vision_config.to_dict())

    def __init__(self, spec: PaliGemmaSpec, quant_config: QuantConfig | None = None):
        super().__init__()
        if quant_config is not None:
            raise ModelLoadError(f"{spec.architecture} does not run quantized weights yet")
        self.spec = spec
        self.model = DecoderModel(spec, quant_config)
        # transformers multiplies by sqrt(hidden_size) rounded to the model's dtype
        normalizer = torch.tensor(spec.embedding_multiplier, dtype=torch.get_default_dtype())
        self.model.embedding_multiplier = float(normalizer)
        self.vision_tower = SiglipVisionModel(spec.vision)
        self.multi_modal_projector = nn.Module()
        self.multi_modal_projector.linear = nn.Linear(spec.vision["hidden_size"], spec.hidden_size)
        self.lm_head = ParallelLMHead(spec.vocab_size, spec.hidden_size)
        if spec.tie_word_embeddings:
            self.lm_head.tie(self.model.embed_tokens)

    def encode_images(self, images: Sequence[MultimodalInput]) -> list[torch.Tensor]:
        """Every image [1, C, S, S] of the step in one tower call -> [seq_len, hidden] each."""
        device = self.lm_head.weight.device
        pixels = torch.cat([torch.from_numpy(i.features["pixel_values"]) for i in images])
        features = self.multi_modal_projector.linear(self.vision_tower(pixels.to(device)))
        features = features / (self.spec.hidden_size**0.5)  # [images, seq_len, hidden]
        return list(features.unbind(0))

    def forward(self, input_ids, positions, inputs_embeds=None) -> torch.Tensor:
        """Token and image rows are scaled by sqrt(hidden) together (transformers scales the
        merged embeddings); positions are 1-based."""
        m = self.model
        hidden = m.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        hidden = hidden * m.embedding_multiplier
        cos, sin = m.rotary(positions + self.position_offset, hidden.dtype)
        hidden, residual = m.layers(hidden, cos, sin)
        return m.norm(hidden, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        # the language model's head: its final soft-cap (Gemma 2)
        return DecoderForCausalLM.compute_logits(self, hidden)
