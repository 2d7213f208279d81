"""Which GGUF file `--model-id` (and `--model-gguf`) name: a local file, one in a local directory,
or one in a hub repo (downloaded alone, through `pytgi.utils.hub`).

`--model-gguf` is the flag of TGI's llama.cpp backend: there (and here, first) the path of a GGUF
file anywhere (absolute, or relative to the working directory), with `--model-id` naming the model
whose tokenizer and chat template are served (`tokenizer_source`). As extensions, `--model-gguf`
may instead name a file inside the `--model-id` directory or hub repo (needed only when it holds
several GGUF files), and `--model-id` may name a GGUF file, a directory or repo holding one; then
the tokenizer comes from the GGUF file. A directory or repo that holds safetensors weights is an
ordinary checkpoint unless `--model-gguf` is given.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from pytgi.config import ModelConfig
from pytgi.errors import ModelLoadError
from pytgi.utils import hub

GGUF_SUFFIX = ".gguf"
GGUF_FLAG = "--model-gguf"


def find_gguf_file(model: ModelConfig, gguf_file: str | None = None) -> Path | None:
    """The local GGUF file to load, downloading it from the hub if needed; None when the model is
    not a GGUF checkpoint (`gguf_file` not given, and no GGUF file or also safetensors weights).
    """
    path = Path(model.model_id).expanduser()
    standalone = tgi_form_file(model, gguf_file)
    if standalone is not None:
        return _checked(standalone)
    if path.is_file():
        if gguf_file is not None and Path(gguf_file).name != path.name:
            raise ModelLoadError(
                f"--model-id `{model.model_id}` is a file: {GGUF_FLAG} `{gguf_file}` cannot pick "
                "another one"
            )
        return _checked(path)
    if path.is_dir():
        return _in_directory(path.resolve(), gguf_file)
    hub.local_model_dir(model.model_id)  # raises for a local path that does not exist
    return _in_hub_repo(model, gguf_file)


def tgi_form_file(model: ModelConfig, gguf_file: str | None) -> Path | None:
    """TGI's form: `--model-gguf` names an existing file by its own path (absolute or relative to
    the working directory) and `--model-id` is something else (a directory or hub id). None when
    the flags are not in this form."""
    if gguf_file is None:
        return None
    path = Path(gguf_file).expanduser()
    if not path.is_file() or Path(model.model_id).expanduser().is_file():
        return None
    return path.resolve()


def _in_directory(directory: Path, gguf_file: str | None) -> Path | None:
    if gguf_file is not None:
        path = Path(gguf_file).expanduser()
        path = path if path.is_absolute() else directory / path
        if not path.is_file():
            raise ModelLoadError(f"GGUF file `{gguf_file}` not found in `{directory}`")
        return _checked(path)
    names = sorted(str(p.relative_to(directory)) for p in directory.rglob(f"*{GGUF_SUFFIX}"))
    if not names or any(directory.glob("*.safetensors")):
        return None
    return _checked(directory / _only(names, str(directory)))


def _in_hub_repo(model: ModelConfig, gguf_file: str | None) -> Path | None:
    if gguf_file is None:
        files = hub.list_repo_files(model)
        names = [f for f in files if f.endswith(GGUF_SUFFIX)]
        if not names or any(f.endswith(".safetensors") for f in files):
            return None
        gguf_file = _only(names, f"model `{model.model_id}`")
    parts = PurePosixPath(gguf_file).parts
    if not parts or PurePosixPath(gguf_file).is_absolute() or ".." in parts:
        raise ModelLoadError(f"Invalid {GGUF_FLAG} `{gguf_file}` for hub model `{model.model_id}`")
    snapshot = hub.resolve_model_dir(model, allow_patterns=[gguf_file])
    path = snapshot / gguf_file
    if not path.is_file():
        raise ModelLoadError(f"GGUF file `{gguf_file}` not found in model `{model.model_id}`")
    return _checked(path)


def _only(names: list[str], where: str) -> str:
    if len(names) == 1:
        return names[0]
    raise ModelLoadError(
        f"{where} holds several GGUF files ({', '.join(names)}): pick one with {GGUF_FLAG}"
    )


def _checked(path: Path) -> Path:
    """`path` if it starts with the GGUF magic, else a `ModelLoadError` saying what it is not."""
    try:
        with path.open("rb") as handle:
            magic = handle.read(4)
    except OSError as err:
        raise ModelLoadError(f"Cannot read GGUF file `{path}`: {err}") from err
    if magic != b"GGUF":
        raise ModelLoadError(f"`{path}` is not a GGUF file (it does not start with `GGUF`)")
    return path
