"""What a mixture-of-experts MLP computes, in one spelling for every family (torch-free).

Routing rules (`MoEConfig.router`):
- `SOFTMAX_TOPK`: softmax over all experts, then the top-k probabilities; renormalised over the
  k when `renormalize` (Mixtral, Qwen3-MoE with norm_topk_prob; Qwen2-MoE without). Equal to
  Mixtral's "softmax over the top-k logits".
- `GROUP_LIMITED`: DeepSeek-V2's softmax scores, `topk_groups` of `num_groups` expert groups
  kept by their best expert's score, the top-k among the kept groups ("greedy" is one group);
  weights are the scores, not renormalised, times `scaling_factor`.
- `NOAUX_TC`: DeepSeek-V3's sigmoid scores; a per-expert `e_score_correction_bias` is added for
  the selection only; groups ranked by the sum of their two best biased scores; weights are the
  unbiased scores, renormalised when `renormalize` (plus 1e-20), then times `scaling_factor`.
- `SPARSEMIXER`: PhiMoE's top-2 sparsemixer (inference form): each pick's weight is the softmax
  over the experts whose logit is within `jitter_eps` (relative) of the pick, the first pick
  masked out for the second.
- `SIGMOID_TOPK`: Llama 4's top-k by logit, each pick's weight sigmoid(logit); with
  `scale_input` the weight scales the expert's input instead of its output.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytgi.errors import ModelLoadError

SOFTMAX_TOPK = "softmax_topk"
GROUP_LIMITED = "group_limited_greedy"
NOAUX_TC = "noaux_tc"
SPARSEMIXER = "sparsemixer"
SIGMOID_TOPK = "sigmoid_topk"
ROUTERS = (SOFTMAX_TOPK, GROUP_LIMITED, NOAUX_TC, SPARSEMIXER, SIGMOID_TOPK)


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int
    top_k: int
    intermediate_size: int  # of each routed expert
    hidden_act: str = "silu"
    router: str = SOFTMAX_TOPK
    renormalize: bool = True
    renormalize_p: float = 1.0  # the top-k weights are divided by their p-norm (DBRX sets p)
    scaling_factor: float = 1.0
    num_groups: int = 1
    topk_groups: int = 1
    jitter_eps: float = 0.0  # SPARSEMIXER
    score_correction_bias: bool = False  # NOAUX_TC: the gate has `e_score_correction_bias`
    shared_intermediate_size: int = 0  # 0: no shared expert
    shared_expert_gate: bool = False  # Qwen2-MoE: sigmoid(gate(x)) scales the shared expert
    sparse_layers: tuple[bool, ...] = ()  # per layer: True = this MoE block, False = dense MLP
    per_expert_checkpoint: bool = True  # False: the checkpoint stacks the experts (DBRX)
    scale_input: bool = False  # each expert gets weight * x and its output is summed unweighted

    def __post_init__(self):
        if self.router not in ROUTERS:
            raise ModelLoadError(f"unknown expert router '{self.router}'")
        if not 0 < self.top_k <= self.num_experts:
            raise ModelLoadError(
                f"num_experts_per_tok ({self.top_k}) must be in 1..{self.num_experts}"
            )
        if self.num_experts % self.num_groups or self.topk_groups > self.num_groups:
            raise ModelLoadError(
                f"{self.num_experts} experts in {self.num_groups} groups, "
                f"{self.topk_groups} kept: not a valid grouping"
            )
        if self.router == SPARSEMIXER and self.top_k != 2:
            raise ModelLoadError("the sparsemixer router picks exactly 2 experts")

    def is_sparse(self, layer_idx: int) -> bool:
        return self.sparse_layers[layer_idx] if self.sparse_layers else True
