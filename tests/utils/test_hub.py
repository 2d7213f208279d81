"""resolve_model_dir against local directories, a hand-built hub cache and a faked hub."""

from __future__ import annotations

from pathlib import Path

import huggingface_hub
import pytest
from fixtures.hub_cache import COMMIT, build_hub_cache
from huggingface_hub import constants as hf_constants
from huggingface_hub import errors as hf_errors

from pytgi.config import ModelConfig
from pytgi.errors import ModelLoadError
from pytgi.models.weights import iter_weights
from pytgi.utils.hub import METADATA_PATTERNS, PICKLE_PATTERNS, resolve_model_dir

REPO = "org/tiny-llama"


@pytest.fixture(scope="module")
def hub_cache(tiny_model_factory, tmp_path_factory) -> tuple[Path, Path]:
    cache = tmp_path_factory.mktemp("hub-cache")
    snapshot = build_hub_cache(cache, REPO, tiny_model_factory("llama", shards=2))
    return cache, snapshot


def offline(cache: Path, **kwargs) -> ModelConfig:
    return ModelConfig(model_id=REPO, hub_cache_dir=str(cache), hub_offline=True, **kwargs)


def test_offline_cache_hit_by_branch(hub_cache):
    cache, snapshot = hub_cache
    assert resolve_model_dir(offline(cache)) == snapshot
    assert resolve_model_dir(offline(cache, revision="main")) == snapshot
    names = [name for name, _ in iter_weights(snapshot)]  # through the blob symlinks
    assert "model.embed_tokens.weight" in names


def test_offline_cache_hit_by_commit(hub_cache):
    cache, snapshot = hub_cache
    assert resolve_model_dir(offline(cache, revision=COMMIT)) == snapshot


def test_offline_missing_revision(hub_cache):
    cache, _ = hub_cache
    with pytest.raises(ModelLoadError) as err:
        resolve_model_dir(offline(cache, revision="v2.0"))
    msg = err.value.message
    assert f"Model `{REPO}` (revision v2.0) is not in the cache `{cache}`" in msg
    assert "HF_HUB_OFFLINE is set" in msg
    assert "cached revisions: main, " + COMMIT in msg


def test_offline_missing_repo(hub_cache):
    cache, _ = hub_cache
    config = ModelConfig(model_id="org/absent", hub_cache_dir=str(cache), hub_offline=True)
    with pytest.raises(ModelLoadError, match=r"Model `org/absent` \(revision main\) is not in"):
        resolve_model_dir(config)


@pytest.mark.skipif(not hf_constants.HF_HUB_OFFLINE, reason="needs HF_HUB_OFFLINE=1 (conftest)")
def test_env_offline_falls_back_to_cache(hub_cache):
    cache, snapshot = hub_cache
    config = ModelConfig(model_id=REPO, hub_cache_dir=str(cache), hub_offline=False)
    assert resolve_model_dir(config) == snapshot
    absent = ModelConfig(model_id="org/absent", hub_cache_dir=str(cache))
    with pytest.raises(ModelLoadError, match="HF_HUB_OFFLINE is set"):
        resolve_model_dir(absent)


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("snapshot_download must not be called for a local directory")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)


def test_local_directory_never_calls_the_hub(no_network, tiny_llama_dir):
    assert resolve_model_dir(ModelConfig(model_id=str(tiny_llama_dir))) == tiny_llama_dir.resolve()


def test_local_relative_and_home_paths(no_network, tiny_llama_dir, monkeypatch):
    monkeypatch.chdir(tiny_llama_dir.parent)
    relative = ModelConfig(model_id=f"./{tiny_llama_dir.name}")
    assert resolve_model_dir(relative) == tiny_llama_dir.resolve()
    monkeypatch.setenv("HOME", str(tiny_llama_dir.parent))
    home = ModelConfig(model_id=f"~/{tiny_llama_dir.name}")
    assert resolve_model_dir(home) == tiny_llama_dir.resolve()


@pytest.mark.parametrize("model_id", ["/no/such/model", "./missing", "../missing", "~/missing-x"])
def test_missing_local_path(no_network, model_id):
    with pytest.raises(ModelLoadError, match=f"Model directory `{model_id}` does not exist"):
        resolve_model_dir(ModelConfig(model_id=model_id))


def test_file_is_not_a_model_directory(no_network, tiny_llama_dir):
    path = str(tiny_llama_dir / "config.json")
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model_dir(ModelConfig(model_id=path))


def test_invalid_hub_id(tmp_path):
    config = ModelConfig(model_id="a//b..c", hub_cache_dir=str(tmp_path), hub_offline=True)
    with pytest.raises(ModelLoadError, match="neither a local directory nor a valid hub id"):
        resolve_model_dir(config)


class FakeHub:
    """Stands in for `snapshot_download`: records each call and returns a prepared snapshot."""

    def __init__(self, snapshot: Path, error: Exception | None = None):
        self.snapshot, self.error, self.calls = snapshot, error, []

    def __call__(self, repo_id, **kwargs):
        self.calls.append({"repo_id": repo_id, **kwargs})
        if self.error is not None:
            raise self.error
        return str(self.snapshot)


def fake_hub(monkeypatch, snapshot: Path, error: Exception | None = None) -> FakeHub:
    hub = FakeHub(snapshot, error)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub)
    monkeypatch.setattr(huggingface_hub, "list_repo_files", lambda *a, **k: [])
    return hub


def test_hub_arguments_are_passed_through(monkeypatch, tiny_model_factory, tmp_path):
    sharded = tiny_model_factory("llama", shards=2)
    hub = fake_hub(monkeypatch, sharded)
    config = ModelConfig(
        model_id=REPO, revision="v1", hub_cache_dir=str(tmp_path), hf_token="hf_secret"
    )
    assert resolve_model_dir(config) == sharded
    assert len(hub.calls) == 2
    for call in hub.calls:
        assert call["repo_id"] == REPO and call["revision"] == "v1"
        assert call["cache_dir"] == str(tmp_path) and call["token"] == "hf_secret"
        assert call["local_files_only"] is False
    assert hub.calls[0]["allow_patterns"] == METADATA_PATTERNS
    shards = sorted(p.name for p in sharded.glob("model-*.safetensors"))
    assert hub.calls[1]["allow_patterns"] == shards  # exactly the indexed files


def test_hub_without_index_fetches_all_safetensors(monkeypatch, tmp_path):
    hub = fake_hub(monkeypatch, tmp_path)
    resolve_model_dir(ModelConfig(model_id=REPO, hub_offline=True))
    assert hub.calls[1]["allow_patterns"] == ["*.safetensors"]
    assert hub.calls[1]["local_files_only"] is True


def test_hub_pickle_pass_only_with_opt_in(monkeypatch, tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    hub = fake_hub(monkeypatch, tmp_path)
    resolve_model_dir(ModelConfig(model_id=REPO))
    assert len(hub.calls) == 2
    resolve_model_dir(ModelConfig(model_id=REPO, allow_pickle_weights=True))
    assert hub.calls[-1]["allow_patterns"] == PICKLE_PATTERNS
    assert not any("*.py" in call["allow_patterns"] for call in hub.calls)


def test_hub_remote_code_only_with_trust(monkeypatch, tmp_path):
    hub = fake_hub(monkeypatch, tmp_path)
    resolve_model_dir(ModelConfig(model_id=REPO, trust_remote_code=True))
    assert "*.py" in hub.calls[0]["allow_patterns"]


def test_explicit_patterns_make_one_call(monkeypatch, tmp_path):
    hub = fake_hub(monkeypatch, tmp_path)
    resolve_model_dir(ModelConfig(model_id=REPO), allow_patterns=["config.json"])
    assert [call["allow_patterns"] for call in hub.calls] == [["config.json"]]


def _http_error(cls, message: str = "boom") -> Exception:
    return cls(message, response=None)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (_http_error(hf_errors.GatedRepoError), f"Model `{REPO}` is gated"),
        (_http_error(hf_errors.RepositoryNotFoundError), f"Model `{REPO}` was not found on"),
        (_http_error(hf_errors.RevisionNotFoundError), f"Revision `v9` of model `{REPO}` was not"),
        (_http_error(hf_errors.HfHubHTTPError, "500 Server Error"), "Could not download model"),
        (ConnectionError("no route to host"), "Could not download model"),
        (PermissionError("read-only cache"), "read-only cache"),
    ],
)
def test_hub_errors_are_typed(monkeypatch, tmp_path, error, expected):
    fake_hub(monkeypatch, tmp_path, error)
    with pytest.raises(ModelLoadError, match=expected) as err:
        resolve_model_dir(ModelConfig(model_id=REPO, revision="v9"))
    assert err.value.__cause__ is error


def test_unreachable_hub_and_not_cached(monkeypatch, tmp_path):
    error = hf_errors.LocalEntryNotFoundError("cannot find snapshot")
    error.__cause__ = ConnectionError("no route to host")
    fake_hub(monkeypatch, tmp_path, error)
    with pytest.raises(ModelLoadError) as err:
        resolve_model_dir(ModelConfig(model_id=REPO, hub_cache_dir=str(tmp_path)))
    assert f"is not in the cache `{tmp_path}` and the hub cannot be reached" in err.value.message


def test_later_passes_are_pinned_to_the_snapshot_commit(monkeypatch, hub_cache):
    _, snapshot = hub_cache
    hub = fake_hub(monkeypatch, snapshot)
    resolve_model_dir(ModelConfig(model_id=REPO, revision="main"))
    assert [call["revision"] for call in hub.calls] == ["main", COMMIT]


@pytest.mark.parametrize("revision", ["../../../etc", "/abs", "a\\b", ""])
def test_revision_cannot_leave_the_cache(monkeypatch, tmp_path, revision):
    fake_hub(monkeypatch, tmp_path)
    with pytest.raises(ModelLoadError, match="Invalid revision"):
        resolve_model_dir(ModelConfig(model_id=REPO, revision=revision))


def test_pr_revision_is_accepted(hub_cache):
    cache, _ = hub_cache
    with pytest.raises(ModelLoadError, match=r"\(revision refs/pr/1\) is not in the cache"):
        resolve_model_dir(offline(cache, revision="refs/pr/1"))


def test_pickle_only_repo_is_named_without_opt_in(monkeypatch, tmp_path):
    fake_hub(monkeypatch, tmp_path)
    listed = ["config.json", "pytorch_model.bin", "training_args.bin"]
    monkeypatch.setattr(huggingface_hub, "list_repo_files", lambda *a, **k: listed)
    with pytest.raises(ModelLoadError, match=r"only pickle weights \(pytorch_model.bin\)"):
        resolve_model_dir(ModelConfig(model_id=REPO))


def test_pickle_listing_failure_leaves_the_error_to_the_loader(monkeypatch, tmp_path):
    fake_hub(monkeypatch, tmp_path)

    def unreachable(*args, **kwargs):
        raise hf_errors.OfflineModeIsEnabled("offline")

    monkeypatch.setattr(huggingface_hub, "list_repo_files", unreachable)
    assert resolve_model_dir(ModelConfig(model_id=REPO)) == tmp_path


def test_config_checked_before_any_weight_is_fetched(monkeypatch, tmp_path):
    from pytgi.cli.preflight import check_model_config

    (tmp_path / "config.json").write_text('{"architectures": ["NoSuchModelForCausalLM"]}')
    hub = fake_hub(monkeypatch, tmp_path)
    with pytest.raises(ModelLoadError, match="unsupported model architecture"):
        resolve_model_dir(ModelConfig(model_id=REPO), check_config=check_model_config)
    assert [call["allow_patterns"] for call in hub.calls] == [METADATA_PATTERNS]
