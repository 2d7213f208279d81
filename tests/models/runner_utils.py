"""Helpers to drive a ModelRunner with hand-built SchedulerOutputs and compare with transformers."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from pytgi import envs
from pytgi.backends.selector import select_platform
from pytgi.config import CacheConfig, EngineConfig, ModelConfig
from pytgi.engine.outputs import NewRequestData, ScheduledRequest, SchedulerOutput
from pytgi.engine.sampling_params import SamplingParams
from pytgi.worker.model_runner import ModelRunner

BLOCK_SIZE = 16


def engine_config(model_dir: Path, implementation: str = "auto", **cache) -> EngineConfig:
    model = ModelConfig(model_id=str(model_dir), implementation=implementation)
    return EngineConfig(model=model, cache=CacheConfig(**cache))


def make_runner(
    model_dir: Path, num_blocks: int = 128, implementation: str = "auto"
) -> ModelRunner:
    """On the platform PYTGI_CPU_KERNELS / PYTGI_FUSED_DECODE ask for (both on by default)."""
    config = engine_config(model_dir, implementation)
    runner = ModelRunner(config, select_platform(envs.device_config()))
    runner.load_model(model_dir)
    runner.allocate_kv_cache(num_blocks)
    return runner


def reference_attention(model_dir: Path) -> str:
    """transformers' eager attention, except for Falcon with ALiBi: its eager path adds the ALiBi
    bias twice (once itself, once inside the causal mask it builds), unlike its SDPA path and the
    original Falcon-RW code, which add it once."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return "sdpa" if config.get("model_type") == "falcon" and config.get("alibi") else "eager"


def load_hf(model_dir: Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_dir, attn_implementation=reference_attention(model_dir), dtype=torch.float32
    )
    model.generation_config.eos_token_id = None  # greedy comparisons never stop early
    return model.eval()


@torch.no_grad()
def hf_logits(hf_model, token_ids: list[int]) -> torch.Tensor:
    """Logits [L, V] of one sequence, full forward without cache."""
    return hf_model(torch.tensor([token_ids])).logits[0]


def prompt(length: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, 384, (length,), generator=g).tolist()


class BlockAllocator:
    """Hands out fresh block ids in order (tests never free)."""

    def __init__(self, first: int = 0):
        self.next = first

    def take(self, num_tokens: int) -> list[int]:
        count = -(-num_tokens // BLOCK_SIZE)
        self.next += count
        return list(range(self.next - count, self.next))


def scheduled(
    request_id: str,
    token_ids: list[int],
    start: int,
    end: int,
    block_ids: list[int],
    sample: bool = True,
    num_prompt: int | None = None,
    prefill_logprobs: bool = False,
) -> tuple[NewRequestData, ScheduledRequest]:
    """Run token_ids[start:end] of a sequence whose first num_prompt tokens are the prompt. The
    request is sent whole each time (its worker state replaced), so tests need not track what the
    runner has seen."""
    num_prompt = len(token_ids) if num_prompt is None else num_prompt
    new = NewRequestData(request_id, token_ids[:num_prompt], SamplingParams())
    return new, ScheduledRequest(
        request_id=request_id,
        start_pos=start,
        num_tokens=end - start,
        new_token_ids=token_ids[num_prompt:end],
        new_block_ids=list(block_ids),
        sample=sample,
        prefill_logprobs=prefill_logprobs,
    )


def step(*requests: tuple[NewRequestData, ScheduledRequest]) -> SchedulerOutput:
    return SchedulerOutput(
        requests=[r for _, r in requests], new_requests=[new for new, _ in requests]
    )
