"""Builds a model from a checkpoint directory: config -> spec -> class (registry) -> weights.

`WeightMapper` turns each checkpoint tensor's name into (parameter, shard id, expert id) by the
model's declarations (`models.base.CausalLM`): ignored names, renames, transposes, stacked experts,
packed q/k/v and gate/up shards. Every parameter's own `weight_loader` checks shapes and takes its
TP shard. Unknown tensors, missing tensors (named as the checkpoint would name them: the missing
shard or expert included) and shape mismatches are `ModelLoadError`s.

KV-cache scales (`<attention module>.k_scale` / `.v_scale`, or the legacy shared `.kv_scale`:
scalars, as TGI reads them) are no parameters: they go to the attention layer under that module
(`Attention.set_kv_scales`); one that names no attention layer is an unexpected tensor.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from pytgi.backends.base import KV_CACHE_TORCH_DTYPES, KVScales
from pytgi.config import ModelConfig
from pytgi.errors import ConfigError, ModelLoadError
from pytgi.layers.attention import Attention
from pytgi.layers.build_context import BuildContext, build_context
from pytgi.layers.linear import load_part
from pytgi.models.base import CausalLM
from pytgi.models.config import (
    ModelSpec,
    has_remote_causal_lm,
    load_hf_config,
    override_rope_scaling,
)
from pytgi.models.registry import get_model_class, resolve_architecture

logger = logging.getLogger(__name__)


KV_SCALE_NAME = re.compile(r"^(?P<module>.+)\.(?P<which>k_scale|v_scale|kv_scale)$")


def default_weight_loader(param: torch.nn.Parameter, loaded: torch.Tensor) -> None:
    load_part(param.data, loaded, None, 0, 1)


@dataclass(frozen=True)
class Target:
    """Where one checkpoint tensor goes."""

    param_name: str
    shard_id: Any = None
    expert_id: int | None = None
    transpose: bool = False

    @property
    def key(self) -> tuple:
        return (self.param_name, self.shard_id, self.expert_id)


class WeightMapper:
    def __init__(self, model: CausalLM):
        self.model = model
        self.renames = [(re.compile(p), r) for p, r in model.weight_renames]
        self.transposed = [re.compile(p) for p in model.transposed_weights]
        self.packed = model.packed_modules_mapping
        self.experts = model.expert_weight_mapping()

    def target(self, name: str) -> Target | None:
        """The parameter for checkpoint tensor `name`; None when the model ignores it."""
        if self.model.is_ignored_weight(name):
            return None
        for pattern, replacement in self.renames:
            name = pattern.sub(replacement, name)
        transpose = any(p.search(name) for p in self.transposed)
        for param_fragment, ckpt_fragment, expert_id, shard_id in self.experts:
            if ckpt_fragment in name:
                param_name = name.replace(ckpt_fragment, param_fragment)
                return Target(param_name, shard_id, expert_id, transpose)
        for ckpt_module, (fused_module, shard_id) in self.packed.items():
            if f".{ckpt_module}." in name:
                param_name = name.replace(f".{ckpt_module}.", f".{fused_module}.")
                return Target(param_name, shard_id, None, transpose)
        return Target(name, None, None, transpose)

    def required(self) -> dict[tuple, str]:
        """Every (parameter, shard, expert) the checkpoint must provide -> its checkpoint name."""
        params = dict(self.model.named_parameters())
        required: dict[tuple, str] = {}
        covered: set[str] = set()
        for param_fragment, ckpt_fragment, expert_id, shard_id in self.experts:
            for name in params:
                if param_fragment in name:
                    ckpt = name.replace(param_fragment, ckpt_fragment)
                    required[(name, shard_id, expert_id)] = ckpt
                    covered.add(name)
        for ckpt_module, (fused_module, shard_id) in self.packed.items():
            for name in params:
                if f".{fused_module}." in name and name not in covered:
                    ckpt = name.replace(f".{fused_module}.", f".{ckpt_module}.")
                    required[(name, shard_id, None)] = ckpt
        packed_params = {k[0] for k in required}
        for name in params:
            if name not in packed_params:
                required[(name, None, None)] = name
        return required


def check_checkpoint_names(model: CausalLM, names: Iterable[str]) -> None:
    """The checks of `load_weights` on the checkpoint's tensor names alone, before any tensor is
    read: every name has a parameter (or is ignored) and every parameter gets its tensors."""
    params = dict(model.named_parameters())
    mapper = WeightMapper(model)
    found = set()
    for name in names:
        if KV_SCALE_NAME.match(name):
            continue  # checked when the scales are applied
        target = mapper.target(name)
        if target is not None:
            _check_known(params, target, name)
            found.add(target.key)
    _check_complete(mapper, found)


def load_weights(model: CausalLM, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    params = dict(model.named_parameters())
    mapper = WeightMapper(model)
    loaded: set[tuple] = set()
    kv_scales: dict[str, dict[str, float]] = {}  # attention module -> {k_scale, v_scale, kv_scale}
    for name, tensor in weights:
        if (scale := KV_SCALE_NAME.match(name)) is not None:
            kv_scales.setdefault(scale["module"], {})[scale["which"]] = _scalar(tensor, name)
            continue
        target = mapper.target(name)
        if target is None:
            continue
        param = _check_known(params, target, name)
        # a quantized piece is already [out, in], whatever the checkpoint's float layout
        transpose = target.transpose and isinstance(tensor, torch.Tensor)
        _load_one(param, tensor.t() if transpose else tensor, target, name)
        loaded.add(target.key)
    _check_complete(mapper, loaded)
    _apply_kv_scales(model, mapper, kv_scales)
    for module in model.modules():  # repacking for the kernels, once every tensor is in
        if hasattr(module, "quant_method"):
            module.quant_method.process_weights_after_loading(module)
        elif hasattr(module, "process_weights_after_loading"):
            module.process_weights_after_loading()


def _scalar(tensor: torch.Tensor, name: str) -> float:
    if tensor.numel() != 1:
        raise ModelLoadError(f"KV cache scale '{name}' must be a scalar, got {tuple(tensor.shape)}")
    return float(tensor.float().reshape(()))


def _apply_kv_scales(model: CausalLM, mapper: WeightMapper, found: dict[str, dict]) -> None:
    """Each attention module's scales to the Attention layer at or under it (after the model's
    renames): k_scale and v_scale together, else kv_scale for both (TGI's order), else 1.0."""
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    for module, scales in found.items():
        renamed = module + ".k_scale"
        for pattern, replacement in mapper.renames:
            renamed = pattern.sub(replacement, renamed)
        prefix = renamed.removesuffix(".k_scale")
        owners = [
            a for a in layers if a.layer_name == prefix or a.layer_name.startswith(prefix + ".")
        ]
        if len(owners) != 1:
            raise ModelLoadError(
                f"unexpected tensor '{module}.{next(iter(scales))}' in the checkpoint"
            )
        if "k_scale" in scales and "v_scale" in scales:
            owners[0].set_kv_scales(KVScales(scales["k_scale"], scales["v_scale"]))
        elif "kv_scale" in scales:
            owners[0].set_kv_scales(KVScales(scales["kv_scale"], scales["kv_scale"]))


def checkpoint_kv_cache_dtype(hf_config) -> torch.dtype | None:
    """The KV cache a compressed-tensors checkpoint asks for (`kv_cache_scheme`): an 8-bit float
    scheme is fp8_e4m3fn, as in TGI; any other scheme is refused; None when it declares none."""
    scheme = (getattr(hf_config, "quantization_config", None) or {}).get("kv_cache_scheme")
    if not scheme:
        return None
    if scheme.get("type") == "float" and scheme.get("num_bits") == 8:
        return KV_CACHE_TORCH_DTYPES["fp8_e4m3fn"]
    raise ModelLoadError(
        f"the checkpoint's kv_cache_scheme ({scheme.get('type')}, {scheme.get('num_bits')} bits) "
        "is not supported (pytgi runs an 8-bit float KV cache scheme only)"
    )


def _check_known(params: dict, target: Target, name: str):
    param = params.get(target.param_name)
    if param is None:
        raise ModelLoadError(f"unexpected tensor '{name}' in the checkpoint")
    return param


def _check_complete(mapper: WeightMapper, found: set[tuple]) -> None:
    missing = sorted(ckpt for key, ckpt in mapper.required().items() if key not in found)
    if missing:
        shown = ", ".join(missing[:8]) + (
            f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        )
        raise ModelLoadError(f"the checkpoint is missing {len(missing)} tensor(s): {shown}")


def _load_one(param, tensor: torch.Tensor, target: Target, name: str) -> None:
    weight_loader = getattr(param, "weight_loader", default_weight_loader)
    try:
        if target.expert_id is not None:
            weight_loader(param, tensor, target.shard_id, target.expert_id)
        elif target.shard_id is not None:
            weight_loader(param, tensor, target.shard_id)
        else:
            weight_loader(param, tensor)
    except ModelLoadError as e:
        raise ModelLoadError(f"tensor '{name}': {e.message}") from None


@contextmanager
def _default_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _quant_config(model_config: ModelConfig, dtype: torch.dtype, platform: str):
    if not model_config.quantize:
        return None
    from pytgi.layers.quantization.registry import resolve_quant_config

    return resolve_quant_config(
        model_config.quantize,
        None,
        dtype,
        model_config.quantize_activations,
        quantize_lm_head=model_config.quantize_lm_head,
        platform=platform,
    )


class _Checkpoint:
    """The weights of a model directory: safetensors files, or the GGUF file a prepared
    directory names (models/gguf/prepared.py), with the quant config its types imply."""

    def __init__(self, model_config: ModelConfig, model_dir: Path):
        from pytgi.models.gguf.prepared import gguf_source

        self.model_config, self.model_dir = model_config, model_dir
        self.gguf_path = gguf_source(model_dir)
        self.gguf = None
        self.prequantized = None  # PrequantizedTensors of a GPTQ / AWQ / ... checkpoint
        self.files: list[Path] = []
        if self.gguf_path is not None:
            from pytgi.models.gguf.checkpoint import GGUFCheckpoint

            self.gguf = GGUFCheckpoint(self.gguf_path)
        else:
            from pytgi.models.weights import list_weight_files

            weights_dir = Path(model_config.weights_dir or model_dir)  # --weights-cache-override
            self.files = list_weight_files(weights_dir, model_config.allow_pickle_weights)

    def quant_config(
        self, hf_config, dtype: torch.dtype, model_class: type[CausalLM], platform: str = "cpu"
    ):
        if self.gguf is None:
            return self._prequantized_config(dtype, model_class, platform) or _quant_config(
                self.model_config, dtype, platform
            )
        from pytgi.layers.quantization.gguf import GGUFQuantConfig
        from pytgi.layers.quantization.registry import activation_policy, check_gguf_options

        check_gguf_options(self.model_config.quantize, dtype)
        types = self.gguf.hf_tensor_types()
        policy = activation_policy("gguf", self.model_config.quantize_activations)
        return GGUFQuantConfig(types, model_class.packed_modules_mapping, policy)

    def _prequantized_config(
        self, dtype: torch.dtype, model_class: type[CausalLM], platform: str = "cpu"
    ):
        """The quant config of a checkpoint stored quantized (config.json's
        quantization_config, quantize_config.json, quant_config.json), else None."""
        from pytgi.layers.quantization.detect import read_checkpoint_quant

        quant = read_checkpoint_quant(self.model_dir)
        if quant is None:
            return None
        from pytgi.layers.quantization.prequantized import prequantized_setup
        from pytgi.layers.quantization.registry import check_prequantized_options

        policy = check_prequantized_options(
            quant, self.model_config.quantize, dtype, self.model_config.quantize_activations,
            platform,
        )  # fmt: skip
        self.prequantized, config = prequantized_setup(
            quant, self._file_names(), model_class, policy
        )
        return config

    def _file_names(self) -> list[str]:
        from pytgi.models.weights import tensor_names

        return tensor_names(self.files)

    def names(self) -> list[str]:
        if self.prequantized is not None:
            return self.prequantized.names()
        if self.gguf is not None:
            return list(self.gguf.hf_tensor_types())
        return self._file_names()

    def tensors(self) -> Iterable[tuple[str, Any]]:
        if self.gguf is not None:
            return self.gguf.iter_weights()
        from pytgi.models.weights import iter_files

        if self.prequantized is not None:
            return self.prequantized.tensors(iter_files(self.files))
        return iter_files(self.files)

    @property
    def source(self) -> str:
        if self.gguf_path is not None:
            return str(self.gguf_path)
        return str(self.model_config.weights_dir or self.model_dir)

    def close(self) -> None:
        if self.gguf is not None:
            self.gguf.close()


def build_model(
    model_config: ModelConfig, model_dir: Path, context: BuildContext, device: torch.device
) -> tuple[CausalLM, ModelSpec]:
    """Instantiate the registered class for the checkpoint and load this rank's weights; every
    layer picks its implementation from `context` (the platform's decisions) while it is built."""
    hf_config = load_hf_config(model_dir, model_config.trust_remote_code)
    if model_config.rope_scaling is not None:
        override_rope_scaling(hf_config, *model_config.rope_scaling)
    architecture, entry = resolve_architecture(
        getattr(hf_config, "architectures", None),
        model_config.implementation,
        remote_code=model_config.trust_remote_code and has_remote_causal_lm(hf_config),
    )
    model_class = get_model_class(entry)
    spec = model_class.spec_from_hf(hf_config, architecture, entry.flags)
    if context.kv_cache_dtype is None:
        context = replace(context, kv_cache_dtype=checkpoint_kv_cache_dtype(hf_config))
    dtype = context.dtype
    checkpoint = _Checkpoint(model_config, model_dir)
    if checkpoint.gguf is not None and context.platform_name != "cpu":
        checkpoint.close()
        raise ConfigError(gguf_platform_error(context.platform_name))
    quant_config = checkpoint.quant_config(hf_config, dtype, model_class, context.platform_name)
    with _default_dtype(dtype), torch.device(device), build_context(context):
        model = model_class(spec, quant_config)
    check_checkpoint_names(model, checkpoint.names())  # a missing tensor: refused before reading
    load_weights(model, checkpoint.tensors())
    checkpoint.close()
    release_freed_memory()
    quantized = f", {quant_config.name} weights" if quant_config is not None else ""
    logger.info(
        "loaded %s (%s implementation, %s%s, %d layers) from %s",
        architecture, entry.implementation, dtype, quantized, spec.num_layers, checkpoint.source,
    )  # fmt: skip
    return model.eval(), spec


def gguf_platform_error(platform: str) -> str:
    return (
        f"GGUF models run on pytgi's CPU kernels only, and this engine runs on {platform} "
        "(PYTGI_DEVICE=cpu serves them)"
    )


def release_freed_memory() -> None:
    """Hand the heap's freed loading temporaries back to the OS (glibc's malloc_trim): without it
    the resident set keeps ~40-140 MiB of them (docs/PERFORMANCE.md, "Resident memory")."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    name = ctypes.util.find_library("c")
    if name is None:
        return
    libc = ctypes.CDLL(name)
    if hasattr(libc, "malloc_trim"):  # glibc only
        libc.malloc_trim(0)
