"""IBM's MLP speculator trained on the self-distilled rows of scripts/train_speculator.py, written
in the layout pytgi (and TGI) load: `config.json` with `model_type: mlp_speculator`, `n_predict`,
`emb_dim`, `inner_dim`, `tie_weights`, `scale_input`, `base_model_name_or_path`, and
`model.safetensors` with `speculator.{emb,proj,head,ln}.{i}` tensors.

The chain (pytgi/models/speculators.py): step i reads the state and the token before its target,
`s <- GELU(LN_i(proj_i(s) * w + emb_i(tok) * e))`, and guesses `argmax head_i(s)`; step 0 starts
from the row's final hidden state (RMS-normed and scaled by 1/sqrt(2): `scale_input`) and the
token the row chose. Training feeds the true tokens (teacher forcing, as IBM trains it); serving
feeds the chain's own guesses, which are the true tokens for as long as the chain is accepted.

inner_dim = emb_dim, so emb and head start as the base model's input embeddings and LM head
(scaled so the first logits have a standard deviation of 1) and the projections as identities.
The softmax runs over the tokens of the training data (as the Medusa training does): only those
rows of emb and head are trained; the written head keeps zeros elsewhere (a logit of 0: the
held-out evaluation, over the whole vocabulary, counts any such token that wins) and emb the base
model's rows.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch.nn import functional as F


def step_names(i: int, tied: bool) -> tuple[str, str]:
    """(index of emb/head/ln, index of proj) at chain step i, as the loader reads them."""
    if not tied:
        return str(i), str(i)
    return "0", "0" if i == 0 else "1"


class Chain(torch.nn.Module):
    def __init__(self, n_predict, tied, embed, lm_head, vocab):
        super().__init__()
        size = embed.shape[1]
        self.n_predict, self.tied = n_predict, tied
        self.state_weight = 0.5 ** (0.5 / n_predict)
        self.emb_weight = math.sqrt(1 - self.state_weight**2) * math.sqrt(size / 2)
        shared = sorted({step_names(i, tied)[0] for i in range(n_predict)})
        projs = sorted({step_names(i, tied)[1] for i in range(n_predict)})
        # the trained rows: sub-vocabulary `vocab` [V'] of the full embedding / head
        self.emb = torch.nn.ParameterDict({j: embed[vocab].clone() for j in shared})
        self.head = torch.nn.ParameterDict({j: lm_head[vocab].clone() for j in shared})
        self.ln_w = torch.nn.ParameterDict({j: torch.ones(size) for j in shared})
        self.ln_b = torch.nn.ParameterDict({j: torch.zeros(size) for j in shared})
        self.proj = torch.nn.ParameterDict({j: torch.eye(size) for j in projs})

    def forward(self, hidden, inputs):
        """hidden [n, H], inputs [n, steps] (sub-vocabulary indices) -> logits per step, each
        [n, V']."""
        state = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + 1e-6) * 2**-0.5
        logits = []
        for i in range(self.n_predict):
            shared, proj = step_names(i, self.tied)
            z = F.embedding(inputs[:, i], self.emb[shared]) * self.emb_weight
            state = F.linear(state, self.proj[proj]) * self.state_weight + z
            state = state * torch.rsqrt(state.pow(2).mean(-1, keepdim=True) + 1e-6)
            state = F.gelu(state * self.ln_w[shared] + self.ln_b[shared])
            logits.append(F.linear(state, self.head[shared]))
        return logits


def train_mlp(hidden, targets, inputs, embed, lm_head, args) -> dict[str, torch.Tensor]:
    """Train the chain on rows (hidden [n, H], targets and inputs [n, n_predict], -1 past the
    end); returns the checkpoint's tensors over the full vocabulary."""
    known = torch.cat([targets[targets >= 0], inputs[inputs >= 0]])
    vocab = torch.unique(known)  # the sub-vocabulary
    index = torch.full((lm_head.shape[0],), -1, dtype=torch.long)
    index[vocab] = torch.arange(len(vocab))
    chain = Chain(args.heads, not args.untied, embed, lm_head, vocab)
    sub_inputs = index[inputs.clamp(min=0)].clamp(min=0)  # past the end: masked out below
    with torch.no_grad():  # the LM head's rows on the chain's GELU states: logits of std 1
        (first, *_) = chain(hidden[: args.batch], sub_inputs[: args.batch])
        for head in chain.head.values():
            head /= first.std()
    optimizer = torch.optim.AdamW(chain.parameters(), lr=args.lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(args.seed)
    steps = args.epochs * ((len(hidden) + args.batch - 1) // args.batch)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, args.lr, total_steps=steps, pct_start=0.1
    )
    for epoch in range(args.epochs):
        order = torch.randperm(len(hidden), generator=g)
        total = 0.0
        for start in range(0, len(hidden), args.batch):
            rows = order[start : start + args.batch]
            t = targets[rows]
            loss = 0.0
            for i, logits in enumerate(chain(hidden[rows], sub_inputs[rows])):
                keep = t[:, i] >= 0
                if keep.any():
                    loss = loss + F.cross_entropy(logits[keep], index[t[keep, i]])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            total += float(loss.detach()) * len(rows)
        print(f"  epoch {epoch + 1}: loss per step {total / len(hidden) / args.heads:.3f}")
    return full_tensors(chain, embed, vocab)


@torch.no_grad()
def full_tensors(chain: Chain, embed, vocab) -> dict[str, torch.Tensor]:
    tensors = {}
    for j in chain.emb:
        emb = embed.clone()
        emb[vocab] = chain.emb[j]
        head = torch.zeros_like(embed)
        head[vocab] = chain.head[j]
        tensors[f"speculator.emb.{j}.weight"] = emb.contiguous()
        tensors[f"speculator.head.{j}.weight"] = head.contiguous()
        tensors[f"speculator.ln.{j}.weight"] = chain.ln_w[j].detach().clone()
        tensors[f"speculator.ln.{j}.bias"] = chain.ln_b[j].detach().clone()
    for j in chain.proj:
        tensors[f"speculator.proj.{j}.weight"] = chain.proj[j].detach().clone()
    return tensors


def mlp_config(base: Path, n_predict: int, tied: bool, size: int, vocab: int) -> dict:
    return {
        "architectures": ["MLPSpeculatorPreTrainedModel"],
        "model_type": "mlp_speculator",
        "base_model_name_or_path": str(Path(base).resolve()),
        "emb_dim": size,
        "inner_dim": size,
        "n_predict": n_predict,
        "n_candidates": n_predict,
        "top_k_tokens_per_head": [1] * n_predict,
        "vocab_size": vocab,
        "tie_weights": tied,
        "scale_input": True,
    }


def save_mlp(out: Path, tensors: dict, config: dict) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


@torch.no_grad()
def evaluate_mlp(hidden, targets, inputs, tensors, config) -> tuple[list[float], list[float]]:
    """(top-1 per step, chain acceptance per step) over rows with every target, with pytgi's own
    MLP speculator (its chain feeds its guesses, as serving does) over the full vocabulary."""
    from pytgi.models.speculators import MLPSpeculator

    full = (targets >= 0).all(dim=1)
    speculator = MLPSpeculator(tensors, config)
    drafts = speculator.propose(hidden[full], inputs[full, 0], config["n_predict"])  # [n, k]
    right = drafts == targets[full]
    chain = right.long().cumprod(dim=1).bool()
    return right.float().mean(0).tolist(), chain.float().mean(0).tolist()
