"""The prepared directory of a GGUF file (config and tokenizer written from its metadata) is
reused only while the file's content is what it was written from: a file changed in place with
its size and modification time kept gets its files written again, or fails in one line."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import gguf
import pytest

from pytgi.errors import ModelLoadError
from pytgi.models.gguf import prepared
from pytgi.models.gguf.prepared import MARKER, prepared_dir


def _copy(tiny_gguf, tmp_path) -> Path:
    path = tmp_path / "model.gguf"
    shutil.copyfile(tiny_gguf[0], path)
    return path


def _overwrite_in_place(path: Path, offset: int, data: bytes) -> None:
    """Change bytes without changing the file's size or modification time."""
    stat = path.stat()
    with path.open("r+b") as handle:
        handle.seek(offset)
        handle.write(data)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _eos_offset(path: Path) -> tuple[int, int]:
    """The file offset of the uint32 value of tokenizer.ggml.eos_token_id, and the value."""
    reader = gguf.GGUFReader(path)
    value = reader.fields["tokenizer.ggml.eos_token_id"].parts[-1]
    return int(value.ctypes.data - reader.data.ctypes.data), int(value[0])


def _eos_ids(directory: Path) -> object:
    return json.loads((directory / "generation_config.json").read_text())["eos_token_id"]


def test_changed_content_with_the_same_size_and_time_is_written_again(tiny_gguf, tmp_path):
    path = _copy(tiny_gguf, tmp_path)
    first = prepared_dir(path, os.environ["PYTGI_CACHE_DIR"])
    offset, eos = _eos_offset(path)
    assert eos != 5 and _eos_ids(first) in (eos, [eos])
    _overwrite_in_place(path, offset, (5).to_bytes(4, "little"))
    second = prepared_dir(path, os.environ["PYTGI_CACHE_DIR"])
    assert second == first  # the same key (path, size, time) ...
    assert _eos_ids(second) in (5, [5])  # ... but written from the new content
    assert json.loads((second / MARKER).read_text())["fingerprint"] == prepared.fingerprint(path)


def test_changed_tensor_data_is_noticed(tiny_gguf, tmp_path, monkeypatch):
    path = _copy(tiny_gguf, tmp_path)
    first = prepared_dir(path, os.environ["PYTGI_CACHE_DIR"])
    (first / "sentinel").write_text("written from the old content")
    _overwrite_in_place(path, path.stat().st_size - 8, b"\x7f" * 8)  # the last tensor's bytes
    assert not (prepared_dir(path, os.environ["PYTGI_CACHE_DIR"]) / "sentinel").exists()
    # a large file is sampled, not read whole: a change inside a sampled window is seen
    monkeypatch.setattr(prepared, "HEAD_BYTES", 1024)
    monkeypatch.setattr(prepared, "SAMPLES", 4)
    monkeypatch.setattr(prepared, "SAMPLE_BYTES", 64)
    before = prepared.fingerprint(path)
    _overwrite_in_place(path, path.stat().st_size - 64, b"\x00" * 8)
    assert prepared.fingerprint(path) != before


def test_a_file_damaged_beyond_reading_fails_in_one_line(tiny_gguf, tmp_path):
    path = _copy(tiny_gguf, tmp_path)
    prepared_dir(path, os.environ["PYTGI_CACHE_DIR"])
    _overwrite_in_place(path, 8, (2**40).to_bytes(8, "little"))  # the tensor count
    with pytest.raises(ModelLoadError) as err:
        prepared_dir(path, os.environ["PYTGI_CACHE_DIR"])
    assert "\n" not in err.value.message
