"""Resolve `--model-id` to a local directory: a local checkpoint as is, else a hub snapshot.

A local directory never touches the network. A hub id goes through
`huggingface_hub.snapshot_download` with the configured revision, cache dir, token and offline flag,
in up to three passes: metadata (configs, tokenizer, weight index), then the safetensors weights
(exactly the files the index names, so a duplicate `consolidated.safetensors` is not fetched), then
pickle `.bin` weights only when the repo has no safetensors and `allow_pickle_weights` is set. Repo
code (`*.py`) is fetched only with `trust_remote_code`. Hub failures become `ModelLoadError` naming
the model id, revision and cache dir.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import re
from collections.abc import Callable
from pathlib import Path

import huggingface_hub
import requests
from huggingface_hub import constants as hf_constants
from huggingface_hub import errors as hf_errors

from pytgi.config import ModelConfig
from pytgi.errors import ModelLoadError

SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_INDEX = "pytorch_model.bin.index.json"

METADATA_PATTERNS = [
    "config.json",
    "generation_config.json",
    SAFETENSORS_INDEX,
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "*.tiktoken",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.json",
    "chat_template.jinja",
    "preprocessor_config.json",
    "processor_config.json",
]
REMOTE_CODE_PATTERNS = ["*.py"]
PICKLE_PATTERNS = [PICKLE_INDEX, "pytorch_model*.bin"]

_PATH_PREFIXES = ("/", "./", "../", "~")
_COMMIT = re.compile(r"[0-9a-f]{40}")


def resolve_model_dir(
    model: ModelConfig,
    allow_patterns: list[str] | None = None,
    check_config: Callable[[Path], object] | None = None,
) -> Path:
    """The local directory holding `model.model_id`, downloading missing hub files into the cache.

    `allow_patterns` replaces the default passes with one snapshot of exactly those patterns.
    `check_config(directory)` runs once config.json is there and before any weight is fetched,
    so that a model pytgi would refuse costs no download (it raises to refuse).
    """
    local = local_model_dir(model.model_id)
    if local is not None:
        if check_config is not None:
            check_config(local)
        return local
    _check_revision(model.revision)
    if allow_patterns is not None:
        return _snapshot(model, allow_patterns)
    patterns = METADATA_PATTERNS + (REMOTE_CODE_PATTERNS if model.trust_remote_code else [])
    snapshot = _snapshot(model, patterns)
    if check_config is not None:
        check_config(snapshot)
    if model.weights_dir is not None:  # --weights-cache-override: the weights are there already
        return snapshot
    pinned = _pin_revision(model, snapshot)  # later passes must not follow a branch that moved
    snapshot = _snapshot(pinned, safetensors_patterns(snapshot))
    if any(snapshot.glob("*.safetensors")):
        return snapshot
    if model.allow_pickle_weights:
        return _snapshot(pinned, PICKLE_PATTERNS)
    if not model.hub_offline:
        _refuse_pickle_only(pinned)
    return snapshot


def local_model_dir(model_id: str) -> Path | None:
    """`model_id` as a local directory, None for a hub id; raises for a path that is not a dir."""
    path = Path(model_id).expanduser()
    if path.is_dir():
        return path.resolve()
    if model_id.startswith(_PATH_PREFIXES) or path.exists():
        raise ModelLoadError(f"Model directory `{model_id}` does not exist (or is not a directory)")
    return None


def list_repo_files(model: ModelConfig) -> list[str]:
    """The files of hub repo `model.model_id` at its revision (paths inside the repo), as the hub
    lists them or, offline or when the hub cannot be reached, as its cached snapshot holds them."""
    _check_revision(model.revision)
    if not model.hub_offline:
        try:
            return huggingface_hub.list_repo_files(
                model.model_id, revision=model.revision, token=model.hf_token
            )
        except (hf_errors.OfflineModeIsEnabled, requests.ConnectionError, requests.Timeout):
            pass  # the cached snapshot below, as snapshot_download does
        except (OSError, ValueError) as err:
            raise _hub_error(model, err) from err
    try:  # offline, snapshot_download returns the cached snapshot folder without a pattern check
        snapshot = Path(
            huggingface_hub.snapshot_download(
                model.model_id,
                revision=model.revision,
                cache_dir=model.hub_cache_dir,
                local_files_only=True,
            )
        )
    except (OSError, ValueError) as err:
        raise _hub_error(model, err) from err
    return sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file())


def safetensors_patterns(snapshot: Path) -> list[str]:
    """Weight files to fetch: those the safetensors index names, else every `*.safetensors`."""
    index = snapshot / SAFETENSORS_INDEX
    if not index.is_file():
        return ["*.safetensors"]
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ModelLoadError(f"Invalid weight index `{index}`: {err}") from err
    return sorted(set(weight_map.values()))


def _refuse_pickle_only(model: ModelConfig) -> None:
    """Name the repo's pickle weights (not downloaded without the opt-in) in the error."""
    try:
        files = huggingface_hub.list_repo_files(
            model.model_id, revision=model.revision, token=model.hf_token
        )
    except (OSError, ValueError):
        return  # only a better message is lost: the weights loader reports the missing weights
    pickles = [f for f in files if fnmatch.fnmatch(f, PICKLE_PATTERNS[1])]
    if pickles:
        raise ModelLoadError(
            f"Model `{model.model_id}` has no safetensors weights, only pickle weights "
            f"({', '.join(pickles)}), which can run code when loaded. Pass --allow-pickle-weights "
            "to download them and convert them with torch.load(weights_only=True)"
        )


def _check_revision(revision: str | None) -> None:
    """Refuse revisions that would walk out of the cache's refs/ (they are joined as paths)."""
    if revision is None:
        return
    parts = revision.split("/")
    if not revision or revision.startswith("/") or ".." in parts or "\\" in revision:
        raise ModelLoadError(f"Invalid revision `{revision}`")


def _pin_revision(model: ModelConfig, snapshot: Path) -> ModelConfig:
    """`model` at the commit of a cache snapshot (`.../snapshots/<sha>`), else unchanged."""
    if snapshot.parent.name == "snapshots" and _COMMIT.fullmatch(snapshot.name):
        return dataclasses.replace(model, revision=snapshot.name)
    return model


def _snapshot(model: ModelConfig, allow_patterns: list[str]) -> Path:
    try:
        folder = huggingface_hub.snapshot_download(
            model.model_id,
            revision=model.revision,
            cache_dir=model.hub_cache_dir,
            token=model.hf_token,
            local_files_only=model.hub_offline,
            allow_patterns=allow_patterns,
        )
    except (OSError, ValueError) as err:  # hub HTTP, offline-cache, validation and disk errors
        raise _hub_error(model, err) from err
    return Path(folder)


def _hub_error(model: ModelConfig, err: Exception) -> ModelLoadError:
    """A `ModelLoadError` naming the model, revision and cache for a hub failure."""
    name, revision = model.model_id, model.revision or "main"
    cache = model.hub_cache_dir or hf_constants.HF_HUB_CACHE
    if isinstance(err, hf_errors.GatedRepoError):
        return ModelLoadError(
            f"Model `{name}` is gated: accept its conditions on the hub and pass a token "
            "(HF_TOKEN) of an account that has access"
        )
    if isinstance(err, hf_errors.RepositoryNotFoundError):
        return ModelLoadError(
            f"Model `{name}` was not found on the hub (if it is private, pass a token: HF_TOKEN)"
        )
    if isinstance(err, hf_errors.RevisionNotFoundError):
        return ModelLoadError(f"Revision `{revision}` of model `{name}` was not found on the hub")
    if isinstance(err, hf_errors.LocalEntryNotFoundError):
        return ModelLoadError(_not_cached_message(model, err, cache))
    if isinstance(err, hf_errors.HFValidationError):
        return ModelLoadError(f"`{name}` is neither a local directory nor a valid hub id: {err}")
    return ModelLoadError(f"Could not download model `{name}` (revision {revision}): {err}")


def _not_cached_message(model: ModelConfig, err: Exception, cache: str) -> str:
    name, revision = model.model_id, model.revision or "main"
    head = f"Model `{name}` (revision {revision}) is not in the cache `{cache}`"
    if model.hub_offline or isinstance(err.__cause__, hf_errors.OfflineModeIsEnabled):
        reason = "HF_HUB_OFFLINE is set"
    else:
        reason = f"the hub cannot be reached ({err.__cause__ or err})"
    cached = cached_revisions(cache, name)
    hint = f"; cached revisions: {', '.join(cached)}" if cached else ""
    return f"{head} and {reason}{hint}"


def cached_revisions(cache_dir: str | Path, model_id: str) -> list[str]:
    """Refs (branch/tag names) and snapshot commits of `model_id` present in a hub cache."""
    repo = Path(cache_dir) / hf_constants.REPO_ID_SEPARATOR.join(["models", *model_id.split("/")])
    refs = repo / "refs"
    names = [str(p.relative_to(refs)) for p in refs.rglob("*") if p.is_file()]
    snapshots = repo / "snapshots"
    commits = [p.name for p in snapshots.iterdir()] if snapshots.is_dir() else []
    return sorted(names) + sorted(commits)
