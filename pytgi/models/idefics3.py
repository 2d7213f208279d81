"""Idefics 3 (SmolVLM): a Llama language model whose prompt carries each image as tiles (the
image split to the tower's size, plus a global view), each tile a run of <image> tokens. The tower
is SigLIP (`models/siglip.py`, with Idefics' bucketed positions) run on every tile alone; the
connector pixel-shuffles scale x scale neighbouring patches into one vector and projects it to
the language model's width.

Checkpoint names: `model.text_model.*` (the language model, as Llama), `model.vision_model.*`,
`model.connector.*`, `lm_head`.
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
from pytgi.messages.request import MultimodalInput
from pytgi.models.config import OUTSIDE, DecoderSpec, decoder_spec_from_hf
from pytgi.models.decoder import LLAMA_PACKED_MODULES, DecoderModel
from pytgi.models.multimodal import MultimodalLM
from pytgi.models.siglip import SiglipVisionModel, qkv_renames


@dataclass(frozen=True, kw_only=True)
class Idefics3Spec(DecoderSpec):
    vision: dict = field(metadata=OUTSIDE)
    scale_factor: int = field(metadata=OUTSIDE)


class Connector(nn.Module):
    """Pixel shuffle (scale x scale patches -> one vector) and a projection to the LM width."""

    def __init__(self, dim: int, out_dim: int, scale: int):
        super().__init__()
        self.scale = scale
        self.modality_projection = nn.Module()
        self.modality_projection.proj = nn.Linear(dim * scale * scale, out_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, N, dim] (N = side^2 patches, row-major) -> [B, N / scale^2, out_dim]."""
        b, n, d = x.shape
        side, s = int(n**0.5), self.scale
        x = x.view(b, side, side // s, d * s).permute(0, 2, 1, 3)
        x = x.reshape(b, side // s, side // s, d * s * s).permute(0, 2, 1, 3)
        return self.modality_projection.proj(x.reshape(b, n // (s * s), d * s * s))


class Idefics3ForConditionalGeneration(MultimodalLM):
    packed_modules_mapping = LLAMA_PACKED_MODULES
    weight_renames = (
        (r"^model\.text_model\.", "model."),
        (r"^model\.vision_model\.", "vision_model."),
        (r"^model\.connector\.", "connector."),
        *qkv_renames(r"vision_model"),
    )

    @classmethod
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict) -> Idefics3Spec:
        base = decoder_spec_from_hf(hf_config.text_config, architecture, flags)
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        fields["tie_word_embeddings"] = bool(getattr(hf_config, "tie_word_embeddings", False))
        return Idefics3Spec(
            **fields,
            vision=hf_config.vision_config.to_dict(),
            scale_factor=int(hf_config.scale_factor),
        )

    def __init__(self, spec: Idefics3Spec, quant_config: QuantConfig | None = None):
        super().__init__()
        if quant_config is not None:
            raise ModelLoadError(f"{spec.architecture} does not run quantized weights yet")
        self.spec = spec
        self.model = DecoderModel(spec, quant_config)
        self.vision_model = SiglipVisionModel(spec.vision, bucketed_positions=True)
        self.connector = Connector(spec.vision["hidden_size"], spec.hidden_size, spec.scale_factor)
        self.lm_head = ParallelLMHead(spec.vocab_size, spec.hidden_size)
        if spec.tie_word_embeddings:
            self.lm_head.tie(self.model.embed_tokens)

    def encode_images(self, images: Sequence[MultimodalInput]) -> list[torch.Tensor]:
        """Each run is one tile [1, C, S, S]: all of the step's tiles in one tower call."""
        device = self.lm_head.weight.device
        tiles = torch.cat([torch.from_numpy(i.features["pixel_values"]) for i in images])
        embeds = self.connector(self.vision_model(tiles.to(device)))  # [tiles, seq, hidden]
        return list(embeds.unbind(0))

    def forward(self, input_ids, positions, inputs_embeds=None) -> torch.Tensor:
        m = self.model
        hidden = m.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        cos, sin = m.rotary(positions, hidden.dtype)
        hidden, residual = m.layers(hidden, cos, sin)
        return m.norm(hidden, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        return self.lm_head.compute_logits(hidden)
