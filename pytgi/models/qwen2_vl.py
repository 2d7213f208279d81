"""Qwen2-VL: a Qwen2 language model whose prompt carries images as runs of <|image_pad|> tokens,
replaced by the embeddings of a ViT tower (14 px patches over 2 frames, 2D rotary inside the
tower, bidirectional attention within each image, 2 x 2 patches merged into one token by an MLP),
and whose rotary is multimodal (M-RoPE: temporal / height / width positions per image token,
text positions resuming after the image's largest one).

Checkpoint names: `model.*` / `lm_head` (the language model, as Qwen2), `visual.*` (the tower);
transformers >= 4.52 may also write `model.language_model.*` and `model.visual.*`.
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
from pytgi.layers.build_context import current_build_context
from pytgi.layers.embedding import ParallelLMHead
from pytgi.layers.quantization.base import QuantConfig
from pytgi.layers.rotary import MRotaryEmbedding
from pytgi.messages.request import MultimodalInput
from pytgi.models.config import OUTSIDE, DecoderSpec, decoder_spec_from_hf
from pytgi.models.decoder import LLAMA_PACKED_MODULES, DecoderModel
from pytgi.models.multimodal import MultimodalLM

VISION_ACTS = {
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "gelu": F.gelu,
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


@dataclass(frozen=True, kw_only=True)
class Qwen2VLSpec(DecoderSpec):
    vision: dict = field(metadata=OUTSIDE)  # the HF vision_config, as a dict
    mrope_section: tuple[int, ...] = field(metadata=OUTSIDE)


def qwen2_vl_spec(hf_config, architecture: str, flags: dict) -> Qwen2VLSpec:
    text = getattr(hf_config, "text_config", None) or hf_config
    scaling = dict(getattr(text, "rope_scaling", None) or {})
    section = scaling.pop("mrope_section", None)
    if section is None:
        raise ModelLoadError("config.json's rope_scaling has no mrope_section")
    for key in ("type", "rope_type"):
        if scaling.get(key) in ("mrope", "default"):
            scaling.pop(key)
    base = decoder_spec_from_hf(text, architecture, {"qkv_bias": True, "o_bias": False, **flags})
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    fields["rope_scaling"] = scaling or None
    fields["architecture"] = architecture
    if getattr(hf_config, "tie_word_embeddings", None) is not None:
        fields["tie_word_embeddings"] = bool(hf_config.tie_word_embeddings)
    return Qwen2VLSpec(
        **fields, vision=hf_config.vision_config.to_dict(), mrope_section=tuple(section)
    )


class VisionAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, cos, sin, cu_seqlens: list[int]) -> torch.Tensor:
        """x [N, dim] (the patches of several images) -> [N, dim]; each image (a span of
        `cu_seqlens`) attends to itself only, bidirectionally."""
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.num_heads, -1).unbind(1)  # [N, H, D] each
        q, k = _rotate_vision(q, cos, sin), _rotate_vision(k, cos, sin)
        out = torch.empty_like(q)
        for start, end in zip(cu_seqlens[:-1], cu_seqlens[1:], strict=True):
            qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))  # [H, n, D]
            out[start:end] = F.scaled_dot_product_attention(qs, ks, vs).transpose(0, 1)
        return self.proj(out.flatten(1))


def _rotate_vision(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, H, D] rotated (rotate-half) by cos / sin [N, D], in fp32 as transformers does."""
    dtype = x.dtype
    x = x.float()
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)).to(dtype)


class VisionMLP(nn.Module):
    def __init__(self, dim: int, hidden: int, act: str):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.act = VISION_ACTS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class VisionBlock(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp_hidden: int, act: str):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = VisionAttention(dim, num_heads)
        self.mlp = VisionMLP(dim, mlp_hidden, act)

    def forward(self, x, cos, sin, cu_seqlens) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, cu_seqlens)
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    """Flattened patches [N, C * temporal * patch * patch] -> [N, dim] (a Conv3d whose stride is
    its kernel, i.e. one linear map per patch)."""

    def __init__(self, patch: int, temporal: int, channels: int, dim: int):
        super().__init__()
        self.shape = (channels, temporal, patch, patch)
        kernel = (temporal, patch, patch)
        self.proj = nn.Conv3d(channels, dim, kernel_size=kernel, stride=kernel, bias=False)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        weight = self.proj.weight.flatten(1)  # [dim, C*t*p*p]
        return pixels.to(weight.dtype) @ weight.t()


class PatchMerger(nn.Module):
    """merge x merge neighbouring patches (adjacent rows in the tower's order) -> one token."""

    def __init__(self, out_dim: int, dim: int, merge: int):
        super().__init__()
        self.width = dim * merge * merge
        self.ln_q = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(
            nn.Linear(self.width, self.width), nn.GELU(), nn.Linear(self.width, out_dim)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(x).view(-1, self.width))


class Qwen2VisionTower(nn.Module):
    """pixel patches [N, C*t*p*p] of several images, grids [(t, h, w)] -> one embedding per
    merge x merge patches [N / merge^2, out_dim], images in order."""

    def __init__(self, vision: dict):
        super().__init__()
        dim, heads = vision["embed_dim"], vision["num_heads"]
        self.merge = vision["spatial_merge_size"]
        self.patch_embed = PatchEmbed(
            vision["patch_size"], vision["temporal_patch_size"], vision["in_channels"], dim
        )
        head_dim = dim // heads
        rotary = head_dim // 2
        self.inv_freq = 1.0 / (10000.0 ** (torch.arange(0, rotary, 2).float() / rotary))
        mlp_hidden = int(dim * vision["mlp_ratio"])
        self.blocks = nn.ModuleList(
            VisionBlock(dim, heads, mlp_hidden, vision["hidden_act"])
            for _ in range(vision["depth"])
        )
        self.merger = PatchMerger(vision["hidden_size"], dim, self.merge)

    def rotary(self, grids: list[tuple[int, int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """cos / sin [N, head_dim]: a patch rotates by its row in one half of the features and
        by its column in the other (patches ordered merge-block by merge-block)."""
        ids = [_patch_hw(t, h, w, self.merge) for t, h, w in grids]
        hw = torch.from_numpy(np.concatenate(ids)).to(self.inv_freq.device)  # [N, 2]
        freqs = (hw.unsqueeze(-1).float() * self.inv_freq).flatten(1)  # [N, head_dim / 2]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos(), emb.sin()

    def forward(self, pixels: torch.Tensor, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        x = self.patch_embed(pixels)  # [N, dim]
        cos, sin = self.rotary(grids)
        cu = np.cumsum([0] + [h * w for t, h, w in grids for _ in range(t)]).tolist()
        for block in self.blocks:
            x = block(x, cos, sin, cu)
        return self.merger(x)


def _patch_hw(t: int, h: int, w: int, merge: int) -> np.ndarray:
    """(row, column) of each patch [t * h * w, 2], in the processor's merge-block order."""
    rows = np.broadcast_to(np.arange(h)[:, None], (h, w))
    cols = np.broadcast_to(np.arange(w)[None, :], (h, w))

    def order(a):
        return a.reshape(h // merge, merge, w // merge, merge).transpose(0, 2, 1, 3).reshape(-1)

    return np.tile(np.stack([order(rows), order(cols)], axis=-1), (t, 1))


class Qwen2VLForConditionalGeneration(MultimodalLM):
    packed_modules_mapping = LLAMA_PACKED_MODULES
    weight_renames = (
        (r"^model\.language_model\.", "model."),
        (r"^model\.visual\.", "visual."),
    )
    uses_mrope = True
    tower_class = Qwen2VisionTower

    @classmethod
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict) -> Qwen2VLSpec:
        return qwen2_vl_spec(hf_config, architecture, flags)

    def __init__(self, spec: Qwen2VLSpec, quant_config: QuantConfig | None = None):
        super().__init__()
        if quant_config is not None:
            raise ModelLoadError(f"{spec.architecture} does not run quantized weights yet")
        self.spec = spec
        self.model = DecoderModel(spec, quant_config)
        self.model.rotary_embs = nn.ModuleList([_mrope(spec)])
        self.visual = self.tower_class(spec.vision)
        self.merge = spec.vision["spatial_merge_size"]
        self.lm_head = ParallelLMHead(spec.vocab_size, spec.hidden_size)
        if spec.tie_word_embeddings:
            self.lm_head.tie(self.model.embed_tokens)

    def encode_images(self, images: Sequence[MultimodalInput]) -> list[torch.Tensor]:
        device = self.lm_head.weight.device
        pixels = torch.cat([torch.from_numpy(i.features["pixel_values"]) for i in images]).to(
            device
        )  # [N, C*t*p*p]
        grids = [tuple(int(v) for v in i.features["image_grid_thw"][0]) for i in images]
        embeds = self.visual(pixels, grids)  # [sum of tokens, hidden]
        return list(embeds.split([i.length for i in images]))

    def forward(self, input_ids, positions, inputs_embeds=None) -> torch.Tensor:
        """input_ids [T], positions [3, T] (or [T] for text), inputs_embeds [T, hidden]."""
        m = self.model
        hidden = m.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        cos, sin = m.rotary_embs[0](positions, hidden.dtype)
        hidden, residual = m.layers(hidden, cos.unsqueeze(0), sin.unsqueeze(0))
        return m.norm(hidden, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        return self.lm_head.compute_logits(hidden)

    def mrope_positions(self, num_prompt_tokens, images) -> tuple[np.ndarray, int]:
        positions = np.empty((3, num_prompt_tokens), dtype=np.int64)
        cursor = next_pos = 0
        for image in sorted(images, key=lambda i: i.offset):
            text = image.offset - cursor
            positions[:, cursor : image.offset] = next_pos + np.arange(text)
            next_pos += text
            grid = self._llm_grid(image)
            positions[:, image.offset : image.end] = next_pos + grid
            next_pos += int(grid.max()) + 1
            cursor = image.end
        positions[:, cursor:] = next_pos + np.arange(num_prompt_tokens - cursor)
        next_pos += num_prompt_tokens - cursor
        return positions, next_pos - num_prompt_tokens

    def _llm_grid(self, image: MultimodalInput) -> np.ndarray:
        """(t, h, w) index of each of an image's tokens [3, length]."""
        t, h, w = (int(v) for v in image.features["image_grid_thw"][0])
        h, w = h // self.merge, w // self.merge
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
        return np.stack([tt.reshape(-1), hh.reshape(-1), ww.reshape(-1)])


def _mrope(spec: Qwen2VLSpec) -> MRotaryEmbedding:
    return MRotaryEmbedding(
        spec.rotary_size,
        spec.rope_theta,
        spec.max_position_embeddings,
        spec.rope_scaling,
        current_build_context().max_model_len,
        mrope_section=spec.mrope_section,
    )
