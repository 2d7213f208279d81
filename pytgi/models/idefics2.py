"""Idefics 2: a Mistral language model whose prompt carries each image as runs of
`resampler_n_latents` <image> tokens between <fake_token_around_image> markers: one run, or five
with image splitting (the image's four quarters and the whole image). Every run is one image
the processor resized (and padded; the padding is cut off here) through the SigLIP tower
(`models/siglip.py`, Idefics' bucketed positions, so any size up to the tower's), a gated MLP to
the language model's width, and a perceiver resampler: `resampler_n_latents` learned latents
cross-attend (RMSNorm, grouped-query heads) to the patches and themselves, `resampler_depth`
layers and a final RMSNorm, so every run is the same number of tokens whatever its size.

Checkpoint names: `model.text_model.*` (the language model, as Mistral), `model.vision_model.*`,
`model.connector.{modality_projection,perceiver_resampler}.*`, `lm_head`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pytgi.errors import ModelLoadError
from pytgi.layers.embedding import ParallelLMHead
from pytgi.layers.quantization.base import QuantConfig
from pytgi.messages.request import MultimodalInput
from pytgi.models.config import OUTSIDE, DecoderSpec, decoder_spec_from_hf
from pytgi.models.decoder import LLAMA_PACKED_MODULES, DecoderModel
from pytgi.models.multimodal import MultimodalLM
from pytgi.models.qwen2_vl import VISION_ACTS
from pytgi.models.siglip import SiglipVisionModel, qkv_renames


@dataclass(frozen=True, kw_only=True)
class Idefics2Spec(DecoderSpec):
    vision: dict = field(metadata=OUTSIDE)
    perceiver: dict = field(metadata=OUTSIDE)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(
            x.dtype
        )


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)); checkpoint gate_proj / up_proj held as gate / up (the language
    model's loader packs those names)."""

    def __init__(self, dim: int, hidden: int, out: int, act: str):
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, out, bias=False)
        self.act = VISION_ACTS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate(x)) * self.up(x))


class PerceiverAttention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, head_dim: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q = nn.Linear(dim, heads * head_dim, bias=False)
        self.k = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.v = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, dim, bias=False)

    def forward(self, latents: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """latents [B, L, dim] attend to [context; latents] [B, N + L, dim] -> [B, L, dim]."""
        b, n_lat, _ = latents.shape
        both = torch.cat([context, latents], dim=1)
        q = self.q(latents).view(b, n_lat, self.heads, -1).transpose(1, 2)
        k = self.k(both).view(b, both.shape[1], self.kv_heads, -1).transpose(1, 2)
        v = self.v(both).view(b, both.shape[1], self.kv_heads, -1).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # [B, H, L, D]
        return self.o_proj(out.transpose(1, 2).reshape(b, n_lat, -1))


class PerceiverLayer(nn.Module):
    def __init__(self, dim: int, p: dict, act: str):
        super().__init__()
        eps = p["rms_norm_eps"]
        self.input_latents_norm = RMSNorm(dim, eps)
        self.input_context_norm = RMSNorm(dim, eps)
        self.self_attn = PerceiverAttention(
            dim, p["resampler_n_heads"], p["num_key_value_heads"], p["resampler_head_dim"]
        )
        self.post_attention_layernorm = RMSNorm(dim, eps)
        self.mlp = GatedMLP(dim, dim * 4, dim, act)

    def forward(self, latents: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        attended = self.self_attn(
            self.input_latents_norm(latents), self.input_context_norm(context)
        )
        latents = latents + attended
        return latents + self.mlp(self.post_attention_layernorm(latents))


class PerceiverResampler(nn.Module):
    def __init__(self, dim: int, p: dict):
        super().__init__()
        self.latents = nn.Parameter(torch.ones(p["resampler_n_latents"], dim))
        self.layers = nn.ModuleList(
            PerceiverLayer(dim, p, p["hidden_act"]) for _ in range(p["resampler_depth"])
        )
        self.norm = RMSNorm(dim, p["rms_norm_eps"])

    def forward(self, context: torch.Tensor) -> torch.Tensor:
        """context [B, N, dim] -> [B, n_latents, dim]."""
        latents = self.latents.unsqueeze(0).expand(context.shape[0], -1, -1)
        for layer in self.layers:
            latents = layer(latents, context)
        return self.norm(latents)


class Connector(nn.Module):
    def __init__(self, spec: Idefics2Spec):
        super().__init__()
        self.modality_projection = GatedMLP(
            spec.vision["hidden_size"], spec.intermediate_size, spec.hidden_size, spec.hidden_act
        )
        self.perceiver_resampler = PerceiverResampler(spec.hidden_size, spec.perceiver)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return self.perceiver_resampler(self.modality_projection(patches))


class Idefics2ForConditionalGeneration(MultimodalLM):
    packed_modules_mapping = LLAMA_PACKED_MODULES
    weight_renames = (
        (r"^model\.text_model\.", "model."),
        (r"^model\.vision_model\.", "vision_model."),
        (r"^model\.connector\.", "connector."),
        *qkv_renames(r"vision_model"),
        (r"^(connector\..*)\.(q|k|v|gate|up)_proj\.", r"\1.\2."),
    )

    @classmethod
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict) -> Idefics2Spec:
        base = decoder_spec_from_hf(hf_config.text_config, architecture, flags)
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        fields["tie_word_embeddings"] = bool(getattr(hf_config, "tie_word_embeddings", False))
        return Idefics2Spec(
            **fields,
            vision=hf_config.vision_config.to_dict(),
            perceiver=hf_config.perceiver_config.to_dict(),
        )

    def __init__(self, spec: Idefics2Spec, quant_config: QuantConfig | None = None):
        super().__init__()
        if quant_config is not None:
            raise ModelLoadError(f"{spec.architecture} does not run quantized weights yet")
        self.spec = spec
        self.model = DecoderModel(spec, quant_config)
        self.vision_model = SiglipVisionModel(spec.vision, bucketed_positions=True)
        self.connector = Connector(spec)
        self.lm_head = ParallelLMHead(spec.vocab_size, spec.hidden_size)
        if spec.tie_word_embeddings:
            self.lm_head.tie(self.model.embed_tokens)

    def encode_images(self, images: Sequence[MultimodalInput]) -> list[torch.Tensor]:
        """Each run is one processed image [1, C, H, W] with its pixel mask [1, H, W]: cut to its
        whole patches of real pixels (the processor pads at the bottom and right) and encoded
        alone; runs of one size share a tower call."""
        device = self.lm_head.weight.device
        patch = self.spec.vision["patch_size"]
        crops = [_real_pixels(i.features, patch) for i in images]  # [1, C, h, w] each
        out: list[torch.Tensor | None] = [None] * len(crops)
        for shape in {c.shape for c in crops}:
            index = [j for j, c in enumerate(crops) if c.shape == shape]
            pixels = torch.cat([crops[j] for j in index]).to(device)
            embeds = self.connector(self.vision_model(pixels))  # [n, n_latents, hidden]
            for j, e in zip(index, embeds.unbind(0), strict=True):
                out[j] = e
        return out

    def forward(self, input_ids, positions, inputs_embeds=None) -> torch.Tensor:
        m = self.model
        hidden = m.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        cos, sin = m.rotary(positions, hidden.dtype)
        hidden, residual = m.layers(hidden, cos, sin)
        return m.norm(hidden, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        return self.lm_head.compute_logits(hidden)


def _real_pixels(features, patch: int) -> torch.Tensor:
    """One run's pixels [1, C, H, W] cut to the whole patches its mask [1, H, W] marks real."""
    pixels = torch.from_numpy(np.ascontiguousarray(features["pixel_values"]))
    mask = features.get("pixel_attention_mask")
    if mask is None:
        return pixels
    mask = np.asarray(mask)[0]  # [H, W]
    rows, cols = int(mask[:, 0].sum()) // patch * patch, int(mask[0].sum()) // patch * patch
    return pixels[..., :rows, :cols]
