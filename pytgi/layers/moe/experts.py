"""The routed experts of one MoE layer, stacked, run as grouped matmuls.

Weights (this rank's slice of every expert, split over the intermediate dimension as TGI does):
`w13_weight` [E, 2 * I / tp, hidden] (each expert's gate rows, then its up rows) and `w2_weight`
[E, hidden, I / tp]; the output is this rank's partial sum, all-reduced here. The checkpoint's
per-expert tensors load through `weight_loader(param, tensor, shard_id, expert_id)` with shard
ids "w1" (gate), "w3" (up), "w2" (down); a checkpoint whose experts are stacked already (DBRX:
[E * I, hidden] each, its down projection transposed: shard id "w2_t") loads with expert_id
None.

Execution: the T * k (token, expert) pairs are sorted by expert, so each active expert runs one
matmul over its contiguous rows (no per-token Python loop), and the weighted rows are summed
back into their tokens with one `index_add_` (a token's experts in ascending id). Only the active
experts' weights are read. With the compiled CPU kernels and fp32 weights, each expert's matrices
are packed after loading as 16-column tiles (`w13_packed` [E, ceil(2I/16), hidden, 16],
`w2_packed` [E, ceil(hidden/16), I, 16], replacing the stacked tensors) and run on the dense
layers' row-invariant packed GEMM; the fused CPU decode stack reads the same tiles
(`fused_decode_tensors`).
"""

from __future__ import annotations

import torch
from torch import nn

from pytgi.distributed.comm import tp_all_reduce
from pytgi.errors import ModelLoadError
from pytgi.layers.activation import get_activation
from pytgi.layers.build_context import current_build_context
from pytgi.layers.linear import (
    MergedColumnParallelLinear,
    RowParallelLinear,
    divide,
    load_part,
)
from pytgi.layers.quantization.base import QuantConfig, set_weight_attrs
from pytgi.layers.quantization.unquantized import pack_column_tiles

GATE, UP, DOWN = "w1", "w3", "w2"
DOWN_TRANSPOSED = "w2_t"  # a stacked down projection stored [E * I, hidden] (DBRX)
# every expert's [in, out] matrices stacked (Llama 4): gate and up as [E, hidden, 2 * I]
# (each expert's gate columns, then its up columns), down as [E, I, hidden]
GATE_UP_STACKED, DOWN_STACKED = "w13_in_out", "w2_in_out"


def group_by_expert(x: torch.Tensor, ids: torch.Tensor, num_experts: int):
    """x [T, hidden], ids [T, k] -> (rows [T * k, hidden] sorted by expert, the token of each
    row [T * k], the sorting order [T * k], per-expert row counts (host list))."""
    order = ids.flatten().argsort(stable=True)  # pairs grouped by expert
    counts = torch.bincount(ids.flatten(), minlength=num_experts).tolist()
    tokens = order // ids.shape[1]
    return x.index_select(0, tokens), tokens, order, counts


def scale_rows(rows: torch.Tensor, weights: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """rows [T * k, hidden] (sorted by expert) times their pair's weight (weights [T, k])."""
    return rows * weights.flatten()[order].to(rows.dtype).unsqueeze(1)


def combine(x, out, weights, tokens, order) -> torch.Tensor:
    """The expert rows out [T * k, hidden], weighted unless `weights` is None, summed back into
    their tokens: [T, hidden]."""
    if weights is not None:
        out = scale_rows(out, weights, order)
    return torch.zeros_like(x).index_add_(0, tokens, out)


class FusedExperts(nn.Module):
    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, act: str):
        super().__init__()
        context = current_build_context()
        self.tp, self.kernels = context.tp, context.kernels
        self.num_experts, self.hidden_size = num_experts, hidden_size
        self.intermediate = divide(
            intermediate_size, self.tp.world_size, "expert intermediate size"
        )
        dtype = torch.get_default_dtype()
        self.w13_weight = nn.Parameter(
            torch.empty(num_experts, 2 * self.intermediate, hidden_size, dtype=dtype),
            requires_grad=False,
        )
        self.w2_weight = nn.Parameter(
            torch.empty(num_experts, hidden_size, self.intermediate, dtype=dtype),
            requires_grad=False,
        )
        for param in (self.w13_weight, self.w2_weight):
            set_weight_attrs(param, weight_loader=self.weight_loader)
        self.act_fn = get_activation(act, gated=True)
        self.w13_packed = self.w2_packed = None  # the packed tiles, once loaded (see above)

    def process_weights_after_loading(self) -> None:
        weight = self.w13_weight
        if self.w13_packed is not None or self.kernels is None:
            return
        if weight.device.type != "cpu" or weight.dtype != torch.float32:
            return
        self.w13_packed = torch.stack([pack_column_tiles(w) for w in weight.data])
        self.w2_packed = torch.stack([pack_column_tiles(w) for w in self.w2_weight.data])
        for param in (self.w13_weight, self.w2_weight):  # the tiles hold them now
            param.data = param.data.new_empty(self.num_experts, 0, param.shape[2])

    def fused_decode_tensors(self) -> dict[str, torch.Tensor] | None:
        """The packed experts as the fused decode stack takes them (`moe.gate_up`, `moe.down`);
        None when they are not packed (no kernels, not fp32) or split over ranks."""
        if self.w13_packed is None or self.tp.world_size != 1:
            return None
        return {"moe.gate_up": self.w13_packed, "moe.down": self.w2_packed}

    def _expert_mlp(self, expert: int, rows: torch.Tensor, out: torch.Tensor) -> None:
        """out [n, hidden] = down(act(gate_up(rows))) of one expert, rows [n, hidden]."""
        if self.w13_packed is None:
            h = self.act_fn(rows @ self.w13_weight[expert].t())  # [n, I]
            torch.matmul(h, self.w2_weight[expert].t(), out=out)
            return
        up = self.kernels.linear_packed(rows, self.w13_packed[expert])  # [n, ceil(2I/16) * 16]
        h = self.act_fn(up[:, : 2 * self.intermediate].contiguous())  # [n, I]
        out.copy_(self.kernels.linear_packed(h, self.w2_packed[expert])[:, : self.hidden_size])

    def weight_loader(
        self, param, loaded: torch.Tensor, shard_id: str, expert_id: int | None = None
    ) -> None:
        """One expert's full checkpoint tensor: gate / up [I, hidden], down [hidden, I]; with
        expert_id None, every expert's stacked along the first dimension."""
        if expert_id is None and shard_id in (GATE_UP_STACKED, DOWN_STACKED):
            self._load_in_out(param, loaded, shard_id)
            return
        if expert_id is None:
            self._load_stacked(param, loaded, shard_id)
            return
        rank, world = self.tp.rank, self.tp.world_size
        size = self.intermediate
        if shard_id == DOWN:
            load_part(param.data[expert_id], loaded, 1, rank, world)
        elif shard_id in (GATE, UP):
            offset = 0 if shard_id == GATE else size
            load_part(param.data[expert_id].narrow(0, offset, size), loaded, 0, rank, world)
        else:
            raise ModelLoadError(f"unknown expert shard '{shard_id}'")

    def _load_stacked(self, param, loaded: torch.Tensor, shard_id: str) -> None:
        """Every expert's tensor at once, [E * I, hidden] (gate, up, transposed down)."""
        if loaded.dim() != 2 or loaded.shape[0] % self.num_experts:
            raise ModelLoadError(
                f"checkpoint shape {tuple(loaded.shape)}: not {self.num_experts} stacked experts"
            )
        experts = loaded.unflatten(0, (self.num_experts, -1))  # [E, I, hidden]
        if shard_id == DOWN_TRANSPOSED:
            experts, shard_id = experts.transpose(1, 2), DOWN  # [E, hidden, I]
        for expert_id in range(self.num_experts):
            self.weight_loader(param, experts[expert_id], shard_id, expert_id)

    def _load_in_out(self, param, loaded: torch.Tensor, shard_id: str) -> None:
        """Every expert's [in, out] matrix at once: [E, hidden, 2 * I] or [E, I, hidden]."""
        if loaded.dim() != 3 or loaded.shape[0] != self.num_experts:
            raise ModelLoadError(
                f"checkpoint shape {tuple(loaded.shape)}: not {self.num_experts} stacked experts"
            )
        for expert_id in range(self.num_experts):
            weight = loaded[expert_id].t()  # [out, in]
            if shard_id == DOWN_STACKED:
                self.weight_loader(param, weight, DOWN, expert_id)
                continue
            gate, up = weight.chunk(2, dim=0)  # [I, hidden] each
            self.weight_loader(param, gate, GATE, expert_id)
            self.weight_loader(param, up, UP, expert_id)

    def forward(
        self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, scale_input: bool = False
    ) -> torch.Tensor:
        """x [T, hidden], weights [T, k] (fp32), ids [T, k] -> [T, hidden]: sum over each
        token's k experts of weight * down(act(gate(x)) * up(x)) (with `scale_input`:
        down(act(gate(w * x)) * up(w * x)), Llama 4)."""
        rows, tokens, order, counts = group_by_expert(x, ids, self.num_experts)
        if scale_input:
            rows, weights = scale_rows(rows, weights, order), None
        out = torch.empty_like(rows)  # [T * k, hidden]
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            end = start + count
            self._expert_mlp(expert, rows[start:end], out[start:end])
            start = end
        result = combine(x, out, weights, tokens, order)  # [T, hidden]
        return tp_all_reduce(result) if self.tp.world_size > 1 else result


class ExpertMLP(nn.Module):
    """One expert as quantized linear layers (`gate_up_proj`, `down_proj`, checkpoint names
    `experts.{e}.gate_proj` / `up_proj` / `down_proj`)."""

    def __init__(self, hidden_size, intermediate_size, quant_config: QuantConfig, prefix: str):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size,
            [intermediate_size] * 2,
            quant_config=quant_config,
            prefix=f"{prefix}.gate_up_proj",
        )
        self.down_proj = RowParallelLinear(
            intermediate_size, hidden_size, quant_config=quant_config, prefix=f"{prefix}.down_proj"
        )


class QuantizedExperts(nn.ModuleList):
    """The routed experts under a `--quantize` method: one quantized gate_up / down pair per
    expert (the method's own kernels), grouped as `FusedExperts` groups them; one all-reduce."""

    def __init__(self, num_experts, hidden_size, intermediate_size, act, quant_config, prefix):
        super().__init__(
            ExpertMLP(hidden_size, intermediate_size, quant_config, f"{prefix}.{e}")
            for e in range(num_experts)
        )
        self.tp = current_build_context().tp
        self.act_fn = get_activation(act, gated=True)

    def fused_decode_tensors(self) -> None:
        """The fused decode stack's MoE MLP runs fp32 tiles only: quantized experts keep the
        model layer by layer."""
        return None

    def forward(
        self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, scale_input: bool = False
    ) -> torch.Tensor:
        rows, tokens, order, counts = group_by_expert(x, ids, len(self))
        if scale_input:
            rows, weights = scale_rows(rows, weights, order), None
        outs, start = [], 0
        for expert, count in zip(self, counts, strict=True):
            if count == 0:
                continue
            h = self.act_fn(expert.gate_up_proj(rows[start : start + count]))  # [n, 2I] -> [n, I]
            down = expert.down_proj
            outs.append(down.quant_method.apply(down, h))  # [n, hidden], partial under TP
            start += count
        result = combine(x, torch.cat(outs), weights, tokens, order)  # [T, hidden]
        return tp_all_reduce(result) if self.tp.world_size > 1 else result
