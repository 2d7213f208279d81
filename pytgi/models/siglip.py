"""The SigLIP vision tower, shared by the families built on it (PaliGemma, Idefics 2 and 3,
Gemma 3; Llava-Next's CLIP reuses its encoder layer): a ViT of pre-norm layers (LayerNorm,
bidirectional multi-head attention over every patch of an image, LayerNorm, a two-layer MLP),
learned position embeddings, a final LayerNorm. No pooling head: every family reads the last
hidden state (`vision_use_head` weights, where a checkpoint has them, are ignored by the family).

Positions: `plain` gives patch i position i (SiglipVisionModel: PaliGemma, Gemma 3); `bucketed`
maps an image of rows x cols patches (at most the tower's side each) onto the side x side table by
fractional coordinates, as Idefics 2 / 3 do for tiles of any size.

Checkpoint names under the tower's prefix: `embeddings.patch_embedding`,
`embeddings.position_embedding`, `encoder.layers.N.{layer_norm1,self_attn.{q,k,v,out}_proj,
layer_norm2,mlp.fc1,mlp.fc2}`, `post_layernorm`. The q/k/v projections are held as `q`, `k`, `v`
(`qkv_renames`): the language model's loader packs every `q_proj` / `k_proj` / `v_proj` it sees.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pytgi.models.qwen2_vl import VISION_ACTS


def qkv_renames(tower_prefix: str) -> tuple[tuple[str, str], ...]:
    """The rename (regex, replacement) that keeps the tower's q/k/v out of the LM's packing;
    `tower_prefix` is a regex of the tower's module path after the family's own renames."""
    return ((rf"^({tower_prefix}\..*\.self_attn)\.([qkv])_proj\.", r"\1.\2."),)


class SiglipAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, N, dim] -> [B, N, dim], every patch of an image attending to every other
        (mask [B, 1, 1, N] bool: the keys that are real patches, None: all)."""
        b, n, _ = x.shape

        def heads(t):
            return t.view(b, n, self.num_heads, -1).transpose(1, 2)  # [B, H, N, D]

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
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

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x), mask)
        return x + self.mlp(self.layer_norm2(x))


class SiglipEmbeddings(nn.Module):
    def __init__(self, vision: dict, bucketed: bool = False):
        super().__init__()
        dim, self.patch = vision["hidden_size"], vision["patch_size"]
        self.patch_embedding = nn.Conv2d(
            vision["num_channels"], dim, kernel_size=self.patch, stride=self.patch
        )
        self.side = vision["image_size"] // self.patch
        self.position_embedding = nn.Embedding(self.side**2, dim)
        self.bucketed = bucketed

    def bucketed_ids(self, rows: int, cols: int, dtype: torch.dtype, device) -> torch.Tensor:
        """The table rows Idefics 2 / 3 give an image of rows x cols patches, computed as they
        do: fractional coordinates bucketed on a grid of `side` (in the pixels' dtype, whose
        rounding can put patch 1 of an axis in bucket 0, and so on) -> [rows * cols]."""
        side = self.side
        boundaries = torch.arange(1 / side, 1.0, 1 / side, device=device)

        def buckets(n: int) -> torch.Tensor:
            index = torch.arange(n, device=device, dtype=dtype)
            return torch.bucketize(index / n * (1 - 1e-6), boundaries, right=True)

        return (buckets(rows)[:, None] * side + buckets(cols)[None, :]).flatten()

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [B, C, H, W] (images of one size; plain positions: the tower's size) ->
        [B, N, dim], N = (H / patch) * (W / patch) patches, row-major."""
        dtype = self.patch_embedding.weight.dtype
        x = self.patch_embedding(pixels.to(dtype)).flatten(2).transpose(1, 2)
        if self.bucketed:
            rows, cols = pixels.shape[-2] // self.patch, pixels.shape[-1] // self.patch
            return x + self.position_embedding(self.bucketed_ids(rows, cols, dtype, x.device))
        return x + self.position_embedding.weight[: x.shape[1]]


class SiglipVisionModel(nn.Module):
    def __init__(self, vision: dict, bucketed_positions: bool = False):
        super().__init__()
        self.embeddings = SiglipEmbeddings(vision, bucketed_positions)
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(
            SiglipLayer(vision) for _ in range(vision["num_hidden_layers"])
        )
        self.post_layernorm = nn.LayerNorm(vision["hidden_size"], eps=vision["layer_norm_eps"])

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [B, C, H, W] -> the last hidden state [B, N, dim] (after post_layernorm)."""
        x = self.embeddings(pixels)
        for layer in self.encoder.layers:
            x = layer(x)
        return self.post_layernorm(x)
