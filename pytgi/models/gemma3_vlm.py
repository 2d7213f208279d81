"""Gemma 3 multimodal (`Gemma3ForConditionalGeneration`): the Gemma 3 text model
(`Gemma3ForCausalLM`'s decoder: sliding and global layers with their own rotary bases, q/k norms,
the sandwich block) fed by a SigLIP tower (`models/siglip.py`, plain positions, one input size)
through Gemma 3's projector: the tower's patch grid average-pooled down to `mm_tokens_per_image`
tokens, a Gemma RMSNorm (x * (1 + w), in fp32) and a projection matrix (x @ W, no bias).

What differs from the other families:
- each image's `mm_tokens_per_image` tokens attend to each other both ways (transformers'
  token_type_ids mask ORed over the causal and sliding-window masks), everything else causally:
  `bidirectional = IMAGES` (the scheduler runs each image whole in one step, a prefix hit never
  ends inside one, the attention backend opens each image's span);
- image rows enter the language model as projected: only the token embeddings are scaled by
  sqrt(hidden) (transformers' scaled embedding table, then the image features scattered in).

Checkpoint names: `model.language_model.*` (or `language_model.model.*`),
`model.vision_tower.vision_model.*` (or without `model.`), `model.multi_modal_projector.
{mm_input_projection_weight,mm_soft_emb_norm.weight}`, an optional `lm_head` (tied by default).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from pytgi.errors import ModelLoadError
from pytgi.layers.embedding import ParallelLMHead
from pytgi.layers.quantization.base import QuantConfig
from pytgi.messages.bidirectional import IMAGES
from pytgi.messages.request import MultimodalInput
from pytgi.models.config import OUTSIDE, DecoderSpec
from pytgi.models.decoder import LLAMA_PACKED_MODULES, DecoderForCausalLM, DecoderModel
from pytgi.models.gemma import Gemma3ForCausalLM
from pytgi.models.multimodal import MultimodalLM
from pytgi.models.siglip import SiglipVisionModel, qkv_renames


@dataclass(frozen=True, kw_only=True)
class Gemma3VlmSpec(DecoderSpec):
    vision: dict = field(metadata=OUTSIDE)
    mm_tokens_per_image: int = field(metadata=OUTSIDE)


class Gemma3Projector(nn.Module):
    """[B, N, vision] patches of a side x side grid -> [B, mm_tokens_per_image, hidden]."""

    def __init__(self, vision: dict, hidden: int, tokens_per_image: int):
        super().__init__()
        self.side = vision["image_size"] // vision["patch_size"]
        tokens_side = int(tokens_per_image**0.5)
        if tokens_side**2 != tokens_per_image or self.side % tokens_side:
            raise ModelLoadError(
                f"mm_tokens_per_image {tokens_per_image} does not pool a {self.side} x "
                f"{self.side} patch grid evenly"
            )
        self.kernel = self.side // tokens_side
        self.eps = vision["layer_norm_eps"]
        self.mm_input_projection_weight = nn.Parameter(torch.empty(vision["hidden_size"], hidden))
        self.mm_soft_emb_norm = nn.Module()
        self.mm_soft_emb_norm.weight = nn.Parameter(torch.zeros(vision["hidden_size"]))

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        b, n, dim = patches.shape
        grid = patches.transpose(1, 2).reshape(b, dim, self.side, self.side)
        pooled = F.avg_pool2d(grid, self.kernel, self.kernel).flatten(2).transpose(1, 2)
        x = pooled.float()  # Gemma 3's RMSNorm: fp32, scaled by (1 + w)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        x = (x * (1.0 + self.mm_soft_emb_norm.weight.float())).type_as(patches)
        return torch.matmul(x, self.mm_input_projection_weight).type_as(patches)


class Gemma3ForConditionalGeneration(MultimodalLM):
    packed_modules_mapping = LLAMA_PACKED_MODULES
    bidirectional = IMAGES
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
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict) -> Gemma3VlmSpec:
        text = hf_config.text_config
        base = Gemma3ForCausalLM.spec_from_hf(text, architecture, flags)
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        fields["tie_word_embeddings"] = bool(
            getattr(hf_config, "tie_word_embeddings", getattr(text, "tie_word_embeddings", True))
        )
        return Gemma3VlmSpec(
            **fields,
            vision=hf_config.vision_config.to_dict(),
            mm_tokens_per_image=int(hf_config.mm_tokens_per_image),
        )

    def __init__(self, spec: Gemma3VlmSpec, quant_config: QuantConfig | None = None):
        super().__init__()
        if quant_config is not None:
            raise ModelLoadError(f"{spec.architecture} does not run quantized weights yet")
        self.spec = spec
        self.model = DecoderModel(spec, quant_config)
        # transformers multiplies by sqrt(hidden_size) rounded to the model's dtype
        normalizer = torch.tensor(spec.embedding_multiplier, dtype=torch.get_default_dtype())
        self.model.embedding_multiplier = float(normalizer)
        self.vision_tower = SiglipVisionModel(spec.vision)
        self.multi_modal_projector = Gemma3Projector(
            spec.vision, spec.hidden_size, spec.mm_tokens_per_image
        )
        self.lm_head = ParallelLMHead(spec.vocab_size, spec.hidden_size)
        if spec.tie_word_embeddings:
            self.lm_head.tie(self.model.embed_tokens)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token rows scaled by sqrt(hidden); the image rows written over them are not."""
        return self.model.embed_tokens(input_ids) * self.model.embedding_multiplier

    def encode_images(self, images: Sequence[MultimodalInput]) -> list[torch.Tensor]:
        """Every image [1, C, S, S] of the step in one tower call -> [mm_tokens, hidden] each."""
        device = self.lm_head.weight.device
        pixels = torch.cat([torch.from_numpy(i.features["pixel_values"]) for i in images])
        features = self.multi_modal_projector(self.vision_tower(pixels.to(device)))
        return list(features.unbind(0))

    def forward(self, input_ids, positions, inputs_embeds=None) -> torch.Tensor:
        m = self.model
        hidden = self.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds
        cos, sin = m.rotary(positions, hidden.dtype)
        hidden, residual = m.layers(hidden, cos, sin)
        return m.norm(hidden, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        # the language model's head: its final soft-cap, where the config has one
        return DecoderForCausalLM.compute_logits(self, hidden)
