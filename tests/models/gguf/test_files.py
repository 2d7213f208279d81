"""find_gguf_file: a file, a directory, a hub repo (a hand-built cache and a faked hub)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import huggingface_hub
import pytest
import requests
from fixtures.hub_cache import build_hub_cache

from pytgi.config import ModelConfig
from pytgi.errors import ModelLoadError
from pytgi.models.gguf.checkpoint import GGUFCheckpoint
from pytgi.models.gguf.files import find_gguf_file

REPO = "org/tiny-gguf"


def local(path: Path | str) -> ModelConfig:
    return ModelConfig(model_id=str(path))


@pytest.fixture
def gguf_dir(tiny_gguf, tmp_path) -> Path:
    """A directory holding two GGUF files (the same bytes) and a README."""
    directory = tmp_path / "repo"
    directory.mkdir()
    shutil.copyfile(tiny_gguf[0], directory / "tiny.Q8_0.gguf")
    shutil.copyfile(tiny_gguf[0], directory / "tiny.F32.gguf")
    (directory / "README.md").write_text("two quantizations")
    return directory


def test_file(tiny_gguf):
    path = tiny_gguf[0]
    assert find_gguf_file(local(path)) == path
    assert find_gguf_file(local(path), path.name) == path
    with pytest.raises(ModelLoadError, match="is a file: --model-gguf `other.gguf` cannot"):
        find_gguf_file(local(path), "other.gguf")


def test_a_file_that_is_not_gguf(tiny_llama_dir):
    with pytest.raises(ModelLoadError, match="is not a GGUF file"):
        find_gguf_file(local(tiny_llama_dir / "config.json"))


def test_missing_path():
    with pytest.raises(ModelLoadError, match="Model directory `./absent.gguf` does not exist"):
        find_gguf_file(local("./absent.gguf"))


def test_directory_with_one_file(tiny_gguf):
    path = tiny_gguf[0]
    assert find_gguf_file(local(path.parent)) == path.resolve()


def test_directory_with_several_files_needs_the_flag(gguf_dir):
    with pytest.raises(ModelLoadError) as err:
        find_gguf_file(local(gguf_dir))
    message = err.value.message
    assert "holds several GGUF files (tiny.F32.gguf, tiny.Q8_0.gguf)" in message
    assert "pick one with --model-gguf" in message
    assert find_gguf_file(local(gguf_dir), "tiny.Q8_0.gguf") == gguf_dir / "tiny.Q8_0.gguf"
    absolute = gguf_dir / "tiny.F32.gguf"
    assert find_gguf_file(local(gguf_dir), str(absolute)) == absolute
    with pytest.raises(ModelLoadError, match="GGUF file `tiny.Q2_K.gguf` not found in"):
        find_gguf_file(local(gguf_dir), "tiny.Q2_K.gguf")


def test_safetensors_directory_is_not_gguf_without_the_flag(tiny_llama_dir, tiny_gguf, tmp_path):
    directory = tmp_path / "both"
    shutil.copytree(tiny_llama_dir, directory)
    shutil.copyfile(tiny_gguf[0], directory / "model.gguf")
    assert find_gguf_file(local(directory)) is None
    assert find_gguf_file(local(directory), "model.gguf") == directory / "model.gguf"
    assert find_gguf_file(local(tiny_llama_dir)) is None


def offline(cache: Path, repo: str = REPO) -> ModelConfig:
    return ModelConfig(model_id=repo, hub_cache_dir=str(cache), hub_offline=True)


def test_hub_cache_with_one_file(tiny_gguf, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    shutil.copyfile(tiny_gguf[0], src / "tiny.Q8_0.gguf")
    (src / "README.md").write_text("readme")
    snapshot = build_hub_cache(tmp_path / "cache", REPO, src)
    path = find_gguf_file(offline(tmp_path / "cache"))
    assert path == snapshot / "tiny.Q8_0.gguf" and path.is_symlink()  # into the cache's blobs
    assert GGUFCheckpoint(path).hf_config.num_hidden_layers == 2


def test_hub_cache_with_several_files(gguf_dir, tmp_path):
    snapshot = build_hub_cache(tmp_path / "cache", REPO, gguf_dir)
    with pytest.raises(ModelLoadError, match=f"model `{REPO}` holds several GGUF files"):
        find_gguf_file(offline(tmp_path / "cache"))
    path = find_gguf_file(offline(tmp_path / "cache"), "tiny.F32.gguf")
    assert path == snapshot / "tiny.F32.gguf"
    with pytest.raises(ModelLoadError, match="GGUF file `absent.gguf` not found in model"):
        find_gguf_file(offline(tmp_path / "cache"), "absent.gguf")
    with pytest.raises(ModelLoadError, match="Invalid --model-gguf `../x.gguf`"):
        find_gguf_file(offline(tmp_path / "cache"), "../x.gguf")


def test_hub_cache_of_a_safetensors_repo(tiny_llama_dir, tmp_path):
    build_hub_cache(tmp_path / "cache", "org/tiny-llama", tiny_llama_dir)
    assert find_gguf_file(offline(tmp_path / "cache", "org/tiny-llama")) is None


def test_hub_repo_not_cached_offline(tmp_path):
    with pytest.raises(ModelLoadError, match=f"Model `{REPO}` \\(revision main\\) is not in"):
        find_gguf_file(offline(tmp_path))


class FakeHub:
    """`list_repo_files` and `snapshot_download` of a hub holding `files` (served from `root`)."""

    def __init__(self, root: Path, files: list[str], list_error: Exception | None = None):
        self.root, self.files, self.list_error, self.downloads = root, files, list_error, []

    def list_repo_files(self, repo_id, revision=None, token=None):
        if self.list_error is not None:
            raise self.list_error
        return self.files

    def snapshot_download(self, repo_id, **kwargs):
        self.downloads.append(kwargs)
        return str(self.root)


@pytest.fixture
def fake_hub(monkeypatch, gguf_dir):
    def install(files: list[str], list_error: Exception | None = None) -> FakeHub:
        hub = FakeHub(gguf_dir, files, list_error)
        monkeypatch.setattr(huggingface_hub, "list_repo_files", hub.list_repo_files)
        monkeypatch.setattr(huggingface_hub, "snapshot_download", hub.snapshot_download)
        return hub

    return install


def test_hub_downloads_only_the_one_file(fake_hub, gguf_dir):
    hub = fake_hub([".gitattributes", "README.md", "tiny.Q8_0.gguf"])
    path = find_gguf_file(ModelConfig(model_id=REPO, revision="v1"))
    assert path == gguf_dir / "tiny.Q8_0.gguf"
    assert [d["allow_patterns"] for d in hub.downloads] == [["tiny.Q8_0.gguf"]]
    assert hub.downloads[0]["revision"] == "v1"


def test_hub_with_several_files_lists_them(fake_hub):
    hub = fake_hub(["tiny.F32.gguf", "sub/tiny.Q8_0.gguf"])
    with pytest.raises(ModelLoadError, match=r"\(tiny.F32.gguf, sub/tiny.Q8_0.gguf\)"):
        find_gguf_file(ModelConfig(model_id=REPO))
    assert hub.downloads == []


def test_hub_safetensors_repo_downloads_nothing(fake_hub):
    hub = fake_hub(["config.json", "model.safetensors", "model.Q4_0.gguf"])
    assert find_gguf_file(ModelConfig(model_id=REPO)) is None
    assert hub.downloads == []


def test_unreachable_hub_lists_the_cache(fake_hub, gguf_dir):
    hub = fake_hub([], list_error=requests.ConnectionError("no route to host"))
    with pytest.raises(ModelLoadError, match="holds several GGUF files"):
        find_gguf_file(ModelConfig(model_id=REPO))  # the cached snapshot's files were listed
    assert hub.downloads[0]["local_files_only"] is True


def test_tgi_form_a_file_anywhere_with_a_directory_model_id(tiny_gguf, tiny_llama_dir, monkeypatch):
    monkeypatch.chdir(tiny_gguf[0].parent)
    relative = f"./{tiny_gguf[0].name}"
    assert find_gguf_file(local(tiny_llama_dir), relative) == tiny_gguf[0].resolve()
    assert find_gguf_file(local(tiny_llama_dir), str(tiny_gguf[0])) == tiny_gguf[0].resolve()


def test_tgi_form_a_file_anywhere_with_a_hub_model_id(tiny_gguf, tmp_path, monkeypatch):
    monkeypatch.chdir(tiny_gguf[0].parent)
    model = offline(tmp_path / "empty-cache", "org/not-cached")  # never looked up
    assert find_gguf_file(model, tiny_gguf[0].name) == tiny_gguf[0].resolve()
    assert find_gguf_file(model, str(tiny_gguf[0])) == tiny_gguf[0].resolve()


def test_tgi_form_takes_the_tokenizer_of_the_model_id(tiny_gguf, tiny_llama_dir, tmp_path):
    import json

    from pytgi.models.resolve import resolve_model

    tokenizer_dir = tmp_path / "tokenizer-model"
    shutil.copytree(tiny_llama_dir, tokenizer_dir)
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = "CUSTOM {{ messages[0]['content'] }}"
    (tokenizer_dir / "tokenizer_config.json").write_text(json.dumps(config))

    served = resolve_model(
        ModelConfig(
            model_id=str(tokenizer_dir),
            gguf_file=str(tiny_gguf[0]),
            cache_dir=os.environ["PYTGI_CACHE_DIR"],
        )
    )
    served_config = json.loads((served / "tokenizer_config.json").read_text())
    assert served_config["chat_template"] == "CUSTOM {{ messages[0]['content'] }}"
    assert (served / "pytgi_gguf.json").is_file()  # still the GGUF's weights
    # today's form, --model-id the file: the tokenizer read from the file
    own = resolve_model(
        ModelConfig(model_id=str(tiny_gguf[0]), cache_dir=os.environ["PYTGI_CACHE_DIR"])
    )
    assert "CUSTOM" not in (own / "tokenizer_config.json").read_text()
