"""The pre-quantized tiny checkpoints of the GPU feature tests (tests/backends/cuda/
test_gpu_features.py), written here where compressed-tensors is installed, for the GPU machine
where it is not: a tiny Llama stored as GPTQ (act-order), AWQ, compressed-tensors W4A16, FP8
block-wise and FP8 per channel, each beside its dense reference (tests/fixtures/prequantized.py,
`write_fixture`). About 4 MB in all; the folder is git-ignored, carry it.

    python scripts/gpu_fixtures.py [DIR]  # default .gpu-fixtures (the tests: PYTGI_GPU_FIXTURES)
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

FORMATS = ("gptq", "awq", "compressed-tensors", "fp8", "fp8-channel")


def main(out: Path) -> None:
    from fixtures.prequantized import write_fixture
    from fixtures.tiny_models import build_tiny_model

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "llama"
        build_tiny_model(source, "llama")  # what the tests' tiny_model_factory("llama") builds
        for fmt in FORMATS:
            write_fixture(source, out, fmt)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"{out}: {', '.join(FORMATS)} ({size / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / ".gpu-fixtures"))
