"""Qwen2.5-VL: Qwen2-VL's composition (language model with M-RoPE, placeholder runs replaced by
the tower's embeddings) with another tower: RMSNorm and a gated SiLU MLP in its blocks, and
window attention. Patches are reordered window by window (windows of `window_size` pixels on
the merged grid); most blocks attend within a window only, the `fullatt_block_indexes` blocks
over the whole image; the merged tokens are put back in raster order at the end.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from pytgi.models.qwen2_vl import (
    VISION_ACTS,
    PatchEmbed,
    Qwen2VLForConditionalGeneration,
    VisionAttention,
    _patch_hw,
)


class VisionRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class GatedVisionMLP(nn.Module):
    def __init__(self, dim: int, hidden: int, act: str):
        super().__init__()
        # checkpoint: gate_proj / up_proj, renamed (the language model packs those names)
        self.gate = nn.Linear(dim, hidden)
        self.up = nn.Linear(dim, hidden)
        self.down_proj = nn.Linear(hidden, dim)
        self.act = VISION_ACTS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate(x)) * self.up(x))


class WindowVisionBlock(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp_hidden: int, act: str):
        super().__init__()
        self.norm1 = VisionRMSNorm(dim)
        self.norm2 = VisionRMSNorm(dim)
        self.attn = VisionAttention(dim, num_heads)
        self.mlp = GatedVisionMLP(dim, mlp_hidden, act)

    def forward(self, x, cos, sin, cu_seqlens) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, cu_seqlens)
        return x + self.mlp(self.norm2(x))


class RMSPatchMerger(nn.Module):
    def __init__(self, out_dim: int, dim: int, merge: int):
        super().__init__()
        self.width = dim * merge * merge
        self.ln_q = VisionRMSNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(self.width, self.width), nn.GELU(), nn.Linear(self.width, out_dim)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(x).view(-1, self.width))


class Qwen25VisionTower(nn.Module):
    def __init__(self, vision: dict):
        super().__init__()
        dim, heads = vision["hidden_size"], vision["num_heads"]
        self.merge = vision["spatial_merge_size"]
        self.window = vision["window_size"] // self.merge // vision["patch_size"]  # merged tokens
        self.full_attention = set(vision["fullatt_block_indexes"])
        self.patch_embed = PatchEmbed(
            vision["patch_size"], vision["temporal_patch_size"], vision["in_channels"], dim
        )
        rotary = dim // heads // 2
        self.inv_freq = 1.0 / (10000.0 ** (torch.arange(0, rotary, 2).float() / rotary))
        self.blocks = nn.ModuleList(
            WindowVisionBlock(dim, heads, vision["intermediate_size"], vision["hidden_act"])
            for _ in range(vision["depth"])
        )
        self.merger = RMSPatchMerger(vision["out_hidden_size"], dim, self.merge)

    def _windows(self, grids) -> tuple[np.ndarray, list[int]]:
        """The merged tokens' order window by window, and the windows' patch boundaries."""
        order, bounds, base = [], [0], 0
        unit = self.merge * self.merge
        for t, h, w in grids:
            gh, gw = h // self.merge, w // self.merge
            index = np.arange(t * gh * gw).reshape(t, gh, gw)
            nh, nw = -(-gh // self.window), -(-gw // self.window)
            for frame in index:
                for i in range(nh):
                    for j in range(nw):
                        win = frame[i * self.window : (i + 1) * self.window,
                                    j * self.window : (j + 1) * self.window]  # fmt: skip
                        order.append(win.reshape(-1) + base)
                        bounds.append(bounds[-1] + win.size * unit)
            base += t * gh * gw
        return np.concatenate(order), bounds

    def forward(self, pixels: torch.Tensor, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        unit = self.merge * self.merge
        order, windows = self._windows(grids)
        order_t = torch.from_numpy(order).to(pixels.device)
        x = self.patch_embed(pixels)  # [N, dim], merge-block order
        n = x.shape[0]
        x = x.view(n // unit, unit, -1)[order_t].reshape(n, -1)
        hw = np.concatenate([_patch_hw(t, h, w, self.merge) for t, h, w in grids])
        hw = torch.from_numpy(hw).to(pixels.device).view(n // unit, unit, 2)[order_t].view(n, 2)
        freqs = (hw.unsqueeze(-1).float() * self.inv_freq).flatten(1)
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos(), emb.sin()
        full = np.cumsum([0] + [h * w for t, h, w in grids for _ in range(t)]).tolist()
        windows = [b for i, b in enumerate(windows) if i == 0 or b != windows[i - 1]]
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, full if i in self.full_attention else windows)
        merged = self.merger(x)  # [N / unit, out]
        return merged[torch.argsort(order_t)]


class Qwen2_5_VLForConditionalGeneration(Qwen2VLForConditionalGeneration):
    tower_class = Qwen25VisionTower
    weight_renames = (
        *Qwen2VLForConditionalGeneration.weight_renames,
        (r"^(visual\.blocks\.\d+\.mlp)\.gate_proj\.", r"\1.gate."),
        (r"^(visual\.blocks\.\d+\.mlp)\.up_proj\.", r"\1.up."),
    )
