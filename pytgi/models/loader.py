"""Builds a model from a checkpoint directory: config -> spec -> class (registry) -> weights.

The loader only streams tensors and maps checkpoint names to parameters (including the model's
packed q/k/v and gate/up shards); every parameter's own `weight_loader` checks shapes and takes its
TP shard. Unknown tensors, missing tensors and shape mismatches are `ModelLoadError`s naming the
tensor.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from pytgi.config import ModelConfig
from pytgi.errors import ModelLoadError
from pytgi.layers.linear import load_part
from pytgi.models.config import ModelSpec, load_hf_config, model_spec_from_hf
from pytgi.models.registry import get_model_class, resolve_architecture

logger = logging.getLogger(__name__)


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
    load_part(param.data, loaded, None, 0, 1)


def _map_name(name: str, packed: dict[str, tuple[str, object]]) -> tuple[str, object]:
    for ckpt_module, (fused_module, shard_id) in packed.items():
        if f".{ckpt_module}." in name:
            return name.replace(f".{ckpt_module}.", f".{fused_module}."), shard_id
    return name, None


def _required(model: nn.Module, packed: dict) -> set[tuple[str, object]]:
    """(parameter name, shard id) pairs the checkpoint must provide."""
    shards: dict[str, list] = {}
    for fused_module, shard_id in packed.values():
        shards.setdefault(fused_module, []).append(shard_id)
    required = set()
    for name, _ in model.named_parameters():
        module_name = name.split(".")[-2] if "." in name else ""
        for shard_id in shards.get(module_name, [None]):
            required.add((name, shard_id))
    return required


def load_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    params = dict(model.named_parameters())
    packed = getattr(model, "packed_modules_mapping", {})
    loaded: set[tuple[str, object]] = set()
    for name, tensor in weights:
        if model.is_ignored_weight(name):
            continue
        param_name, shard_id = _map_name(name, packed)
        param = params.get(param_name)
        if param is None:
            raise ModelLoadError(f"unexpected tensor '{name}' in the checkpoint")
        weight_loader = getattr(param, "weight_loader", default_weight_loader)
        try:
            if shard_id is None:
                weight_loader(param, tensor)
            else:
                weight_loader(param, tensor, shard_id)
        except ModelLoadError as e:
            raise ModelLoadError(f"tensor '{name}': {e.message}") from None
        loaded.add((param_name, shard_id))
    missing = sorted(
        f"{n}" + (f" ({s})" if s is not None else "") for n, s in _required(model, packed) - loaded
    )
    if missing:
        shown = ", ".join(missing[:8]) + (
            f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        )
        raise ModelLoadError(f"the checkpoint is missing {len(missing)} tensor(s): {shown}")
    for module in model.modules():  # repacking for the kernels, once every tensor is in
        if hasattr(module, "quant_method"):
            module.quant_method.process_weights_after_loading(module)
        elif hasattr(module, "process_weights_after_loading"):
            module.process_weights_after_loading()


@contextmanager
def _default_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _quant_config(model_config: ModelConfig, hf_config):
    method = model_config.quantize or (getattr(hf_config, "quantization_config", None) or {}).get(
        "quant_method"
    )
    if method:
        raise ModelLoadError(f"quantization '{method}' is not supported by this model loader yet")
    return None


def build_model(
    model_config: ModelConfig, model_dir: Path, dtype: torch.dtype, device: torch.device
) -> tuple[nn.Module, ModelSpec]:
    """Instantiate the registered class for the checkpoint and load this rank's weights."""
    from pytgi.models.weights import iter_weights

    hf_config = load_hf_config(model_dir, model_config.trust_remote_code)
    architecture, entry = resolve_architecture(getattr(hf_config, "architectures", None))
    spec = model_spec_from_hf(hf_config, architecture, entry.flags)
    quant_config = _quant_config(model_config, hf_config)
    with _default_dtype(dtype), torch.device(device):
        model = get_model_class(entry)(spec, quant_config)
    load_weights(model, iter_weights(model_dir, allow_pickle=model_config.allow_pickle_weights))
    logger.info(
        "loaded %s (%s, %d layers) from %s", architecture, dtype, spec.num_layers, model_dir
    )
    return model.eval(), spec
