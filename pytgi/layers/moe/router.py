"""Expert selection: router logits [T, E] -> (weights [T, k] fp32, expert ids [T, k] int64), by
the rule `MoEConfig.router` names (config.py states each rule). Scores are computed in fp32
whatever the model dtype, as transformers does; ties are broken as `torch.topk` breaks them.
"""

from __future__ import annotations

import torch

from pytgi.layers.moe.config import GROUP_LIMITED, NOAUX_TC, SIGMOID_TOPK, SPARSEMIXER, MoEConfig


def select_experts(
    logits: torch.Tensor, config: MoEConfig, correction_bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (weights [T, k] fp32, ids [T, k] int64)."""
    logits = logits.float()
    if config.router == GROUP_LIMITED:
        return _group_limited(logits, config)
    if config.router == NOAUX_TC:
        return _noaux_tc(logits, config, correction_bias)
    if config.router == SPARSEMIXER:
        return _sparsemixer(logits, config.jitter_eps)
    if config.router == SIGMOID_TOPK:
        values, ids = logits.topk(config.top_k, dim=-1)  # [T, k]
        return values.sigmoid(), ids
    weights, ids = logits.softmax(dim=-1).topk(config.top_k, dim=-1)  # [T, k]
    if config.renormalize and config.renormalize_p == 1.0:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    elif config.renormalize:
        weights = weights / weights.norm(p=config.renormalize_p, dim=-1, keepdim=True)
    return weights, ids


def _keep_groups(scores: torch.Tensor, group_scores: torch.Tensor, keep: int) -> torch.Tensor:
    """scores [T, E] with every expert outside the `keep` best groups (group_scores [T, G]) set
    to 0."""
    num_groups = group_scores.shape[-1]
    best = group_scores.topk(keep, dim=-1, sorted=False).indices  # [T, keep]
    group_mask = torch.zeros_like(group_scores).scatter_(1, best, 1.0).bool()  # [T, G]
    expert_mask = group_mask.repeat_interleave(scores.shape[-1] // num_groups, dim=-1)  # [T, E]
    return scores.masked_fill(~expert_mask, 0.0)


def _group_limited(logits: torch.Tensor, config: MoEConfig):
    scores = logits.softmax(dim=-1)  # [T, E]
    if config.num_groups > 1:
        grouped = scores.unflatten(-1, (config.num_groups, -1))  # [T, G, E/G]
        scores = _keep_groups(scores, grouped.amax(dim=-1), config.topk_groups)
    weights, ids = scores.topk(config.top_k, dim=-1, sorted=False)  # [T, k]
    if config.renormalize and config.top_k > 1:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * config.scaling_factor, ids


def _noaux_tc(logits: torch.Tensor, config: MoEConfig, bias: torch.Tensor | None):
    scores = logits.sigmoid()  # [T, E]
    choice = scores if bias is None else scores + bias.float().unsqueeze(0)  # [T, E]
    if config.num_groups > 1:
        grouped = choice.unflatten(-1, (config.num_groups, -1))  # [T, G, E/G]
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)  # [T, G]
        choice = _keep_groups(choice, group_scores, config.topk_groups)
    ids = choice.topk(config.top_k, dim=-1, sorted=False).indices  # [T, k]
    weights = scores.gather(1, ids)  # [T, k]: the unbiased scores
    if config.renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * config.scaling_factor, ids


def _sparsemixer_pick(scores: torch.Tensor, masked: torch.Tensor, eps: float):
    """One pick among `masked` (scores [T, E] with earlier picks at -inf): (weight, id) [T, 1]."""
    threshold, pick = masked.max(dim=-1, keepdim=True)  # [T, 1]
    factor = scores.abs().clamp(min=threshold)  # [T, E]
    far = (threshold - scores) / factor > 2 * eps  # [T, E]: not within eps of the pick
    gates = masked.masked_fill(far, float("-inf")).softmax(dim=-1)  # [T, E]
    return gates.gather(1, pick), pick


def _sparsemixer(logits: torch.Tensor, eps: float):
    first_weight, first = _sparsemixer_pick(logits, logits, eps)
    rest = logits.scatter(1, first, float("-inf"))  # [T, E]
    second_weight, second = _sparsemixer_pick(logits, rest, eps)
    return torch.cat([first_weight, second_weight], dim=-1), torch.cat([first, second], dim=-1)
