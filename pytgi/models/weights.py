"""Checkpoint tensors of a model directory, read lazily one tensor at a time.

Safetensors is the only format read for serving: a single `model.safetensors`, or the shards that
`model.safetensors.index.json` names (each must exist), else every `*.safetensors` of the directory.
Pickle `.bin` checkpoints are refused unless `allow_pickle` is set; then each is read with
`torch.load(weights_only=True)`, which refuses anything but tensors and plain containers, and
written once as safetensors next to it (or, when the directory is read-only, into the sibling
directory `<name>.pytgi-safetensors`). The converted index is written last: it marks a complete
conversion.
"""

from __future__ import annotations

import json
import os
import pickle
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from safetensors import SafetensorError, safe_open

from pytgi.errors import ModelLoadError
from pytgi.utils.hub import PICKLE_INDEX, SAFETENSORS_INDEX

if TYPE_CHECKING:  # torch is imported where tensors are read: finding files stays torch-free
    import torch

SINGLE_FILE = "model.safetensors"
CONVERTED_SUFFIX = ".pytgi-safetensors"


def iter_weights(model_dir: Path, allow_pickle: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """`(name, cpu tensor)` for every checkpoint tensor, read one at a time (peak: ~one tensor).

    The weight files are found (and pickles converted) when called, so a missing shard fails here,
    before the first tensor is read.
    """
    return iter_files(list_weight_files(Path(model_dir), allow_pickle))


def tensor_names(files: list[Path]) -> list[str]:
    """Every tensor name of the safetensors `files`, from their headers (no tensor is read)."""
    names = []
    for path in files:
        with _open(path) as handle:
            names.extend(handle.keys())
    return names


def list_weight_files(model_dir: Path, allow_pickle: bool = False) -> list[Path]:
    """The safetensors files to load, converting pickle `.bin` weights first when allowed."""
    files = find_weight_files(model_dir, allow_pickle)
    if files:
        return files
    return convert_pickle_weights(Path(model_dir))


def find_weight_files(model_dir: Path, allow_pickle: bool = False) -> list[Path]:
    """The safetensors files of `model_dir` (every file an index names must exist); [] when only
    pickle weights are there and `allow_pickle` lets them be converted. Reads no tensor, converts
    nothing and imports no torch, so the launcher can check a checkpoint up front."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelLoadError(f"Model directory `{model_dir}` does not exist")
    files = _safetensors_files(model_dir) or _safetensors_files(converted_dir(model_dir))
    if files:
        return files
    pickles = _pickle_files(model_dir)
    if not pickles:
        raise ModelLoadError(f"No safetensors weights found in {model_dir}")
    if not allow_pickle:
        raise ModelLoadError(
            f"No safetensors weights found in {model_dir}; it has pickle weights "
            f"({', '.join(p.name for p in pickles)}), which can run code when loaded. Convert them "
            "to safetensors, or pass --allow-pickle-weights to convert them with "
            "torch.load(weights_only=True)"
        )
    return []


def converted_dir(model_dir: Path) -> Path:
    """Where the safetensors converted from a read-only directory's pickle weights are written."""
    return model_dir.parent / f"{model_dir.name}{CONVERTED_SUFFIX}"


def convert_pickle_weights(model_dir: Path) -> list[Path]:
    """Convert the pickle `.bin` weights of `model_dir` to safetensors; returns the new files."""
    from safetensors.torch import save_file

    pickles = _pickle_files(model_dir)
    if not pickles:
        raise ModelLoadError(f"No pickle weights (pytorch_model*.bin) found in {model_dir}")
    out_dir = _output_dir(model_dir)
    weight_map: dict[str, str] = {}
    for src in pickles:
        name = src.name.replace("pytorch_model", "model", 1).removesuffix(".bin") + ".safetensors"
        state = _load_pickle(src)
        _save_atomic(out_dir / name, lambda tmp, s=state: save_file(s, tmp, {"format": "pt"}))
        weight_map.update(dict.fromkeys(state, name))
        del state
    index = json.dumps({"metadata": {"converted_from": "pickle"}, "weight_map": weight_map})
    _save_atomic(out_dir / SAFETENSORS_INDEX, lambda tmp: Path(tmp).write_text(index))
    return _safetensors_files(out_dir)


def _safetensors_files(directory: Path) -> list[Path]:
    if (directory / SAFETENSORS_INDEX).is_file():
        return _indexed_files(directory, SAFETENSORS_INDEX)
    if (directory / SINGLE_FILE).is_file():
        return [directory / SINGLE_FILE]
    if not directory.is_dir() or _pickle_files(directory):
        return []  # shards beside pickles without an index: an interrupted conversion
    return sorted(directory.glob("*.safetensors"))


def _pickle_files(directory: Path) -> list[Path]:
    if (directory / PICKLE_INDEX).is_file():
        return _indexed_files(directory, PICKLE_INDEX)
    return sorted(directory.glob("pytorch_model*.bin"))


def _indexed_files(directory: Path, index_name: str) -> list[Path]:
    """The files an index's `weight_map` names; each must exist inside `directory`."""
    index = directory / index_name
    try:
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ModelLoadError(f"Invalid weight index `{index}`: {err}") from err
    files = []
    for name in names:
        # checked lexically: hub snapshot files are symlinks into the cache's blobs/
        if not isinstance(name, str) or Path(name).is_absolute() or ".." in Path(name).parts:
            raise ModelLoadError(f"Weight file `{name}` in `{index}` is outside {directory}")
        if not (directory / name).is_file():
            raise ModelLoadError(f"Weight file `{name}` listed in `{index}` is missing")
        files.append(directory / name)
    return files


def iter_files(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """`(name, cpu tensor)` for every tensor of the safetensors `files`, one at a time."""
    seen: dict[str, Path] = {}
    for path in files:
        for name, tensor in _iter_file(path):
            if name in seen:
                raise ModelLoadError(f"Tensor `{name}` is in both `{seen[name]}` and `{path}`")
            seen[name] = path
            yield name, tensor


def _iter_file(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    with _open(path) as handle:
        for name in handle.keys():
            yield name, _get_tensor(handle, name, path)


def _open(path: Path):
    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except (SafetensorError, OSError) as err:
        raise ModelLoadError(f"Cannot read safetensors file `{path}`: {err}") from err


def _get_tensor(handle, name: str, path: Path) -> torch.Tensor:
    try:
        return handle.get_tensor(name)
    except (SafetensorError, OSError) as err:
        raise ModelLoadError(f"Cannot read tensor `{name}` from `{path}`: {err}") from err


def _load_pickle(path: Path) -> dict[str, torch.Tensor]:
    """A pickle state dict, with tensors that share storage (tied weights) copied apart."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ModelLoadError(f"Refusing to load pickle weights `{path}`: {reason}") from err
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise ModelLoadError(f"Pickle weights `{path}` are not a state dict of named tensors")
    storages: set[int] = set()
    for name, tensor in state.items():
        ptr = tensor.untyped_storage().data_ptr()
        state[name] = tensor.contiguous().clone() if ptr in storages else tensor.contiguous()
        storages.add(ptr)
    return state


def _output_dir(model_dir: Path) -> Path:
    if _is_writable(model_dir):
        return model_dir
    out_dir = converted_dir(model_dir)
    try:
        out_dir.mkdir(exist_ok=True)
    except OSError as err:
        raise ModelLoadError(
            f"Cannot write safetensors converted from {model_dir}: it is read-only and {err}"
        ) from err
    return out_dir


def _is_writable(directory: Path) -> bool:
    try:
        with tempfile.TemporaryFile(dir=directory):
            return True
    except OSError:
        return False


def _save_atomic(dest: Path, write) -> None:
    """Run `write(tmp_path)` then rename onto `dest`, so readers never see a partial file."""
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        write(str(tmp))
        os.replace(tmp, dest)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise ModelLoadError(f"Cannot write `{dest}`: {err}") from err
