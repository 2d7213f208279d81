"""Train pytgi's bundled demo model (pytgi/demo_model/) from public-domain text, on the CPU.

Owns the whole recipe: corpus extraction and held-out split, the byte-level BPE tokenizer, a small
Llama trained with AdamW (warm-up + cosine decay) on packed 256-token windows, held-out perplexity
against a unigram baseline, and the Hugging Face checkpoint layout that pytgi and transformers load.

Corpus: the King James Bible (1611, public domain) from Debian:
    apt-get update && apt-get install bible-kjv      # pulls in bible-kjv-text
`/usr/lib/bible.data` (from bible-kjv-text) is compressed; it is read through the package's own
`bible` program, which needs `bible.data.conc` beside it. Any plain UTF-8 text file also works:
    bible -l100000 gen1:1-rev22:21 > kjv.txt && python scripts/train_demo_model.py --corpus kjv.txt

Usage (the committed model): python scripts/train_demo_model.py --max-minutes 30
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

# libgomp reads this when torch loads it: passive waiting keeps 2 threads from collapsing when
# another process holds one of the 2 cores (spinning waits burn the core the other thread needs).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import (  # noqa: E402
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

DEFAULT_CORPUS = "/usr/lib/bible.data"
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "pytgi" / "demo_model"
BOS, EOS, UNK, PAD = "<s>", "</s>", "<unk>", "<pad>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]
SPECIAL_TOKENS = [UNK, BOS, EOS, PAD, *ROLE_TOKENS]
# About 2% of the KJV's characters: narrative, prophecy and epistles, never seen in training.
HELDOUT_BOOKS = ("Ruth", "Jonah", "Micah", "Philippians", "Titus", "James", "1 John", "Jude")
GENERIC_HELDOUT_FRACTION = 0.02
MAX_POSITION_EMBEDDINGS = 1024
SAMPLE_PROMPTS = ("And God said", "And the LORD spake unto Moses, saying", "Blessed are the")
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' and not loop.first %}"
    "{{ raise_exception('A system message is only allowed as the first message') }}"
    "{% elif message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('Unknown role: ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

Document = tuple[str, str]  # (book or source name, text)
Logger = Callable[[str], None]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--corpus", default=DEFAULT_CORPUS, help="bible.data (Debian) or a text file")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="checkpoint directory")
    p.add_argument("--log-file", default="train_demo_model.log")
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--intermediate-size", type=int, default=768)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--num-heads", type=int, default=8)
    p.add_argument("--num-kv-heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--warmup-steps", type=int, default=30)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--max-steps", type=int, default=100_000)
    p.add_argument("--max-minutes", type=float, default=30.0, help="training wall-clock budget")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def make_logger(path: str) -> Logger:
    log_file = open(path, "a", encoding="utf-8")  # closed at exit: the run appends to it throughout

    def log(message: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {message}"
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    return log


# ---------------------------------------------------------------- corpus


def read_corpus(path: str) -> str:
    """Returns the corpus as text; Debian's compressed bible.data goes through `bible`."""
    corpus = Path(path)
    if not corpus.is_file():
        raise SystemExit(f"corpus {path!r} not found; install it with: apt-get install bible-kjv")
    with corpus.open("rb") as f:
        magic = f.read(4)
    if magic != b"EC02":
        return corpus.read_text(encoding="utf-8")
    return dump_bible_data(corpus)


def dump_bible_data(data_file: Path) -> str:
    reader = shutil.which("bible")
    if reader is None:
        raise SystemExit(
            f"{data_file} is compressed; install its reader: apt-get install bible-kjv"
        )
    if not Path(f"{data_file}.conc").is_file():
        raise SystemExit(f"{data_file}.conc is missing; the `bible` reader needs it")
    cmd = [reader, "-l100000", "-p", str(data_file.parent), "-d", data_file.name, "gen1:1-rev22:21"]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def parse_chapters(text: str) -> list[Document]:
    """Splits a `bible` dump ("Genesis 1" headers, "  1 verse" lines) into one document per
    chapter, verses one per line without their numbers. Returns [] for other text."""
    chapters: list[Document] = []
    header, verses = None, []
    for line in text.splitlines():
        if match := re.fullmatch(r"(\S.*) \d+", line):
            if header and verses:
                chapters.append((header, "\n".join(verses) + "\n"))
            header, verses = match.group(1), []
        elif header and (match := re.fullmatch(r"\s+\d+ (.*)", line)):
            verses.append(match.group(1).strip())
    if header and verses:
        chapters.append((header, "\n".join(verses) + "\n"))
    return chapters


def split_corpus(text: str) -> tuple[list[Document], list[Document]]:
    """Returns (train, held-out): whole KJV books, or the last ~2% of any other text."""
    chapters = parse_chapters(text)
    if chapters:
        train = [c for c in chapters if c[0] not in HELDOUT_BOOKS]
        heldout = [c for c in chapters if c[0] in HELDOUT_BOOKS]
        return train, heldout
    cut = text.rfind("\n", 0, int(len(text) * (1 - GENERIC_HELDOUT_FRACTION))) + 1
    if cut <= 0:
        raise SystemExit("the corpus needs at least two lines to hold some out")
    return [("text", text[:cut])], [("heldout", text[cut:])]


# ---------------------------------------------------------------- tokenizer


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE: any text encodes (no <unk> in practice) and decodes back exactly."""
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    bos_id = tokenizer.token_to_id(BOS)
    # add_special_tokens=True prepends <s> (Llama convention); chat prompts get it from the
    # template and are encoded with add_special_tokens=False.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tokenizer


def wrap_tokenizer(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        additional_special_tokens=ROLE_TOKENS,
        model_max_length=MAX_POSITION_EMBEDDINGS,
        clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE,
        model_input_names=["input_ids", "attention_mask"],  # Llama takes no token_type_ids
    )


def encode_documents(tokenizer: Tokenizer, docs: list[Document]) -> torch.Tensor:
    """Packs `<s> text </s>` for every document into one stream of ids. Returns [num_tokens]."""
    bos_id, eos_id = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
    encodings = tokenizer.encode_batch([text for _, text in docs], add_special_tokens=False)
    ids: list[int] = []
    for encoding in encodings:
        ids.extend([bos_id, *encoding.ids, eos_id])
    return torch.tensor(ids, dtype=torch.long)  # [num_tokens]


# ---------------------------------------------------------------- model and training


def build_model(args: argparse.Namespace, tokenizer: Tokenizer) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.num_layers,
        num_attention_heads=args.num_heads,
        num_key_value_heads=args.num_kv_heads,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.token_to_id(BOS),
        eos_token_id=tokenizer.token_to_id(EOS),
        pad_token_id=tokenizer.token_to_id(PAD),
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    return model


def build_optimizer(model: torch.nn.Module, args: argparse.Namespace) -> torch.optim.AdamW:
    """Weight decay on the projection matrices only, not on norms or the tied embedding."""
    params = dict(model.named_parameters())
    decay = [p for n, p in params.items() if p.ndim >= 2 and "embed_tokens" not in n]
    no_decay = [p for n, p in params.items() if p.ndim < 2 or "embed_tokens" in n]
    groups = [
        {"params": decay, "weight_decay": args.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)


def learning_rate(step: int, progress: float, args: argparse.Namespace) -> float:
    """Linear warm-up, then cosine decay to min_lr_ratio over the run's progress in [0, 1]."""
    warmup = min(1.0, (step + 1) / args.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return args.lr * warmup * (args.min_lr_ratio + (1.0 - args.min_lr_ratio) * cosine)


def sample_batch(ids: torch.Tensor, batch_size: int, seq_len: int, gen: torch.Generator):
    """Random windows of the packed stream. Returns [batch_size, seq_len]."""
    starts = torch.randint(0, ids.numel() - seq_len, (batch_size,), generator=gen)  # [B]
    offsets = starts[:, None] + torch.arange(seq_len)[None, :]  # [B, T]
    return ids[offsets]  # [B, T]


@torch.no_grad()
def heldout_nll(model: LlamaForCausalLM, ids: torch.Tensor, seq_len: int, batch_size: int):
    """Sum of next-token NLL (nats) over non-overlapping windows. Returns (nll, num_targets)."""
    model.eval()
    windows = ids[: ids.numel() // seq_len * seq_len].view(-1, seq_len)  # [N, T]
    total, count = 0.0, 0
    for batch in windows.split(batch_size):  # [b, T]
        logits = model(input_ids=batch).logits[:, :-1]  # [b, T-1, V]
        targets = batch[:, 1:]  # [b, T-1]
        total += F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum").item()
        count += targets.numel()
    model.train()
    return total, count


def unigram_nll(train_ids: torch.Tensor, ids: torch.Tensor, seq_len: int, vocab_size: int):
    """The same targets as heldout_nll scored by add-one unigram frequencies of the train set."""
    counts = torch.bincount(train_ids, minlength=vocab_size).double() + 1.0  # [V]
    log_probs = (counts / counts.sum()).log()  # [V]
    windows = ids[: ids.numel() // seq_len * seq_len].view(-1, seq_len)  # [N, T]
    targets = windows[:, 1:].flatten()  # [N * (T-1)]
    return -log_probs[targets].sum().item(), targets.numel()


def train(model, train_ids, heldout_ids, args, log: Logger) -> int:
    """Runs until max_steps or max_minutes; the cosine follows whichever is further along."""
    optimizer = build_optimizer(model, args)
    gen = torch.Generator().manual_seed(args.seed)
    start, step, tokens = time.monotonic(), 0, 0
    model.train()
    while True:
        elapsed = time.monotonic() - start
        progress = max(step / args.max_steps, elapsed / (args.max_minutes * 60.0))
        if progress >= 1.0:
            return step
        lr = learning_rate(step, progress, args)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = sample_batch(train_ids, args.batch_size, args.seq_len, gen)  # [B, T]
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        optimizer.step()
        step, tokens = step + 1, tokens + batch.numel()
        if step % args.log_every == 0:
            rate = tokens / (time.monotonic() - start)
            log(
                f"step {step} loss {loss.item():.4f} lr {lr:.2e} gnorm {grad_norm:.2f} "
                f"tok/s {rate:.0f} elapsed {elapsed / 60:.1f}m"
            )
        if step % args.eval_every == 0:
            nll, count = heldout_nll(model, heldout_ids, args.seq_len, args.batch_size)
            log(f"step {step} heldout loss {nll / count:.4f} ppl {math.exp(nll / count):.2f}")


# ---------------------------------------------------------------- output


def log_samples(model: LlamaForCausalLM, hf_tokenizer: PreTrainedTokenizerFast, log: Logger):
    model.eval()
    for prompt in SAMPLE_PROMPTS:
        inputs = hf_tokenizer(prompt, return_tensors="pt")
        greedy = model.generate(**inputs, max_new_tokens=48, do_sample=False)
        torch.manual_seed(0)
        sampled = model.generate(
            **inputs, max_new_tokens=48, do_sample=True, temperature=0.8, top_p=0.95
        )
        for name, out in (("greedy", greedy), ("sampled t=0.8 top_p=0.95 seed=0", sampled)):
            text = hf_tokenizer.decode(out[0], skip_special_tokens=True)
            log(f"sample [{name}] {text!r}")


def save_checkpoint(model, hf_tokenizer: PreTrainedTokenizerFast, out: Path) -> None:
    """Writes the HF layout; the chat template stays inside tokenizer_config.json."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    hf_tokenizer.save_pretrained(out, save_jinja_files=False)


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    log = make_logger(args.log_file)
    log(f"args {vars(args)}")
    train_docs, heldout_docs = split_corpus(read_corpus(args.corpus))
    train_chars = sum(len(t) for _, t in train_docs)
    heldout_chars = sum(len(t) for _, t in heldout_docs)
    share = heldout_chars / (train_chars + heldout_chars)
    log(
        f"corpus: {len(train_docs)} train docs ({train_chars} chars), {len(heldout_docs)} "
        f"held-out docs ({heldout_chars} chars, {share:.2%})"
    )
    tokenizer = train_tokenizer([t for _, t in train_docs], args.vocab_size)
    train_ids = encode_documents(tokenizer, train_docs)  # [num_train_tokens]
    heldout_ids = encode_documents(tokenizer, heldout_docs)  # [num_heldout_tokens]
    log(
        f"tokenizer: vocab {tokenizer.get_vocab_size()}, {train_ids.numel()} train tokens, "
        f"{heldout_ids.numel()} held-out tokens"
    )
    model = build_model(args, tokenizer)
    log(f"model: {sum(p.numel() for p in model.parameters())} parameters (tied embeddings)")
    start = time.monotonic()
    steps = train(model, train_ids, heldout_ids, args, log)
    train_s = time.monotonic() - start
    seen = steps * args.batch_size * args.seq_len
    log(
        f"trained {steps} steps, {seen} tokens ({seen / train_ids.numel():.2f} epochs) "
        f"in {train_s / 60:.1f} min"
    )
    nll, count = heldout_nll(model, heldout_ids, args.seq_len, args.batch_size)
    base, _ = unigram_nll(train_ids, heldout_ids, args.seq_len, tokenizer.get_vocab_size())
    log(
        f"final heldout loss {nll / count:.4f} ppl {math.exp(nll / count):.2f} over {count} "
        f"tokens; unigram baseline ppl {math.exp(base / count):.2f}"
    )
    hf_tokenizer = wrap_tokenizer(tokenizer)
    save_checkpoint(model, hf_tokenizer, Path(args.out))
    log(f"saved to {args.out}")
    log_samples(model, hf_tokenizer, log)


if __name__ == "__main__":
    main()
