"""Helpers for the MoE layer tests: load a block's experts from per-expert tensors, and a plain
per-token reference for the routed experts."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def load_experts(experts, w1: Sequence[torch.Tensor], w3: Sequence[torch.Tensor], w2) -> None:
    """Expert e's gate w1[e] [I, H], up w3[e] [I, H] and down w2[e] [H, I] through the loaders
    (each rank keeps its shard of the intermediate dimension)."""
    for e, (gate, up, down) in enumerate(zip(w1, w3, w2, strict=True)):
        experts.weight_loader(experts.w13_weight, gate, "w1", e)
        experts.weight_loader(experts.w13_weight, up, "w3", e)
        experts.weight_loader(experts.w2_weight, down, "w2", e)


def load_shared_expert(shared_experts, gate, up, down) -> None:
    """The shared expert's gate and up [I, H] (fused) and down [H, I] through the loaders."""
    fused = shared_experts.gate_up_proj
    fused.weight_loader(fused.weight, gate, 0)
    fused.weight_loader(fused.weight, up, 1)
    shared_experts.down_proj.weight_loader(shared_experts.down_proj.weight, down)


def per_token_experts(x, weights, ids, w1, w3, w2) -> torch.Tensor:
    """x [T, H]; weights, ids [T, k]; w1, w3 [E, I, H]; w2 [E, H, I]. Each token's weighted sum
    of its chosen experts' SwiGLU MLPs, one token and one expert at a time: [T, H]."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = F.silu(x[t] @ w1[e].T) * (x[t] @ w3[e].T)
            out[t] += weights[t, j] * (h @ w2[e].T)
    return out
