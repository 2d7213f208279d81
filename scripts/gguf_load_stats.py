"""Time and peak memory of reading a whole GGUF file with pytgi's reader (or transformers').

    python scripts/gguf_load_stats.py path/to/model.gguf [--transformers]

pytgi: metadata (GGUFReader + config), tokenizer (built and written as HF files), then every
tensor decoded to its QuantizedWeight / plain tensor, one at a time and dropped. With
--transformers: `AutoModelForCausalLM.from_pretrained(..., gguf_file=...)`, which dequantizes the
whole model to fp32. Peak RSS is the process's (ru_maxrss), imports included; "after imports" is
the baseline.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def pytgi_load(path: Path) -> None:
    from pytgi.layers.quantization.quantized_weight import QuantizedWeight
    from pytgi.models.gguf.checkpoint import GGUFCheckpoint

    print(f"after imports: peak RSS {peak_rss_mb():.0f} MB")
    start = time.perf_counter()
    checkpoint = GGUFCheckpoint(path)
    checkpoint.hf_config  # noqa: B018
    print(f"metadata + config: {time.perf_counter() - start:.2f} s")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        checkpoint.write_hf_files(out)
    print(f"tokenizer + HF files: {time.perf_counter() - start:.2f} s")
    start, num_bytes, count = time.perf_counter(), 0, 0
    for _, value in checkpoint.iter_weights():
        parts = [value.codes, value.scales] if isinstance(value, QuantizedWeight) else [value]
        if isinstance(value, QuantizedWeight) and value.mins is not None:
            parts.append(value.mins)
        num_bytes += sum(p.numel() * p.element_size() for p in parts)
        count += 1
    elapsed = time.perf_counter() - start
    print(f"{count} tensors decoded: {elapsed:.2f} s, {num_bytes / 2**20:.0f} MiB of codes/scales")
    print(f"types: {checkpoint.tensor_types()}")
    print(f"peak RSS {peak_rss_mb():.0f} MB")


def transformers_load(path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    print(f"after imports: peak RSS {peak_rss_mb():.0f} MB")
    start = time.perf_counter()
    AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, torch_dtype=torch.float32
    )
    print(f"transformers GGUF load (dequantized fp32): {time.perf_counter() - start:.2f} s")
    print(f"peak RSS {peak_rss_mb():.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--transformers", action="store_true", help="transformers' loader instead")
    args = parser.parse_args()
    import torch  # noqa: F401 (both paths import it: counted in the baseline)

    (transformers_load if args.transformers else pytgi_load)(args.path)


if __name__ == "__main__":
    main()
