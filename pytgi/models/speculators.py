"""Trained speculators: draft tokens from the target model's last hidden state, as TGI runs them.

Both read the final (normed) hidden state `h [N, hidden]` of the row that chose a request's
newest token `t [N]` and propose the next `k` tokens, greedily (top-1 per head, as TGI):

- Medusa (`medusa_lm_head.safetensors`): head i is `num_layers` residual blocks
  `x <- x + SiLU(W x + b)` (`{i}.{l}.linear`), then its own LM head `{i}.{num_layers}` or, when
  the checkpoint has none, the base model's LM head; head i guesses the token i + 1 places after
  `t` (it does not read `t`).
- IBM's MLP speculator (`model_type: mlp_speculator`, `speculator.*` tensors): a chain; step i
  mixes the state with the embedding of the previous token,
  `s <- GELU(LN_i(proj_i(s) * w_state + emb_i(tok) * w_emb))`, `tok <- argmax head_i(s)`, starting
  from `s = h` (RMS-normed and scaled by 1/sqrt(2) with `scale_input`) and `tok = t`, with
  `w_state = 0.5 ** (0.5 / n_predict)` and `w_emb = sqrt(1 - w_state^2) * sqrt(inner_dim / 2)`;
  LN is an RMS norm with weight and bias. With `tie_weights` every step shares emb/head/LN and
  steps after the first share `proj.1`.

The drafts are verified by the target model in the next step (`model_runner.accept_drafts`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from pytgi.config import SpeculatorConfig
from pytgi.errors import ModelLoadError

LMHead = Callable[[torch.Tensor], torch.Tensor]  # hidden [N, H] -> logits [N, V]


class MedusaHeads(nn.Module):
    def __init__(self, blocks: list[list[tuple]], heads: list[torch.Tensor | None], lm_head):
        super().__init__()
        self.blocks = blocks  # per head: [(W [H, H], b [H])] residual blocks
        self.heads = heads  # per head: its LM head [V, H], or None for the base model's
        self.lm_head = lm_head

    def propose(self, hidden: torch.Tensor, token_ids: torch.Tensor, k: int) -> torch.Tensor:
        """hidden [N, H], newest tokens [N] -> drafts [N, k] (k <= number of heads)."""
        drafts = []
        for blocks, head in zip(self.blocks[:k], self.heads[:k], strict=True):
            x = hidden
            for weight, bias in blocks:
                x = x + F.silu(F.linear(x, weight, bias))
            logits = self.lm_head(x) if head is None else F.linear(x, head)  # [N, V]
            drafts.append(logits.argmax(-1))
        return torch.stack(drafts, dim=1)


class MLPSpeculator(nn.Module):
    def __init__(self, tensors: dict[str, torch.Tensor], config: dict):
        super().__init__()
        self.n_predict = int(config["n_predict"])
        self.tied = bool(config.get("tie_weights", False))
        self.scale_input = bool(config.get("scale_input", False))
        inner = int(config.get("inner_dim") or config["emb_dim"])
        self.state_weight = 0.5 ** (0.5 / self.n_predict)
        self.emb_weight = math.sqrt(1 - self.state_weight**2) * math.sqrt(inner / 2)
        self.t = tensors

    def _step(self, i: int) -> tuple[str, str]:
        """(tensor index of emb/head/ln, of proj) at chain step i."""
        if not self.tied:
            return str(i), str(i)
        return "0", "0" if i == 0 else "1"

    def propose(self, hidden: torch.Tensor, token_ids: torch.Tensor, k: int) -> torch.Tensor:
        t = self.t
        state = hidden
        if self.scale_input:
            state = state * torch.rsqrt(state.pow(2).mean(-1, keepdim=True) + 1e-6) * 2**-0.5
        tokens, drafts = token_ids, []
        for i in range(k):
            shared, proj = self._step(i)
            z = F.embedding(tokens, t[f"speculator.emb.{shared}.weight"]) * self.emb_weight
            state = F.linear(state, t[f"speculator.proj.{proj}.weight"]) * self.state_weight + z
            state = state * torch.rsqrt(state.pow(2).mean(-1, keepdim=True) + 1e-6)
            state = state * t[f"speculator.ln.{shared}.weight"] + t[f"speculator.ln.{shared}.bias"]
            state = F.gelu(state)
            tokens = F.linear(state, t[f"speculator.head.{shared}.weight"]).argmax(-1)  # [N]
            drafts.append(tokens)
        return torch.stack(drafts, dim=1)


def load_speculator(
    spec: SpeculatorConfig, lm_head: LMHead, dtype: torch.dtype, device: torch.device
) -> MedusaHeads | MLPSpeculator:
    from safetensors.torch import load_file

    path = Path(spec.path)
    config = json.loads((path / "config.json").read_text())
    if spec.kind == "medusa":
        tensors = load_file(path / "medusa_lm_head.safetensors", device=str(device))
        return _medusa(tensors, config, lm_head, dtype)
    tensors = {}
    for file in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(file, device=str(device)))
    tensors = {k: v.to(dtype) for k, v in tensors.items()}
    speculator = MLPSpeculator(tensors, config)
    missing = [k for k in _mlp_names(speculator) if k not in tensors]
    if missing:
        raise ModelLoadError(f"the MLP speculator checkpoint lacks {', '.join(missing[:4])}")
    return speculator


def _mlp_names(speculator: MLPSpeculator) -> list[str]:
    names = []
    for i in range(speculator.n_predict):
        shared, proj = speculator._step(i)
        names += [f"speculator.emb.{shared}.weight", f"speculator.proj.{proj}.weight"]
        names += [f"speculator.head.{shared}.weight", f"speculator.ln.{shared}.weight"]
        names += [f"speculator.ln.{shared}.bias"]
    return sorted(set(names))


def _medusa(tensors: dict, config: dict, lm_head: LMHead, dtype) -> MedusaHeads:
    num_heads, num_layers = int(config["medusa_num_heads"]), int(config["medusa_num_layers"])
    blocks, heads = [], []
    try:
        for h in range(num_heads):
            blocks.append(
                [
                    (
                        tensors[f"{h}.{i}.linear.weight"].to(dtype),
                        tensors[f"{h}.{i}.linear.bias"].to(dtype),
                    )
                    for i in range(num_layers)
                ]
            )
            head = tensors.get(f"{h}.{num_layers}.weight")
            heads.append(None if head is None else head.to(dtype))
    except KeyError as e:
        raise ModelLoadError(f"medusa_lm_head.safetensors lacks the tensor {e.args[0]}") from None
    return MedusaHeads(blocks, heads, lm_head)
