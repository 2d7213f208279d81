"""Idefics 3 (SmolVLM): a Llama language model whose prompt carries each image as tiles (the
image split to the tower's size, plus a global view), each tile a run of <image> tokens. The tower
is SigLIP (a ViT with learned positions, bidirectional attention, LayerNorms, tanh-GELU MLPs,
a final LayerNorm) run on every tile alone; the connector pixel-shuffles scale x scale
neighbouring patches into one vector and projects it to the language model's width.

Checkpoint names: `model.text_model.*` (the language model, as Llama), `model.vision_model.*`,
`model.connector.*`, `lm_head`.
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
from pytgi.messages.request import MultimodalInput
from pytgi.models.config import OUTSIDE, DecoderSpec, decoder_spec_from_hf
from pytgi.models.decoder import LLAMA_PACKED_MODULES, DecoderModel
from pytgi.models.multimodal import MultimodalLM
from pytgi.models.qwen2_vl import VISION_ACTS


@dataclass(frozen=True, kw_only=True)
class Idefics3Spec(DecoderSpec):
    vision: dict = field(metadata=OUTSIDE)
    scale_factor: int = field(metadata=OUTSIDE)


class SiglipAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        # checkpoint: q_proj / k_proj / v_proj, renamed (the language model packs those names)
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, N, dim] -> [B, N, dim], every patch of a tile attending to every other."""
        b, n, _ = x.shape

        def heads(t):
            return t.view(b, n, self.num_heads, -1).transpose(1, 2)  # [B, H, N, D]

        out = F.scaled_dot_product_attention(heads(self.q(x)), heads(self.k(x)), heads(self.v(x)))
        return self.out_proj(out.transpose(1, 2).reshape(b, n, -1))


class SiglipMLP(nn.Module):
    def __init__(self, dim: int, hidden: int, act: str):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.act = VISION_ACTS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class SiglipLayer(nn.Module):
    def __init__(self, vision: dict):
        super().__init__()
        dim, eps = vision["hidden_size"], vision["layer_norm_eps"]
        self.layer_norm1 = nn.LayerNorm(dim, eps=eps)
        self.layer_norm2 = nn.LayerNorm(dim, eps=eps)
        self.self_attn = SiglipAttention(dim, vision["num_attention_heads"])
        self.mlp = SiglipMLP(dim, vision["intermediate_size"], vision["hidden_act"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class SiglipEmbeddings(nn.Module):
    def __init__(self, vision: dict):
        super().__init__()
        dim, patch = vision["hidden_size"], vision["patch_size"]
        self.patch_embedding = nn.Conv2d(
            vision["num_channels"], dim, kernel_size=patch, stride=patch
        )
        self.side = vision["image_size"] // patch
        self.position_embedding = nn.Embedding(self.side**2, dim)

    def position_ids(self, dtype: torch.dtype, device) -> torch.Tensor:
        """The rows transformers' Idefics 3 gives a whole tile's patches, computed as it does:
        fractional coordinates bucketed on a grid of `side` (in the pixels' dtype, whose
        rounding puts patch 1 of each axis in bucket 0, and so on)."""
        side = self.side
        boundaries = torch.arange(1 / side, 1.0, 1 / side, device=device)
        index = torch.arange(side, device=device, dtype=dtype)
        bucket = torch.bucketize(index / side * (1 - 1e-6), boundaries, right=True)
        return (bucket[:, None] * side + bucket[None, :]).flatten()  # [N]

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [B, C, S, S] (whole tiles of the tower's size) -> [B, N, dim]."""
        dtype = self.patch_embedding.weight.dtype
        x = self.patch_embedding(pixels.to(dtype))
        positions = self.position_embedding(self.position_ids(dtype, pixels.device))
        return x.flatten(2).transpose(1, 2) + positions


class SiglipVisionModel(nn.Module):
    def __init__(self, vision: dict):
        super().__init__()
        self.embeddings = SiglipEmbeddings(vision)
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(
            SiglipLayer(vision) for _ in range(vision["num_hidden_layers"])
        )
        self.post_layernorm = nn.LayerNorm(vision["hidden_size"], eps=vision["layer_norm_eps"])

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(pixels)
        for layer in self.encoder.layers:
            x = layer(x)
        return self.post_layernorm(x)


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
        (r"^(vision_model\..*\.self_attn)\.([qkv])_proj\.", r"\1.\2."),
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
        self.vision_model = SiglipVisionModel(spec.vision)
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
