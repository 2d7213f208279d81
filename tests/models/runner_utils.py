"""Helpers to drive a ModelRunner with hand-built SchedulerOutputs and compare with transformers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from pytgi import envs
from pytgi.backends.selector import select_platform
from pytgi.config import CacheConfig, EngineConfig, ModelConfig, parse_lora_adapters
from pytgi.messages.outputs import NewRequestData, ScheduledRequest, SchedulerOutput
from pytgi.messages.sampling_params import SamplingParams
from pytgi.worker.model_runner import ModelRunner

BLOCK_SIZE = 16


def engine_config(
    model_dir: Path,
    implementation: str = "auto",
    quantize: str | None = None,
    quantize_activations: str | None = None,
    lora_adapters: str | None = None,
    **cache,
) -> EngineConfig:
    fields = envs.model_fields()
    if quantize_activations is not None:
        fields["quantize_activations"] = quantize_activations
    if lora_adapters is not None:  # --lora-adapters' syntax
        fields["lora_adapters"] = parse_lora_adapters(lora_adapters)
    model = ModelConfig(
        model_id=str(model_dir), implementation=implementation, quantize=quantize, **fields
    )
    return EngineConfig(model=model, cache=CacheConfig(**cache))


def make_runner(
    model_dir: Path,
    num_blocks: int = 128,
    implementation: str = "auto",
    quantize: str | None = None,
    quantize_activations: str | None = None,
    lora_adapters: str | None = None,
) -> ModelRunner:
    """On the platform PYTGI_CPU_KERNELS / PYTGI_FUSED_DECODE ask for (both on by default)."""
    config = engine_config(model_dir, implementation, quantize, quantize_activations, lora_adapters)
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


@torch.no_grad()
def hf_greedy_logprobs(hf_model, ids: list[int], new_tokens: int) -> tuple[list[int], list[float]]:
    """transformers' greedy tokens after `ids` and the log-softmax of each chosen token."""
    out = hf_model.generate(
        torch.tensor([ids]),
        max_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=3,
        output_scores=True,
        return_dict_in_generate=True,
    )
    tokens = out.sequences[0, len(ids) :].tolist()
    scores = zip(out.scores, tokens, strict=True)
    return tokens, [torch.log_softmax(s[0], -1)[t].item() for s, t in scores]


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
    adapter_id: str | None = None,
) -> tuple[NewRequestData, ScheduledRequest]:
    """Run token_ids[start:end] of a sequence whose first num_prompt tokens are the prompt. The
    request is sent whole each time (its worker state replaced), so tests need not track what the
    runner has seen."""
    num_prompt = len(token_ids) if num_prompt is None else num_prompt
    new = NewRequestData(request_id, token_ids[:num_prompt], SamplingParams(), adapter_id)
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


def load_runner(model_dir: Path, quantize: str | None = None, num_tokens: int = 1024):
    """A ModelRunner of `model_dir` (a checkpoint or a GGUF model's prepared directory) quantized
    with `quantize`, with KV blocks for one `num_tokens` sequence."""
    config = EngineConfig(
        model=ModelConfig(model_id=str(model_dir), quantize=quantize, **envs.model_fields()),
        cache=CacheConfig(block_size=BLOCK_SIZE),
    )
    runner = ModelRunner(config, select_platform())
    runner.load_model(model_dir)
    runner.allocate_kv_cache(-(-num_tokens // BLOCK_SIZE))
    return runner


@torch.inference_mode()
def teacher_forced_logits(runner: ModelRunner, ids: list[int]) -> torch.Tensor:
    """Logits [T, V] of every position of `ids` (one prefill step, nothing sampled)."""
    num_blocks = -(-len(ids) // BLOCK_SIZE)
    new, request = scheduled("text", ids, 0, len(ids), list(range(num_blocks)))
    out = step((new, request))
    runner.states.update(out)
    inputs, _ = runner.input_builder.build(out, runner.states)
    hidden = runner._hidden(inputs)  # [T, hidden]
    logits = runner.model.compute_logits(hidden).float()
    runner.states.update(SchedulerOutput(requests=[], new_requests=[], freed_request_ids=["text"]))
    return logits


def perplexity(logits: torch.Tensor, ids: list[int]) -> float:
    """exp of the mean next-token cross entropy of `ids` under `logits` [T, V]."""
    nll = torch.nn.functional.cross_entropy(logits[:-1].float(), torch.tensor(ids[1:]))
    return math.exp(nll.item())


def hf_greedy_texts(model_dir: Path, prompts, new_tokens: int) -> dict[str, list[int]]:
    """prompt -> transformers' greedy new token ids (fp32, eager, EOS ignored)."""
    from transformers import AutoTokenizer

    tok, hf = AutoTokenizer.from_pretrained(model_dir), load_hf(model_dir)
    out = {}
    for prompt in prompts:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            seq = hf.generate(ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=3)
        out[prompt] = seq[0, ids.shape[1] :].tolist()
    return out
