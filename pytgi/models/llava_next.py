"""Llava-Next (LLaVA 1.6): a Mistral / Llama (Vicuna) language model whose prompt carries each
image as one run of <image> tokens. The processor tiles the image at the best of
`image_grid_pinpoints` resolutions ("anyres") and adds a downscaled base view; a CLIP tower
encodes every tile (features of layer `vision_feature_layer`, CLS dropped), a two-layer MLP
projects them, and the tiles' features are stitched into the image's grid, cropped back to the
image's aspect ratio (the padding removed), with the learned `image_newline` vector closing each
row, after the base view's features.

Checkpoint names: `language_model.model.*` / `language_model.lm_head` (or `model.language_model`
and `lm_head`), `vision_tower.vision_model.*`, `multi_modal_projector.*`, `image_newline`.
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
from pytgi.models.qwen2_vl import VISION_ACTS
from pytgi.models.siglip import SiglipLayer


@dataclass(frozen=True, kw_only=True)
class LlavaNextSpec(DecoderSpec):
    vision: dict = field(metadata=OUTSIDE)
    grid_pinpoints: tuple = field(metadata=OUTSIDE)
    feature_layer: int = field(metadata=OUTSIDE)
    select_strategy: str = field(metadata=OUTSIDE)
    projector_act: str = field(metadata=OUTSIDE)


class ClipEmbeddings(nn.Module):
    def __init__(self, vision: dict):
        super().__init__()
        dim, patch = vision["hidden_size"], vision["patch_size"]
        self.class_embedding = nn.Parameter(torch.zeros(dim))
        self.patch_embedding = nn.Conv2d(
            vision["num_channels"], dim, kernel_size=patch, stride=patch, bias=False
        )
        self.position_embedding = nn.Embedding((vision["image_size"] // patch) ** 2 + 1, dim)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [B, C, S, S] -> [B, 1 + N, dim] (CLS first)."""
        x = self.patch_embedding(pixels.to(self.patch_embedding.weight.dtype))
        x = x.flatten(2).transpose(1, 2)
        cls = self.class_embedding.expand(x.shape[0], 1, -1)
        return torch.cat([cls, x], dim=1) + self.position_embedding.weight


class ClipVisionModel(nn.Module):
    def __init__(self, vision: dict):
        super().__init__()
        self.embeddings = ClipEmbeddings(vision)
        self.pre_layrnorm = nn.LayerNorm(vision["hidden_size"], eps=vision["layer_norm_eps"])
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(
            SiglipLayer(vision) for _ in range(vision["num_hidden_layers"])
        )

    def forward(self, pixels: torch.Tensor, num_layers: int) -> torch.Tensor:
        """The hidden states after `num_layers` layers (transformers' hidden_states[num_layers])."""
        x = self.pre_layrnorm(self.embeddings(pixels))
        for layer in self.encoder.layers[:num_layers]:
            x = layer(x)
        return x


class Projector(nn.Module):
    def __init__(self, dim: int, out_dim: int, act: str):
        super().__init__()
        self.linear_1 = nn.Linear(dim, out_dim)
        self.linear_2 = nn.Linear(out_dim, out_dim)
        self.act = VISION_ACTS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class LlavaNextForConditionalGeneration(MultimodalLM):
    packed_modules_mapping = LLAMA_PACKED_MODULES
    weight_renames = (
        (r"^language_model\.model\.", "model."),
        (r"^language_model\.lm_head\.", "lm_head."),
        (r"^model\.language_model\.", "model."),
        (r"^(model\.)?vision_tower\.vision_model\.", "vision_tower."),
        (r"^model\.(multi_modal_projector|image_newline)", r"\1"),
        (r"^(vision_tower\..*\.self_attn)\.([qkv])_proj\.", r"\1.\2."),
    )
    ignored_weights = (
        *MultimodalLM.ignored_weights,
        r"vision_tower\.vision_model\.post_layernorm\.",  # the features come from a middle layer
    )

    @classmethod
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict) -> LlavaNextSpec:
        base = decoder_spec_from_hf(hf_config.text_config, architecture, flags)
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        layer = hf_config.vision_feature_layer
        if not isinstance(layer, int):
            raise ModelLoadError("a list of vision_feature_layer values is not supported yet")
        return LlavaNextSpec(
            **fields,
            vision=hf_config.vision_config.to_dict(),
            grid_pinpoints=tuple(tuple(p) for p in hf_config.image_grid_pinpoints),
            feature_layer=layer,
            select_strategy=hf_config.vision_feature_select_strategy,
            projector_act=hf_config.projector_hidden_act,
        )

    def __init__(self, spec: LlavaNextSpec, quant_config: QuantConfig | None = None):
        super().__init__()
        if quant_config is not None:
            raise ModelLoadError(f"{spec.architecture} does not run quantized weights yet")
        self.spec = spec
        self.model = DecoderModel(spec, quant_config)
        self.vision_tower = ClipVisionModel(spec.vision)
        vision_layers = spec.vision["num_hidden_layers"]
        self.num_vision_layers = spec.feature_layer % (vision_layers + 1)
        self.multi_modal_projector = Projector(
            spec.vision["hidden_size"], spec.hidden_size, spec.projector_act
        )
        self.image_newline = nn.Parameter(torch.zeros(spec.hidden_size))
        self.lm_head = ParallelLMHead(spec.vocab_size, spec.hidden_size)
        if spec.tie_word_embeddings:
            self.lm_head.tie(self.model.embed_tokens)

    def encode_images(self, images: Sequence[MultimodalInput]) -> list[torch.Tensor]:
        """Every tile of every image through the tower in one call, then each image packed."""
        device = self.lm_head.weight.device
        tiles = [torch.from_numpy(i.features["pixel_values"][0]) for i in images]  # [P, C, S, S]
        hidden = self.vision_tower(torch.cat(tiles).to(device), self.num_vision_layers)
        if self.spec.select_strategy == "default":
            hidden = hidden[:, 1:]  # drop CLS
        features = self.multi_modal_projector(hidden).split([len(t) for t in tiles])
        return [
            self._pack(f, [int(v) for v in i.features["image_sizes"][0]])
            for f, i in zip(features, images, strict=True)
        ]

    def _pack(self, features: torch.Tensor, image_size: list[int]) -> torch.Tensor:
        """One image's tile features [P, n, hidden] -> its tokens [length, hidden]: the base view,
        then the grid of the other tiles, unpadded, each row closed by image_newline."""
        from transformers.models.llava_next.modeling_llava_next import (
            get_anyres_image_grid_shape,
            unpad_image,
        )

        base, grid = features[0], features[1:]
        side = self.spec.vision["image_size"] // self.spec.vision["patch_size"]
        rows, cols = get_anyres_image_grid_shape(
            image_size, [list(p) for p in self.spec.grid_pinpoints], self.spec.vision["image_size"]
        )
        grid = grid.view(rows, cols, side, side, -1).permute(4, 0, 2, 1, 3)
        grid = unpad_image(grid.flatten(1, 2).flatten(2, 3), image_size)  # [hidden, H, W]
        newline = self.image_newline[:, None, None].expand(*grid.shape[:-1], 1).to(grid.dtype)
        grid = torch.cat([grid, newline], dim=-1).flatten(1, 2).transpose(0, 1)
        return torch.cat([base, grid])

    def forward(self, input_ids, positions, inputs_embeds=None) -> torch.Tensor:
        m = self.model
        hidden = m.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        cos, sin = m.rotary(positions, hidden.dtype)
        hidden, residual = m.layers(hidden, cos, sin)
        return m.norm(hidden, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        return self.lm_head.compute_logits(hidden)
