"""`pytgi download-weights MODEL_ID`: fetch a model into the hub cache and make it loadable.

Resolves the model (a local directory as is, a hub id downloaded into the cache), converts pickle
`.bin` weights to safetensors when `--allow-pickle-weights` is given, checks that every weight file
is present, and prints the local model directory. The token and offline mode come from the
`hf_token` / `hub_offline` attributes the caller sets on the parsed arguments (from `envs`).
"""

from __future__ import annotations

import argparse
import logging
import sys

from pytgi.config import ModelConfig
from pytgi.errors import ModelLoadError
from pytgi.models.weights import list_weight_files
from pytgi.utils.hub import resolve_model_dir

logger = logging.getLogger(__name__)


def add_download_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_id", help="Hub model id or local directory")
    parser.add_argument("--revision", help="Hub revision: a branch, tag, commit sha or refs/pr/N")
    parser.add_argument("--huggingface-hub-cache", help="Hub cache directory")
    parser.add_argument(
        "--allow-pickle-weights",
        action="store_true",
        help="Accept pickle .bin checkpoints (loaded with weights_only=True, converted once)",
    )
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="Also download the repository's Python files (custom model code)",
    )


def download_config(args: argparse.Namespace) -> ModelConfig:
    """The `ModelConfig` of a `download-weights` invocation."""
    return ModelConfig(
        model_id=args.model_id,
        revision=args.revision,
        hub_cache_dir=args.huggingface_hub_cache,
        hf_token=getattr(args, "hf_token", None),
        hub_offline=getattr(args, "hub_offline", False),
        allow_pickle_weights=args.allow_pickle_weights,
        trust_remote_code=getattr(args, "trust_remote_code", False),
    )


def run_download(args: argparse.Namespace) -> int:
    """Download (and convert) the weights; print the model directory. Returns the exit status."""
    model = download_config(args)
    try:
        model_dir = resolve_model_dir(model)
        files = list_weight_files(model_dir, allow_pickle=model.allow_pickle_weights)
    except ModelLoadError as err:
        print(f"Error: {err.message}", file=sys.stderr)
        return 1
    logger.info("%s: %d weight files in %s", model.model_id, len(files), files[0].parent)
    print(model_dir)
    return 0
