"""pytgi.grammar stays torch-free (the engine and the router import it), except `bitmask`."""

from __future__ import annotations

import subprocess
import sys


def test_grammar_package_does_not_import_torch():
    code = (
        "import sys, pytgi.grammar, pytgi.router.grammar; "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
