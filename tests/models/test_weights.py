"""iter_weights / list_weight_files: safetensors single and sharded, failures, pickle opt-in."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pytgi.errors import ModelLoadError
from pytgi.models import weights
from pytgi.models.weights import convert_pickle_weights, iter_weights, list_weight_files


def load_all(model_dir: Path, **kwargs) -> dict[str, torch.Tensor]:
    return dict(iter_weights(model_dir, **kwargs))


def copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.fixture(scope="module")
def state(tiny_llama_dir) -> dict[str, torch.Tensor]:
    return load_file(tiny_llama_dir / "model.safetensors")


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


def test_single_file(tiny_llama_dir, state):
    assert list_weight_files(tiny_llama_dir) == [tiny_llama_dir / "model.safetensors"]
    assert_same(load_all(tiny_llama_dir), state)


def test_sharded_matches_single(tiny_model_factory, state):
    sharded = tiny_model_factory("llama", shards=3)
    files = list_weight_files(sharded)
    assert len(files) > 1 and all(f.name.startswith("model-0000") for f in files)
    assert_same(load_all(sharded), state)


def test_iteration_is_lazy(tiny_llama_dir, monkeypatch):
    loaded = []
    real = weights._get_tensor
    monkeypatch.setattr(weights, "_get_tensor", lambda *a: loaded.append(a[1]) or real(*a))
    name, tensor = next(iter_weights(tiny_llama_dir))
    assert loaded == [name] and tensor.device.type == "cpu"


def test_missing_shard_is_named(tiny_model_factory, tmp_path):
    model = copy_model(tiny_model_factory("llama", shards=3), tmp_path / "m")
    missing = sorted(model.glob("model-*.safetensors"))[1]
    missing.unlink()
    with pytest.raises(ModelLoadError, match=f"Weight file `{missing.name}` listed in .* missing"):
        iter_weights(model)  # fails on the call, before any tensor is read


@pytest.mark.parametrize("name", ["../outside.safetensors", "/etc/passwd"])
def test_index_cannot_point_outside(tmp_path, name):
    index = {"weight_map": {"w": name}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match="is outside"):
        list_weight_files(tmp_path)


def test_invalid_index(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="Invalid weight index"):
        list_weight_files(tmp_path)


def test_no_weights(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match=f"No safetensors weights found in {tmp_path}$"):
        list(iter_weights(tmp_path))


def test_missing_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        list_weight_files(tmp_path / "absent")


def test_truncated_safetensors(tiny_llama_dir, tmp_path):
    data = (tiny_llama_dir / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="Cannot read safetensors file"):
        list(iter_weights(tmp_path))


def test_huge_header_length_is_refused(tmp_path):
    (tmp_path / "model.safetensors").write_bytes((10**12).to_bytes(8, "little") + b"{}")
    with pytest.raises(ModelLoadError, match="Cannot read safetensors file"):
        list(iter_weights(tmp_path))


def test_duplicate_tensor_across_files(tmp_path):
    save_file({"w": torch.zeros(2)}, tmp_path / "a.safetensors")
    save_file({"w": torch.ones(2)}, tmp_path / "b.safetensors")
    with pytest.raises(ModelLoadError, match="Tensor `w` is in both"):
        list(iter_weights(tmp_path))


def test_model_safetensors_preferred_over_extra_files(tiny_llama_dir, tmp_path, state):
    model = copy_model(tiny_llama_dir, tmp_path / "m")
    save_file({"w": torch.zeros(2)}, model / "consolidated.safetensors")
    assert list_weight_files(model) == [model / "model.safetensors"]


def write_pickle_model(model_dir: Path, state: dict[str, torch.Tensor], shards: int = 1) -> Path:
    """A `.bin` checkpoint (sharded: with pytorch_model.bin.index.json), lm_head tied."""
    model_dir.mkdir()
    state = dict(state)
    # one storage for both, as tied models save it
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
    if shards == 1:
        torch.save(state, model_dir / "pytorch_model.bin")
        return model_dir
    names = sorted(state)
    weight_map = {}
    for i in range(shards):
        file = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        part = {name: state[name] for name in names[i::shards]}
        torch.save(part, model_dir / file)
        weight_map.update(dict.fromkeys(part, file))
    index = {"metadata": {}, "weight_map": weight_map}
    (model_dir / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    return model_dir


def tied(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {**state, "lm_head.weight": state["model.embed_tokens.weight"]}


def test_pickle_refused_without_opt_in(tmp_path, state):
    model = write_pickle_model(tmp_path / "m", state)
    with pytest.raises(ModelLoadError) as err:
        list(iter_weights(model))
    assert "No safetensors weights found" in err.value.message
    assert "(pytorch_model.bin)" in err.value.message
    assert "--allow-pickle-weights" in err.value.message
    assert not list(model.glob("*.safetensors"))


def test_pickle_converted_with_opt_in(tmp_path, state, monkeypatch):
    model = write_pickle_model(tmp_path / "m", state)
    assert_same(load_all(model, allow_pickle=True), tied(state))
    assert (model / "model.safetensors").is_file()
    assert (model / "model.safetensors.index.json").is_file()
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("converted twice"))
    assert_same(load_all(model), tied(state))  # the converted files need no opt-in


def test_sharded_pickle_converted(tmp_path, state):
    model = write_pickle_model(tmp_path / "m", state, shards=2)
    files = list_weight_files(model, allow_pickle=True)
    assert [f.name for f in files] == [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    assert_same(load_all(model), tied(state))


def test_interrupted_conversion_is_redone(tmp_path, state):
    model = write_pickle_model(tmp_path / "m", state, shards=2)
    save_file({"partial": torch.zeros(1)}, model / "model-00001-of-00002.safetensors")
    with pytest.raises(ModelLoadError, match="--allow-pickle-weights"):
        list_weight_files(model)
    assert_same(load_all(model, allow_pickle=True), tied(state))


def test_read_only_directory_converts_to_sibling(tmp_path, state, monkeypatch):
    model = write_pickle_model(tmp_path / "m", state)
    monkeypatch.setattr(weights, "_is_writable", lambda directory: directory != model)
    files = list_weight_files(model, allow_pickle=True)
    assert files == [tmp_path / "m.pytgi-safetensors" / "model.safetensors"]
    assert not list(model.glob("*.safetensors"))
    assert_same(load_all(model), tied(state))


class Pwned:
    def __reduce__(self):
        return (print, ("pwned",))


def test_malicious_pickle_is_refused(tmp_path, capsys):
    model = tmp_path / "m"
    model.mkdir()
    torch.save({"w": torch.zeros(2), "evil": Pwned()}, model / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="Refusing to load pickle weights .*Weights only load"):
        list(iter_weights(model, allow_pickle=True))
    assert "pwned" not in capsys.readouterr().out
    assert not list(model.glob("*.safetensors")) and not list(model.glob("*.json"))


def test_pickle_that_is_not_a_state_dict(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    torch.save([torch.zeros(2)], model / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="not a state dict of named tensors"):
        convert_pickle_weights(model)


def test_training_args_bin_is_not_a_checkpoint(tmp_path):
    torch.save({"lr": torch.tensor(1.0)}, tmp_path / "training_args.bin")
    with pytest.raises(ModelLoadError, match=f"No safetensors weights found in {tmp_path}$"):
        list_weight_files(tmp_path, allow_pickle=True)
