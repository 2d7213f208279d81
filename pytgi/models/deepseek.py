"""DeepSeek-V2 and DeepSeek-V3 / R1 (`DeepseekV2ForCausalLM`, `DeepseekV3ForCausalLM`): Llama's
sequential block with multi-head latent attention (models/mla.py, a latent KV cache) and
mixture-of-experts MLPs with shared experts after the first `first_k_dense_replace` dense
layers.

- V2: softmax router scores, the top-k within the `topk_group` best of `n_group` groups (a
  group's score is its best expert's; `topk_method: greedy` is one group), weights times
  `routed_scaling_factor`; rotary on interleaved pairs; softmax scale qk_head_dim ** -0.5 (as
  transformers computes V2).
- V3 / R1: sigmoid scores plus `e_score_correction_bias` for the selection only, groups ranked
  by the sum of their two best biased scores, weights renormalised (`norm_topk_prob`) then times
  `routed_scaling_factor`; YaRN's mscale(factor, mscale_all_dim) squared on the softmax scale.
- The checkpoint's multi-token-prediction layers (indices >= num_hidden_layers) are skipped at
  load, with a log line.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re

from pytgi.layers.moe.config import GROUP_LIMITED, NOAUX_TC, MoEConfig
from pytgi.models.config import MLAConfig, decoder_spec_from_hf, require
from pytgi.models.moe_families import MoEDecoderForCausalLM

logger = logging.getLogger(__name__)
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def _mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _moe_config(hf_config, version: int, num_layers: int) -> MoEConfig:
    method = getattr(hf_config, "topk_method", None) or ("noaux_tc" if version == 3 else "greedy")
    grouped = method in ("group_limited_greedy", "noaux_tc")
    num_groups = (getattr(hf_config, "n_group", None) or 1) if grouped else 1
    first_dense = getattr(hf_config, "first_k_dense_replace", 0) or 0
    freq = getattr(hf_config, "moe_layer_freq", 1) or 1
    shared = getattr(hf_config, "n_shared_experts", None) or 0
    expert_size = require(hf_config, "moe_intermediate_size")
    return MoEConfig(
        num_experts=require(hf_config, "n_routed_experts"),
        top_k=require(hf_config, "num_experts_per_tok"),
        intermediate_size=expert_size,
        hidden_act=getattr(hf_config, "hidden_act", "silu"),
        router=NOAUX_TC if version == 3 else GROUP_LIMITED,
        renormalize=bool(getattr(hf_config, "norm_topk_prob", False)),
        scaling_factor=float(getattr(hf_config, "routed_scaling_factor", 1.0) or 1.0),
        num_groups=num_groups,
        topk_groups=(getattr(hf_config, "topk_group", None) or 1) if grouped else 1,
        score_correction_bias=version == 3,
        shared_intermediate_size=expert_size * shared,
        sparse_layers=tuple(i >= first_dense and i % freq == 0 for i in range(num_layers)),
    )


class DeepseekForCausalLM(MoEDecoderForCausalLM):
    packed_modules_mapping = {"gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
    version = 3

    @classmethod
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict):
        spec = decoder_spec_from_hf(hf_config, architecture, flags)
        mla = MLAConfig(
            kv_lora_rank=require(hf_config, "kv_lora_rank"),
            q_lora_rank=getattr(hf_config, "q_lora_rank", None),
            qk_nope_head_dim=require(hf_config, "qk_nope_head_dim"),
            qk_rope_head_dim=require(hf_config, "qk_rope_head_dim"),
            v_head_dim=require(hf_config, "v_head_dim"),
        )
        scale = mla.qk_head_dim**-0.5
        scaling = spec.rope_scaling or {}
        if cls.version == 3 and scaling.get("mscale_all_dim"):
            scale *= _mscale(scaling["factor"], scaling["mscale_all_dim"]) ** 2
        interleaved = cls.version == 2 or bool(getattr(hf_config, "rope_interleave", True))
        return dataclasses.replace(
            spec,
            num_kv_heads=spec.num_heads,
            head_dim=mla.qk_rope_head_dim,  # the rotary tables' size
            attention_scale=scale,
            rotary_interleaved=interleaved,
            sliding_windows=(),
            mla=mla,
            moe=_moe_config(hf_config, cls.version, spec.num_layers),
        )

    def is_ignored_weight(self, name: str) -> bool:
        match = _LAYER.match(name)
        if match and int(match.group(1)) >= self.spec.num_layers:
            if not getattr(self, "_logged_mtp", False):
                logger.info(
                    "skipping the checkpoint's multi-token-prediction layer(s) (model.layers.%s "
                    "and beyond): pytgi does not run speculative MTP heads",
                    self.spec.num_layers,
                )
                self._logged_mtp = True
            return True
        return super().is_ignored_weight(name)


class DeepseekV2ForCausalLM(DeepseekForCausalLM):
    version = 2


class DeepseekV3ForCausalLM(DeepseekForCausalLM):
    version = 3
