"""Resident memory of a model loaded in fp32 and quantized each `--quantize` way.

Each method loads in its own fresh process (pytgi's ModelRunner, the CPU kernels), which then
reports its resident set after loading (VmRSS, the safetensors file unmapped, and after
`malloc_trim` hands the heap's freed loading temporaries back to the OS; before it too) and its
peak during loading (VmHWM), next to the weight bytes the layers hold (each storage once). The
baseline is an empty process that imported the same modules.

    python scripts/quant_memory.py MODEL_DIR [--methods eetq,fp8]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CHILD = """
import gc, json, sys, torch
from pytgi.backends.selector import select_platform
from pytgi import envs
from pytgi.config import CacheConfig, EngineConfig, ModelConfig
from pytgi.worker.model_runner import ModelRunner

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

model_dir, method, TRIM = sys.argv[1], sys.argv[2] or None, sys.argv[3] == "1"
model = ModelConfig(model_id=model_dir, quantize=method, **envs.model_fields())
runner = ModelRunner(EngineConfig(model=model, cache=CacheConfig()), select_platform())
base = status("VmRSS:")
if method != "none":
    runner.load_model(model_dir)
gc.collect()
rss_before_trim = status("VmRSS:")
if TRIM:
    import ctypes
    ctypes.CDLL("libc.so.6").malloc_trim(0)
tensors = {}  # storage pointer -> bytes, each storage once (tied weights, shared blocks)
if runner.model is not None:
    for module in runner.model.modules():
        found = list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
        packed = getattr(module, "quant_packed", None)
        if packed is not None:
            found += [t for t in (packed.codes, packed.scales, packed.mins) if t is not None]
        found += [getattr(module, n, None) for n in ("weight_packed", "bias_packed", "blocks")]
        for t in found:
            if isinstance(t, torch.Tensor) and t.numel():
                tensors[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
print(json.dumps({"base": base, "rss": status("VmRSS:"), "untrimmed": rss_before_trim,
                  "peak": status("VmHWM:"), "held": sum(tensors.values())}))
"""


def measure(model_dir: Path, method: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(model_dir), "" if method == "fp32" else method, "1"],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    from pytgi.layers.quantization.registry import SUPPORTED_QUANTIZE

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--methods", default=",".join(SUPPORTED_QUANTIZE))
    args = parser.parse_args()
    empty = measure(args.model_dir, "none")
    print(f"empty process (imports, kernels): {empty['rss'] / 2**20:.0f} MiB resident\n")
    print(
        "| method | weights held MiB | resident MiB | above empty MiB | ÷ fp32 | "
        "before malloc_trim MiB | peak MiB |"
    )
    print("|---|---|---|---|---|---|---|")
    fp32_extra = None
    for method in ["fp32", *args.methods.split(",")]:
        r = measure(args.model_dir, method)
        extra = r["rss"] - empty["rss"]
        fp32_extra = fp32_extra or extra
        print(
            f"| {method} | {r['held'] / 2**20:.0f} | {r['rss'] / 2**20:.0f} | "
            f"{extra / 2**20:.0f} | {extra / fp32_extra:.2f} | {r['untrimmed'] / 2**20:.0f} | "
            f"{r['peak'] / 2**20:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
