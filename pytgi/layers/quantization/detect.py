"""How a checkpoint is quantized, read as TGI reads it, and what pytgi refuses at start-up.

Torch-free (the launcher calls it before any engine starts). The quantization config is found,
as in TGI, in `config.json`'s `quantization_config` (or `compression_config`, the older
compressed-tensors key), else in `quantize_config.json` (AutoGPTQ / GPTQModel), else in
`quant_config.json` (AutoAWQ: `w_bit`, `q_group_size`, `zero_point`, `version`).

Methods served (layers/quantization/prequantized.py): `gptq` (checkpoint format v1 and v2),
`awq` (GEMM packing), `compressed-tensors` (pack-quantized, int-quantized, naive-quantized,
float-quantized) and pre-quantized fp8 (`fp8`, `fbgemm_fp8`, DeepSeek-style block scales).
Everything else is refused in one line naming the method (TGI only warns about an unknown one).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pytgi.errors import ConfigError

SERVED_METHODS = ("gptq", "awq", "compressed-tensors", "fp8")
# compressed-tensors formats served; the others are refused by name
CT_FORMATS = ("pack-quantized", "int-quantized", "naive-quantized", "float-quantized")
AWQ_VERSIONS = ("gemm", "exllama", "ipex")  # the versions that store AWQ's GEMM packing
GPTQ_FORMATS = ("gptq", "gptq_v2")
# --quantize values that name a pre-quantized method: they must agree with the checkpoint
PREQUANTIZED_FLAGS = ("gptq", "awq", "compressed-tensors", "fp8", "marlin", "exl2")

INSTEAD = (
    "serve the full-precision checkpoint (with --quantize for on-the-fly quantization), "
    "or a GPTQ, AWQ, compressed-tensors, FP8 or GGUF export of it"
)


@dataclass(frozen=True)
class CheckpointQuant:
    """A checkpoint's quantization, normalised. `method` is TGI's name for it (fbgemm_fp8 is
    "fp8"); `config` is the raw dict it was read from."""

    method: str
    source: str  # the file (and key) it was read from
    bits: int = 4
    group_size: int = -1
    desc_act: bool = False
    sym: bool = False
    checkpoint_format: str = "gptq"
    version: str = "gemm"
    config: dict = field(default_factory=dict, compare=False)


def read_checkpoint_quant(model_dir: Path, config: dict | None = None) -> CheckpointQuant | None:
    """The checkpoint's quantization (None: full precision). `config`: config.json's contents
    when the caller has read it."""
    model_dir = Path(model_dir)
    if config is None:
        config = _read_json(model_dir / "config.json") or {}
    for key in ("quantization_config", "compression_config"):
        data = config.get(key)
        if isinstance(data, dict) and data:
            return _normalise(data, f"config.json's {key}")
    data = _read_json(model_dir / "quantize_config.json")
    if data:
        return _normalise(data, "quantize_config.json", default_method="gptq")
    data = _read_json(model_dir / "quant_config.json")
    if data:
        return _normalise(data, "quant_config.json", default_method="awq")
    return None


def _read_json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"Cannot read {path}: {err}") from None
    return data if isinstance(data, dict) else None


def _normalise(data: dict, source: str, default_method: str | None = None) -> CheckpointQuant:
    method = str(data.get("quant_method") or default_method or "unknown").lower()
    version = str(data.get("version") or "gemm").lower()
    if method == "gptq" and version == "gemm" and "version" in data:
        method = "awq"  # TGI: a quantize_config.json with version GEMM is AWQ's
    if method == "fbgemm_fp8":
        method = "fp8"
    sym = data.get("sym")
    if sym is None and "zero_point" in data:
        sym = not data["zero_point"]
    return CheckpointQuant(
        method=method,
        source=source,
        bits=int(data.get("bits", data.get("w_bit", 4)) or 4),
        group_size=int(data.get("group_size", data.get("q_group_size", -1)) or -1),
        desc_act=bool(data.get("desc_act", False)),
        sym=bool(sym) if sym is not None else False,
        checkpoint_format=str(data.get("checkpoint_format") or "gptq").lower(),
        version=version,
        config=data,
    )


def check_checkpoint_quant(quant: CheckpointQuant, quantize: str | None) -> str:
    """Refuse, in one line, what pytgi cannot serve; returns the method's name for /info and the
    logs (TGI's `--quantize` spelling)."""
    method = quant.method
    if quantize is not None and quantize != method and not (quantize, method) == ("marlin", "gptq"):
        raise ConfigError(
            f"--quantize {quantize} does not match the checkpoint, which is quantized with "
            f"'{method}' ({quant.source}): drop --quantize or pass --quantize {method}"
        )
    if method not in SERVED_METHODS:
        raise ConfigError(_refusal(method))
    if method == "gptq":
        _check_gptq(quant)
    elif method == "awq":
        _check_awq(quant)
    elif method == "compressed-tensors":
        _check_compressed_tensors(quant.config)
    elif method == "fp8":
        _check_fp8(quant.config)
    return method


def check_quantize_needs_checkpoint(quantize: str | None) -> None:
    """`--quantize gptq` (etc.) on a full-precision checkpoint: TGI fails loading `qweight`."""
    if quantize in PREQUANTIZED_FLAGS and quantize != "fp8":
        raise ConfigError(
            f"--quantize {quantize} needs a checkpoint already quantized with {quantize} "
            "(config.json has no quantization_config)"
        )


def _refusal(method: str) -> str:
    known = {
        "exl2": "EXL2 checkpoints are not supported by pytgi",
        "bitsandbytes": "bitsandbytes-serialized checkpoints (saved with load_in_4bit / "
        "load_in_8bit) are not supported by pytgi",
        "marlin": "Marlin-format checkpoints are not supported by pytgi",
        "hqq": "HQQ checkpoints are not supported by pytgi",
        "aqlm": "AQLM checkpoints are not supported by pytgi",
        "eetq": "eetq-serialized checkpoints are not supported by pytgi",
    }
    head = known.get(method, f"checkpoints quantized with '{method}' are not supported by pytgi")
    return f"{head}: {INSTEAD}"


def _check_gptq(quant: CheckpointQuant) -> None:
    if quant.checkpoint_format not in GPTQ_FORMATS:
        raise ConfigError(
            f"GPTQ checkpoints in the '{quant.checkpoint_format}' format (Marlin-permuted) are "
            f"not supported by pytgi: {INSTEAD}"
        )
    if quant.bits not in (2, 3, 4, 8):
        raise ConfigError(f"GPTQ with {quant.bits} bits is not defined (2, 3, 4 or 8)")


def _check_awq(quant: CheckpointQuant) -> None:
    if quant.version not in AWQ_VERSIONS:
        raise ConfigError(
            f"AWQ checkpoints of version '{quant.version}' (not AWQ's GEMM packing) are not "
            f"supported by pytgi: {INSTEAD}"
        )
    if quant.bits != 4:
        raise ConfigError(f"AWQ with {quant.bits} bits is not supported by pytgi (4 bits only)")


def _check_compressed_tensors(config: dict) -> None:
    status = config.get("quantization_status")
    if status is not None and status not in ("compressed", "frozen"):
        raise ConfigError(f"Model quantization was not finished, status was: {status}")
    for name, group in _ct_groups(config).items():
        fmt = group.get("format") or config.get("format") or "dense"
        if fmt not in CT_FORMATS:
            raise ConfigError(
                f"compressed-tensors format '{fmt}' (config group {name}) is not supported by "
                f"pytgi (supported: {', '.join(CT_FORMATS)}): {INSTEAD}"
            )
        weights = group.get("weights") or {}
        kind = weights.get("type", "int")
        bits = weights.get("num_bits", 8)
        if kind == "float" and bits != 8:
            raise ConfigError(f"compressed-tensors float weights of {bits} bits are not supported")
        if weights.get("actorder") not in (None, "group", "weight", False):
            raise ConfigError(f"compressed-tensors actorder '{weights['actorder']}' is unknown")
    sparsity = config.get("sparsity_config") or {}
    if sparsity.get("format") not in (None, "dense"):
        raise ConfigError(
            f"compressed-tensors sparsity '{sparsity.get('format')}' is not supported by pytgi: "
            f"{INSTEAD}"
        )


def _ct_groups(config: dict) -> dict:
    groups = config.get("config_groups") or {}
    return {k: v for k, v in groups.items() if isinstance(v, dict)}


def ct_weight_bits(config: dict) -> set[int]:
    """The weight bit widths the config groups of a compressed-tensors config name."""
    return {int((g.get("weights") or {}).get("num_bits", 8)) for g in _ct_groups(config).values()}


def _check_fp8(config: dict) -> None:
    fmt = config.get("fmt", "e4m3")
    if fmt not in ("e4m3", "float8_e4m3fn"):
        raise ConfigError(f"fp8 checkpoints in '{fmt}' are not supported by pytgi (e4m3 only)")
