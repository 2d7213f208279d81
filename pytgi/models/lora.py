"""Loads PEFT LoRA adapters (`adapter_config.json`, `adapter_model.safetensors`) onto a built model.

Each adapter tensor `base_model.model.<module>.lora_{A,B}.weight` is mapped as the base
checkpoint's `<module>.weight` would be (`models.loader.WeightMapper`: renames and packed q/k/v,
gate/up shards), so an adapter targets whatever linear layer that weight loads into; the layer's
own `weight_loader` takes this rank's part of B (column-parallel) or of A (row-parallel), as for
the base weight. Scaling follows PEFT: `lora_alpha / r`, or `/ sqrt(r)` with `use_rslora`, with
`rank_pattern` / `alpha_pattern` matched against the module name as PEFT matches them.
What PEFT can save and this loader does not apply (DoRA, `modules_to_save`, bias terms, embedding
or LM-head adapters, other PEFT methods) is refused in one line.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch

from pytgi.errors import ModelLoadError
from pytgi.layers.linear import LinearBase, RowParallelLinear
from pytgi.layers.lora import LoRAWeights
from pytgi.models.base import CausalLM
from pytgi.models.loader import WeightMapper

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_KEY = re.compile(
    r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.[^.]+)?\.weight$"
)


@dataclass(frozen=True)
class AdapterConfig:
    r: int
    lora_alpha: float
    use_rslora: bool
    rank_pattern: dict
    alpha_pattern: dict

    def scaling(self, module: str, rank: int) -> float:
        """PEFT's scaling of `module` (its name in the HF model), whose A has `rank` rows."""
        alpha = self.alpha_pattern.get(_pattern_key(self.alpha_pattern, module), self.lora_alpha)
        return alpha / math.sqrt(rank) if self.use_rslora else alpha / rank


def _pattern_key(patterns: dict, module: str) -> str:
    """PEFT's `get_pattern_key`: the first pattern matching the end of the module name."""
    for key in patterns:
        if re.match(rf"(.*\.)?({key})$", module):
            return key
    return module


def read_adapter_config(adapter_dir: Path, adapter_id: str) -> AdapterConfig:
    path = adapter_dir / CONFIG_FILE
    if not path.is_file():
        raise ModelLoadError(f"LoRA adapter '{adapter_id}': no {CONFIG_FILE} in {adapter_dir}")
    raw = json.loads(path.read_text())
    refusals = {
        "peft_type": raw.get("peft_type", "LORA") != "LORA",
        "use_dora": bool(raw.get("use_dora")),
        "modules_to_save": bool(raw.get("modules_to_save")),
        "bias": raw.get("bias", "none") != "none" or bool(raw.get("lora_bias")),
        "trainable_token_indices": bool(raw.get("trainable_token_indices")),
        "target_parameters": bool(raw.get("target_parameters")),
        "layer_replication": bool(raw.get("layer_replication")),
        "alora_invocation_tokens": bool(raw.get("alora_invocation_tokens")),
        "use_qalora": bool(raw.get("use_qalora")),
        "use_bdlora": bool(raw.get("use_bdlora")),
    }
    refused = [name for name, bad in refusals.items() if bad]
    if refused:
        raise ModelLoadError(
            f"LoRA adapter '{adapter_id}': {refused[0]}={raw.get(refused[0])!r} is not supported "
            "(pytgi serves plain LoRA on linear layers)"
        )
    return AdapterConfig(
        r=int(raw.get("r", 8)),
        lora_alpha=float(raw.get("lora_alpha", 8)),
        use_rslora=bool(raw.get("use_rslora")),
        rank_pattern=dict(raw.get("rank_pattern") or {}),
        alpha_pattern=dict(raw.get("alpha_pattern") or {}),
    )


def load_lora_adapters(
    model: CausalLM, adapters: list[tuple[str, Path]], dtype: torch.dtype, device: torch.device
) -> dict[str, int]:
    """Load every (id, directory) adapter into the model's linear layers; adapter id -> slot."""
    slots = {}
    for slot, (adapter_id, adapter_dir) in enumerate(adapters, start=1):
        _load_one(model, adapter_id, Path(adapter_dir), slot, dtype, device)
        slots[adapter_id] = slot
    return slots


def _load_one(model, adapter_id, adapter_dir: Path, slot: int, dtype, device) -> None:
    from safetensors.torch import load_file

    config = read_adapter_config(adapter_dir, adapter_id)
    weights_path = adapter_dir / WEIGHTS_FILE
    if not weights_path.is_file():
        raise ModelLoadError(f"LoRA adapter '{adapter_id}': no {WEIGHTS_FILE} in {adapter_dir}")
    pairs: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
    for name, tensor in load_file(weights_path).items():
        match = _KEY.match(name)
        if match is None:
            raise ModelLoadError(f"LoRA adapter '{adapter_id}': tensor '{name}' is not supported")
        pairs[match["module"]][match["ab"]] = tensor
    mapper = WeightMapper(model)
    per_layer: dict[str, list] = defaultdict(list)  # layer name -> [(shard id, A, scaled B)]
    for module, ab in pairs.items():
        if set(ab) != {"A", "B"}:
            raise ModelLoadError(f"LoRA adapter '{adapter_id}': '{module}' lacks lora_A or lora_B")
        layer_name, shard_id = _target(model, mapper, adapter_id, module)
        a, b = ab["A"].to(dtype), ab["B"].to(dtype)
        scale = config.scaling(module, a.shape[0])
        per_layer[layer_name].append((shard_id, a, b * scale))
    for layer_name, shards in per_layer.items():
        layer = model.get_submodule(layer_name)
        try:
            layer.lora_adapters[slot] = _shard_weights(layer, shards, device)
        except ModelLoadError as e:
            raise ModelLoadError(
                f"LoRA adapter '{adapter_id}', {layer_name}: {e.message}"
            ) from None


def _target(model, mapper: WeightMapper, adapter_id: str, module: str) -> tuple[str, object]:
    """The linear layer (and its shard) that `module`'s base weight loads into."""
    target = mapper.target(f"{module}.weight")
    layer = None
    if target is not None and target.expert_id is None:
        layer_name = target.param_name.rsplit(".", 1)[0]
        try:
            layer = model.get_submodule(layer_name)
        except AttributeError:
            layer = None
    if not isinstance(layer, LinearBase):
        raise ModelLoadError(
            f"LoRA adapter '{adapter_id}' targets '{module}', which is not a linear layer pytgi "
            "can adapt (attention and MLP projections are)"
        )
    return layer_name, target.shard_id


def _shard_weights(layer: LinearBase, shards: list, device: torch.device) -> LoRAWeights:
    """This rank's A [r_total, in_local] and block-diagonal scaled B [out_local, r_total] for a
    layer whose shards (q/k/v, gate/up, or the whole layer) carry their own A and B."""
    ranks = [a.shape[0] for _, a, _ in shards]
    if isinstance(layer, RowParallelLinear):
        ((_, a_full, b),) = shards  # row-parallel layers are never fused
        a = _empty(a_full.shape[0], layer.input_size, a_full, device, input_dim=1)
        layer.weight_loader(a, a_full)
        return LoRAWeights(a, b.to(device))
    b = torch.zeros(layer.output_size, sum(ranks), dtype=shards[0][2].dtype, device=device)
    offset = 0
    for (shard_id, _, b_full), rank in zip(shards, ranks, strict=True):
        part = b[:, offset : offset + rank]
        part.output_dim = 0
        layer.weight_loader(part, b_full, shard_id)
        offset += rank
    a = torch.cat([a for _, a, _ in shards]).to(device)  # [r_total, in]
    if a.shape[1] != layer.input_size:
        raise ModelLoadError(
            f"lora_A has {a.shape[1]} input features, the layer {layer.input_size}"
        )
    return LoRAWeights(a, b)


def _empty(rows: int, cols: int, like: torch.Tensor, device, input_dim: int) -> torch.Tensor:
    out = torch.empty(rows, cols, dtype=like.dtype, device=device)
    out.input_dim = input_dim
    return out
