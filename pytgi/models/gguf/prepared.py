"""A GGUF model as a model directory: its config.json, generation_config.json and tokenizer files,
written once per GGUF file into pytgi's cache, plus a marker that names the file.

Everything downstream (the launcher's checks, the API process's tokenizer and chat template, the
engine) then reads that directory as it reads any checkpoint; only the loader looks at the
marker (`gguf_source`) and reads the weights from the GGUF file itself.

The files are written by a child process (`python -m pytgi.models.gguf.write_files`) because
transformers' GGUF tokenizer converter imports torch, which the launcher's process (the HTTP
server) never does. The directory is keyed by the file's resolved path, size and modification
time, so an edited or replaced file gets fresh files, and a second start reuses them once the
file's content fingerprint (`fingerprint`: the header and evenly spaced samples of the tensor
data) still matches the marker's: a file changed in place with its size and time kept (a copy
gone wrong, a disk fault) gets its files written again from what it now holds. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pytgi.errors import ConfigError, ModelLoadError

logger = logging.getLogger(__name__)

# written last by write_files: {"gguf_file": absolute path, "size": bytes, "mtime_ns": int,
# "fingerprint": fingerprint(file), "architecture": general.architecture,
# "tensor_types": {"Q4_1": 210, ...}}
MARKER = "pytgi_gguf.json"
LAYOUT_VERSION = 2  # bump when write_files writes different files: old directories are not reused
WRITE_TIMEOUT_S = 600
# what TGI's form takes from `--model-id` (the tokenizer and its chat template)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
)


def gguf_source(model_dir: str | Path) -> Path | None:
    """The GGUF file a prepared model directory stands for; None for any other directory."""
    marker = read_marker(model_dir)
    if marker is None:
        return None
    path = Path(marker["gguf_file"])
    if not path.is_file():
        raise ModelLoadError(f"GGUF file `{path}` (named in `{model_dir}`) no longer exists")
    return path


def read_marker(model_dir: str | Path) -> dict | None:
    """The marker of a prepared model directory (see MARKER), None for any other directory."""
    marker = Path(model_dir) / MARKER
    if not marker.is_file():
        return None
    try:
        fields = json.loads(marker.read_text())
        if not isinstance(fields["gguf_file"], str) or not isinstance(fields["tensor_types"], dict):
            raise TypeError("gguf_file or tensor_types has the wrong type")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ModelLoadError(f"Invalid GGUF marker `{marker}`: {err}") from err
    return fields


def describe_types(tensor_types: dict[str, int]) -> str:
    """{"Q4_1": 210, "F32": 61} -> "Q4_1 x210, F32 x61" (most frequent first)."""
    ordered = sorted(tensor_types.items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(f"{name} x{count}" for name, count in ordered)


HEAD_BYTES = 16 << 20  # the header (metadata, vocabulary, tensor table) and the first tensors
SAMPLES, SAMPLE_BYTES = 256, 64 << 10  # then 16 MiB more, spread evenly over the file


def fingerprint(path: Path) -> str:
    """A content hash of `path` that reads at most 32 MiB: the whole file when it is smaller,
    else its first 16 MiB and 256 evenly spaced 64 KiB windows (the last one ends the file)."""
    digest = hashlib.sha256()
    size = path.stat().st_size
    with path.open("rb") as handle:
        if size <= HEAD_BYTES + SAMPLES * SAMPLE_BYTES:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
            return digest.hexdigest()
        digest.update(handle.read(HEAD_BYTES))
        span = size - HEAD_BYTES - SAMPLE_BYTES
        for i in range(SAMPLES):
            handle.seek(HEAD_BYTES + span * (i + 1) // SAMPLES)
            digest.update(handle.read(SAMPLE_BYTES))
    return digest.hexdigest()


def _current(directory: Path, path: Path) -> bool:
    """Whether `directory` holds files written from `path`'s present content."""
    marker = read_marker(directory)
    if marker is None:
        return False
    if marker.get("fingerprint") == fingerprint(path):
        return True
    logger.warning(
        "%s changed since its config and tokenizer were written (same size and modification "
        "time, other content): writing them again from the file",
        path,
    )
    return False


def prepared_dir(gguf_file: Path, cache_dir: str | None) -> Path:
    """The model directory of `gguf_file` under `cache_dir` (`ModelConfig.cache_dir`), written now
    if it is not there (or no longer matches the file's content)."""
    if cache_dir is None:
        raise ConfigError(f"no cache directory to prepare {gguf_file.name} in (PYTGI_CACHE_DIR)")
    path = gguf_file.resolve()
    stat = path.stat()
    identity = f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0{LAYOUT_VERSION}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    directory = Path(cache_dir) / "gguf" / f"{path.stem}-{key}"
    if (directory / MARKER).is_file():
        if _current(directory, path):
            return directory
        _discard(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=directory.parent, prefix=".writing-") as tmp:
        _write_files(path, Path(tmp))
        try:
            os.rename(tmp, directory)  # atomic: a reader sees all the files or none
        except OSError:
            if not (directory / MARKER).is_file():  # not a concurrent start that won the race
                raise
        os.makedirs(tmp, exist_ok=True)  # for TemporaryDirectory's cleanup
    logger.info(
        "Wrote the config and tokenizer of %s to %s (%.1fs)",
        path.name, directory, time.perf_counter() - start,
    )  # fmt: skip
    return directory


def _discard(directory: Path) -> None:
    """Move a stale prepared directory aside (atomic), then delete it; its derived copies with
    another tokenizer (`with_tokenizer`) go too."""
    for stale in [directory, *directory.parent.glob(f"{directory.name}-tok-*")]:
        aside = stale.parent / f".stale-{stale.name}-{os.getpid()}"
        try:
            os.rename(stale, aside)
        except OSError:
            continue  # a concurrent start moved it first
        shutil.rmtree(aside, ignore_errors=True)


def with_tokenizer(prepared: Path, tokenizer_dir: Path) -> Path:
    """A copy of `prepared` (a GGUF's directory) whose tokenizer files are `tokenizer_dir`'s, in
    the cache next to it, keyed by the tokenizer files' contents."""
    sources = [tokenizer_dir / name for name in TOKENIZER_FILES if (tokenizer_dir / name).is_file()]
    digest = hashlib.sha256()
    for src in sources:
        digest.update(src.name.encode() + b"\0" + src.read_bytes() + b"\0")
    directory = prepared.parent / f"{prepared.name}-tok-{digest.hexdigest()[:16]}"
    if (directory / MARKER).is_file():
        return directory
    with tempfile.TemporaryDirectory(dir=prepared.parent, prefix=".writing-") as tmp:
        for item in prepared.iterdir():
            if item.name not in TOKENIZER_FILES and item.name != MARKER and item.is_file():
                shutil.copyfile(item, Path(tmp) / item.name)
        for src in sources:
            shutil.copyfile(src, Path(tmp) / src.name)
        shutil.copyfile(prepared / MARKER, Path(tmp) / MARKER)  # last: the directory is whole
        try:
            os.rename(tmp, directory)
        except OSError:
            if not (directory / MARKER).is_file():
                raise
        os.makedirs(tmp, exist_ok=True)
    logger.info("Serving the tokenizer of %s with the GGUF weights", tokenizer_dir)
    return directory


def _write_files(gguf_file: Path, out_dir: Path) -> None:
    command = [sys.executable, "-m", "pytgi.models.gguf.write_files", str(gguf_file), str(out_dir)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=WRITE_TIMEOUT_S)
    except subprocess.TimeoutExpired as err:
        raise ModelLoadError(f"Reading the metadata of `{gguf_file}` timed out") from err
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines() or [f"exit status {result.returncode}"]
        raise ModelLoadError(lines[-1])
