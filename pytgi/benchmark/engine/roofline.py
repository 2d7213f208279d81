"""The roofline the benchmark compares against, measured in the same run.

Machine: read bandwidth from a sum over a tensor far larger than the L3 cache, fp32 GEMM throughput
from a square `torch.mm` (docs/PERFORMANCE.md, "Engine benchmark"). On a GPU: device-to-device
copy bandwidth (bytes read plus bytes written per second, what a decode step's weight streaming is
held to) and the GEMM throughput of the benchmark's dtype, timed with CUDA events. Model: parameter
counts from the checkpoint's safetensors headers, giving the weight bytes one decode step must read
and the matmul FLOPs of one prompt token.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from pytgi.benchmark.engine import contention

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class MachineRoofline:
    bandwidth_gb_s: float  # sustained read bandwidth (GPU: copy bandwidth, read + write)
    gemm_gflop_s: float  # torch.mm: fp32 on CPU, the benchmark's dtype on GPU
    num_threads: int
    others: float | None  # contention while measuring


@dataclass(frozen=True)
class ModelFootprint:
    num_params: int  # distinct tensors in the checkpoint (a tied head counted once)
    num_embedding_params: int
    num_head_params: int  # the LM head (the embedding matrix again when tied)
    tied: bool
    dtype_bytes: float  # bytes per weight in the compute dtype (a GGUF file: its mean, scales in)

    @property
    def num_matmul_params(self) -> int:
        """Weights every token goes through: all but the embedding table and the LM head."""
        stored_head = 0 if self.tied else self.num_head_params
        return self.num_params - self.num_embedding_params - stored_head

    @property
    def decode_weight_bytes(self) -> int:
        """Bytes read per decode step: all layers and the LM head (embedding rows: negligible)."""
        return (self.num_matmul_params + self.num_head_params) * self.dtype_bytes

    def workload_matmul_flop(self, num_prompt_tokens: int, num_output_tokens: int) -> int:
        """Matmul FLOPs any engine must do for a workload: every prompt token through the
        layers, every output token through the layers and the LM head (attention not counted)."""
        per_output = 2 * (self.num_matmul_params + self.num_head_params)
        return num_prompt_tokens * self.prefill_flop_per_token + num_output_tokens * per_output

    @property
    def prefill_flop_per_token(self) -> int:
        """2 FLOP per matmul weight (the LM head runs once per prompt; attention is not counted)."""
        return 2 * self.num_matmul_params


def measure_bandwidth_gb_s(num_bytes: int = 1 << 30, repeats: int = 5) -> float:
    data = torch.ones(num_bytes // 4, dtype=torch.float32)
    data.sum()  # first touch and warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        times.append(time.perf_counter() - start)
    return num_bytes / statistics.median(times) / 1e9


def measure_gemm_gflop_s(size: int = 2048, repeats: int = 3) -> float:
    a = torch.randn(size, size)
    b = torch.randn(size, size)
    torch.mm(a, b)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - start)
    return 2 * size**3 / statistics.median(times) / 1e9


def measure_machine(
    num_bytes: int = 1 << 30, gemm_size: int = 2048, device: str = "cpu", dtype: str = "float32"
) -> MachineRoofline:
    start = contention.snapshot()
    if device == "cuda":
        bandwidth = measure_gpu_copy_gb_s(num_bytes)
        gemm = measure_gpu_gemm_gflop_s(max(gemm_size, 8192), getattr(torch, dtype))
    else:
        bandwidth = measure_bandwidth_gb_s(num_bytes)
        gemm = measure_gemm_gflop_s(gemm_size)
    others = contention.others_fraction(start, contention.snapshot())
    return MachineRoofline(bandwidth, gemm, torch.get_num_threads(), others)


def _gpu_median_s(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def measure_gpu_copy_gb_s(num_bytes: int = 1 << 30, repeats: int = 10) -> float:
    """Device-to-device copy of `num_bytes`: (read + written bytes) per second."""
    src = torch.ones(num_bytes // 4, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    return 2 * num_bytes / _gpu_median_s(lambda: dst.copy_(src), repeats) / 1e9


def measure_gpu_gemm_gflop_s(size: int, dtype: torch.dtype, repeats: int = 10) -> float:
    a = torch.randn(size, size, device="cuda").to(dtype)
    b = torch.randn(size, size, device="cuda").to(dtype)
    return 2 * size**3 / _gpu_median_s(lambda: torch.mm(a, b), repeats) / 1e9


def model_footprint(model_dir: Path, dtype: str) -> ModelFootprint:
    from pytgi.models.gguf.prepared import gguf_source

    gguf_file = gguf_source(model_dir)
    if gguf_file is not None:
        return _gguf_footprint(gguf_file)
    from safetensors import safe_open

    shapes: dict[str, int] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                shapes[name] = _numel(handle.get_slice(name).get_shape())
    if not shapes:
        raise FileNotFoundError(f"no .safetensors weights in {model_dir}")
    embedding = sum(n for name, n in shapes.items() if name.endswith("embed_tokens.weight"))
    head = sum(n for name, n in shapes.items() if name.endswith("lm_head.weight"))
    tied = head == 0 and _tie_word_embeddings(model_dir)
    return ModelFootprint(
        num_params=sum(shapes.values()),
        num_embedding_params=embedding,
        num_head_params=embedding if tied else head,
        tied=tied,
        dtype_bytes=DTYPE_BYTES[dtype],
    )


def _gguf_footprint(path: Path) -> ModelFootprint:
    """A GGUF file's parameters and the bytes it stores per parameter (the weights a decode step
    streams, in the file's own types)."""
    from gguf import GGUFReader

    tensors = GGUFReader(str(path)).tensors
    embedding = sum(int(t.n_elements) for t in tensors if t.name == "token_embd.weight")
    head = sum(int(t.n_elements) for t in tensors if t.name == "output.weight")
    num_params = sum(int(t.n_elements) for t in tensors)
    return ModelFootprint(
        num_params=num_params,
        num_embedding_params=embedding,
        num_head_params=head or embedding,
        tied=head == 0,
        dtype_bytes=sum(int(t.n_bytes) for t in tensors) / num_params,
    )


def _numel(shape) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _tie_word_embeddings(model_dir: Path) -> bool:
    config = json.loads((model_dir / "config.json").read_text())
    return bool(config.get("tie_word_embeddings", True))
