"""`pytgi download-weights`: local directories, an offline hub cache, pickle opt-in, errors."""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

import huggingface_hub
import pytest
import torch
from safetensors.torch import load_file

from pytgi.cli.download import add_download_args, run_download

COMMIT = "fedcba9876543210fedcba9876543210fedcba98"


def parse(*argv: str, **extra) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pytgi download-weights")
    add_download_args(parser)
    args = parser.parse_args(list(argv))
    for name, value in extra.items():
        setattr(args, name, value)
    return args


def cache_snapshot(cache: Path, repo_id: str, src: Path) -> Path:
    """`src` laid out as a hub cache entry (blobs, refs/main, snapshot symlinks)."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for file in src.iterdir():
        blob = repo / "blobs" / file.name
        shutil.copyfile(file, blob)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot


def test_defaults():
    args = parse("org/model")
    assert args.model_id == "org/model" and args.revision is None
    assert args.huggingface_hub_cache is None and not args.allow_pickle_weights


def test_local_directory(tiny_llama_dir, capsys, monkeypatch):
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: pytest.fail("hub"))
    assert run_download(parse(str(tiny_llama_dir))) == 0
    assert capsys.readouterr().out.strip() == str(tiny_llama_dir.resolve())


def test_offline_hub_cache(tiny_llama_dir, tmp_path, capsys):
    snapshot = cache_snapshot(tmp_path, "org/tiny", tiny_llama_dir)
    cache = str(tmp_path)
    args = parse("org/tiny", "--revision", "main", "--huggingface-hub-cache", cache)
    args.hub_offline = True
    assert run_download(args) == 0
    assert capsys.readouterr().out.strip() == str(snapshot)


def test_not_cached_offline(tmp_path, capsys):
    args = parse("org/absent", "--huggingface-hub-cache", str(tmp_path), hub_offline=True)
    assert run_download(args) == 1
    err = capsys.readouterr().err
    assert f"Model `org/absent` (revision main) is not in the cache `{tmp_path}`" in err


def test_token_and_offline_reach_the_hub(tmp_path, monkeypatch):
    calls = []
    fake = lambda repo_id, **kwargs: calls.append(kwargs) or str(tmp_path)  # noqa: E731
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    run_download(parse("org/m", "--revision", "r1", hf_token="hf_x", hub_offline=True))
    assert calls and all(c["token"] == "hf_x" and c["local_files_only"] for c in calls)
    assert all(c["revision"] == "r1" for c in calls)


@pytest.fixture
def pickle_model(tiny_llama_dir, tmp_path) -> Path:
    model = tmp_path / "bin-model"
    model.mkdir()
    shutil.copyfile(tiny_llama_dir / "config.json", model / "config.json")
    torch.save(load_file(tiny_llama_dir / "model.safetensors"), model / "pytorch_model.bin")
    return model


def test_pickle_refused(pickle_model, capsys):
    assert run_download(parse(str(pickle_model))) == 1
    assert "--allow-pickle-weights" in capsys.readouterr().err
    assert not (pickle_model / "model.safetensors").exists()


def test_pickle_converted_with_flag(pickle_model, tiny_llama_dir, capsys):
    assert run_download(parse(str(pickle_model), "--allow-pickle-weights")) == 0
    assert capsys.readouterr().out.strip() == str(pickle_model.resolve())
    converted = load_file(pickle_model / "model.safetensors")
    original = load_file(tiny_llama_dir / "model.safetensors")
    assert converted.keys() == original.keys()
    assert all(torch.equal(converted[k], original[k]) for k in original)
