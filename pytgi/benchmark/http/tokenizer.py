"""Load the tokenizer the workload is measured with: a local tokenizer.json, a model directory,
or a hub id (resolved from the local Hugging Face cache first, downloaded only if missing).

Only the `tokenizers` library is used (it reads every fast tokenizer's tokenizer.json), so the
benchmark never imports transformers or torch.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from pytgi.benchmark.http.errors import BenchConfigError

TOKENIZER_FILE = "tokenizer.json"


class TextTokenizer:
    """Text ↔ ids without special tokens: what a prompt of N tokens means to the benchmark."""

    def __init__(self, tokenizer: Tokenizer, name: str):
        self._tokenizer = tokenizer
        self.name = name

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, token_ids: list[int]) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=True)

    def count(self, text: str) -> int:
        return len(self.encode(text))


def load_tokenizer(
    name: str, revision: str | None = None, cache_dir: str | None = None
) -> TextTokenizer:
    """`name` is a tokenizer.json file, a GGUF model file (its tokenizer, as the server reads it,
    prepared under `cache_dir`), a directory holding a tokenizer.json, or a hub repository id."""
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        from pytgi.models.gguf.prepared import prepared_dir

        return TextTokenizer(_from_file(prepared_dir(path, cache_dir) / TOKENIZER_FILE), name)
    if path.is_file():
        return TextTokenizer(_from_file(path), name)
    if path.is_dir():
        if not (path / TOKENIZER_FILE).is_file():
            raise BenchConfigError(f"no {TOKENIZER_FILE} in tokenizer directory '{name}'")
        return TextTokenizer(_from_file(path / TOKENIZER_FILE), name)
    return TextTokenizer(_from_file(_hub_file(name, revision)), name)


def _from_file(path: Path) -> Tokenizer:
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust library raises a plain Exception on a malformed file
        raise BenchConfigError(f"cannot read tokenizer '{path}': {exc}") from exc


def _hub_file(repo_id: str, revision: str | None) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalEntryNotFoundError

    try:
        return Path(
            hf_hub_download(repo_id, TOKENIZER_FILE, revision=revision, local_files_only=True)
        )
    except LocalEntryNotFoundError:
        pass  # not cached yet: download it below
    except HFValidationError:
        raise BenchConfigError(
            f"tokenizer '{repo_id}' is neither a local path nor a hub id"
        ) from None
    try:
        return Path(hf_hub_download(repo_id, TOKENIZER_FILE, revision=revision))
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise BenchConfigError(
            f"tokenizer '{repo_id}' is not a local path, not in the hub cache, and its "
            f"{TOKENIZER_FILE} could not be downloaded: {exc}"
        ) from exc
