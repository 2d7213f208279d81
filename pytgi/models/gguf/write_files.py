"""`python -m pytgi.models.gguf.write_files GGUF_FILE OUT_DIR`: write a GGUF file's config and
tokenizer files into OUT_DIR, then the marker naming the file (run by `prepared.prepared_dir` in a
child process). A refusal (an architecture pytgi does not serve, a malformed file) is the last
line of stderr, exit 1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pytgi.errors import PytgiError
from pytgi.models.gguf.prepared import MARKER, fingerprint


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m pytgi.models.gguf.write_files GGUF_FILE OUT_DIR", file=sys.stderr)
        return 2
    from pytgi.models.gguf.checkpoint import GGUFCheckpoint

    path = Path(argv[0]).resolve()
    try:
        checkpoint = GGUFCheckpoint(path)
        out_dir = checkpoint.write_hf_files(argv[1])
    except PytgiError as err:
        print(err.message, file=sys.stderr)
        return 1
    stat = path.stat()
    marker = {
        "gguf_file": str(path),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "fingerprint": fingerprint(path),
        "architecture": checkpoint.metadata.architecture,
        "tensor_types": checkpoint.tensor_types(),
    }
    (out_dir / MARKER).write_text(json.dumps(marker, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
