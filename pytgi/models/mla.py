"""DeepSeek's multi-head latent attention block (`self_attn` of DeepSeek-V2/V3 layers).

Projections, as in the checkpoints: the query through a low-rank pair (`q_a_proj` -> RMSNorm ->
`q_b_proj`, or one `q_proj` without q_lora_rank) into per-head [nope | rope] parts; the keys and
values through `kv_a_proj_with_mqa` into the latent (RMS-normalised) plus one rotary key shared
by all heads; `kv_b_proj` [H * (nope + v), kv_lora_rank] up-projects the latent to each head's
key nope part (W_UK) and value (W_UV). Rotary applies to the rope parts only (interleaved pairs:
DeepSeek-V2 always, V3 with `rope_interleave`; transformers' V3 de-interleaves q and k alike,
which leaves every score unchanged).

The cache keeps the latent and the rotary key (layers/latent_attention.py); the query absorbs
W_UK and the outputs W_UV, so no per-head K or V is ever materialised. Tensor parallel: heads
split over ranks (q_b_proj / q_proj, kv_b_proj column-wise, o_proj row-wise); the latent
projection and the cache are replicated.
"""

from __future__ import annotations

import torch
from torch import nn

from pytgi.layers.build_context import current_build_context
from pytgi.layers.latent_attention import LatentAttention
from pytgi.layers.linear import (
    ColumnParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
    divide,
    load_part,
)
from pytgi.layers.norm import RMSNorm
from pytgi.layers.quantization.base import QuantConfig, set_weight_attrs
from pytgi.layers.rotary import ApplyRotary
from pytgi.models.config import DecoderSpec

LORA_NORM_EPS = 1e-6  # the q/kv latent norms' epsilon in the reference code (not rms_norm_eps)


class KVUpProjection(nn.Module):
    """`kv_b_proj.weight` [H * (nope + v), kv_lora_rank], this rank's heads, kept as a plain
    tensor: it is only ever used split per head (absorbed), never as a linear layer."""

    def __init__(self, num_heads: int, nope: int, v: int, kv_lora_rank: int):
        super().__init__()
        self.tp = current_build_context().tp
        self.nope, self.v = nope, v
        self.weight = nn.Parameter(
            torch.empty(num_heads * (nope + v), kv_lora_rank), requires_grad=False
        )
        set_weight_attrs(self.weight, weight_loader=self.weight_loader)

    def weight_loader(self, param, loaded) -> None:
        if not isinstance(loaded, torch.Tensor):
            # a pre-quantized piece (DeepSeek-V3 / R1 store kv_b_proj block-wise FP8, e4m3 with a
            # weight_scale_inv per 128 x 128 block): dequantized once here, since the attention
            # only uses it absorbed into the query and output einsums. It is small: on V3,
            # 128 heads x 256 rows x 512 latent columns per layer, about 0.15% of the model.
            loaded = loaded.dequantize()
        load_part(param.data, loaded, 0, self.tp.rank, self.tp.world_size)

    def split(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_UK [H, nope, r], W_UV [H, v, r])."""
        per_head = self.weight.unflatten(0, (-1, self.nope + self.v))  # [H, nope + v, r]
        return per_head[:, : self.nope], per_head[:, self.nope :]


class LatentAttentionBlock(nn.Module):
    def __init__(
        self, spec: DecoderSpec, layer_idx: int, quant_config: QuantConfig | None, prefix: str
    ):
        super().__init__()
        mla = spec.mla
        tp_size = current_build_context().tp.world_size
        self.mla = mla
        self.num_heads = divide(spec.num_heads, tp_size, "number of attention heads")
        hidden, heads = spec.hidden_size, spec.num_heads
        q_out = heads * mla.qk_head_dim
        if mla.q_lora_rank is None:
            self.q_proj = ColumnParallelLinear(
                hidden, q_out, quant_config=quant_config, prefix=f"{prefix}.q_proj"
            )
        else:
            self.q_a_proj = ReplicatedLinear(
                hidden,
                mla.q_lora_rank,
                bias=spec.qkv_bias,
                quant_config=quant_config,
                prefix=f"{prefix}.q_a_proj",
            )
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank, LORA_NORM_EPS)
            self.q_b_proj = ColumnParallelLinear(
                mla.q_lora_rank, q_out, quant_config=quant_config, prefix=f"{prefix}.q_b_proj"
            )
        self.kv_a_proj_with_mqa = ReplicatedLinear(
            hidden,
            mla.cache_size,
            bias=spec.qkv_bias,
            quant_config=quant_config,
            prefix=f"{prefix}.kv_a_proj_with_mqa",
        )
        self.kv_a_layernorm = RMSNorm(mla.kv_lora_rank, LORA_NORM_EPS)
        self.kv_b_proj = KVUpProjection(
            self.num_heads, mla.qk_nope_head_dim, mla.v_head_dim, mla.kv_lora_rank
        )
        self.o_proj = RowParallelLinear(
            heads * mla.v_head_dim,
            hidden,
            bias=spec.o_bias,
            quant_config=quant_config,
            prefix=f"{prefix}.o_proj",
        )
        self.rotate = ApplyRotary(spec.rotary_interleaved)
        self.attn = LatentAttention(
            self.num_heads,
            mla.kv_lora_rank,
            mla.qk_rope_head_dim,
            spec.attention_scale,
            prefix=f"{prefix}.attn",
        )

    def _query(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.mla.q_lora_rank is None:
            return self.q_proj(hidden)
        return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden)))  # [T, H * qk_head_dim]

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden], cos / sin [1, T, 1, rope_dim] -> [T, hidden]."""
        mla, h = self.mla, self.num_heads
        nope, r = mla.qk_nope_head_dim, mla.kv_lora_rank
        q = self._query(hidden).unflatten(-1, (h, mla.qk_head_dim))  # [T, H, nope + rope]
        q_rope = self.rotate(q[..., nope:].contiguous(), cos[0], sin[0])  # [T, H, rope]
        kv = self.kv_a_proj_with_mqa(hidden)  # [T, r + rope]
        latent = self.kv_a_layernorm(kv[:, :r].contiguous())  # [T, r]
        k_rope = self.rotate(kv[:, r:].unsqueeze(1).contiguous(), cos[0], sin[0])  # [T, 1, rope]
        w_uk, w_uv = self.kv_b_proj.split()  # [H, nope, r], [H, v, r]
        q_latent = torch.einsum("thn,hnr->thr", q[..., :nope], w_uk)  # [T, H, r]
        out = self.attn(
            torch.cat([q_latent, q_rope], dim=-1), torch.cat([latent, k_rope[:, 0]], dim=-1)
        )  # [T, H, r]
        out = torch.einsum("thr,hvr->thv", out, w_uv)  # [T, H, v]
        return self.o_proj(out.flatten(1))  # [T, hidden]

    def fused_decode_tensors(self) -> None:
        """The fused decode stack has no latent attention: these layers run one by one."""
        return None
