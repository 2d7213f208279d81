"""The bundled demo model: a 4.2M-parameter Llama trained on the King James Bible.

Owns the location of the checkpoint that ships inside the package (Hugging Face layout: config.json,
model.safetensors, tokenizer files with a chat template), so that pytgi can serve, test and
benchmark a real trained model with no hub access. It is made by scripts/train_demo_model.py and
described in docs/DEMO_MODEL.md.
"""

from pathlib import Path

__all__ = ["demo_model_path"]


def demo_model_path() -> str:
    """Returns the absolute path of the bundled demo model's directory (usable as a model id)."""
    return str(Path(__file__).resolve().parent)
