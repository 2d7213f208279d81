"""transformers' causal-LM table (`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`: model_type -> class name),
the architectures the transformers fallback may serve.

It is read from transformers' installed source, not imported: importing anything from
transformers imports torch (seconds, and the launcher's process never needs it). The table is a
literal `OrderedDict([...])` of string pairs in `models/auto/modeling_auto.py`; a test checks that
this reading equals the imported table, so a transformers upgrade that changes the layout fails
there rather than here at serving time.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path

TABLE_NAME = "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"


@functools.cache
def causal_lm_table() -> dict[str, str]:
    """model_type -> transformers class name, for every causal LM transformers ships."""
    spec = importlib.util.find_spec("transformers")  # finds the package without importing it
    if spec is None or spec.origin is None:
        return {}
    source = Path(spec.origin).parent / "models" / "auto" / "modeling_auto.py"
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == TABLE_NAME
        ):
            return dict(ast.literal_eval(node.value.args[0]))
    raise RuntimeError(f"{TABLE_NAME} not found in {source}")


def is_transformers_causal_lm(architecture: str) -> bool:
    return architecture in causal_lm_table().values()
