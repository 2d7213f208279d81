"""Write a SmolLM-135M-shaped Llama with random weights: the benchmark model (no hub needed).

    python scripts/make_smollm_shaped.py /tmp/smollm-shaped
    python scripts/make_smollm_shaped.py /tmp/llama-1b --shape llama-3.2-1b --dtype bfloat16 \
        --device cuda   # the GPU benchmark's model

Shape of HuggingFaceTB/SmolLM-135M: hidden 576, 30 layers, 9 heads, 3 KV heads, intermediate 1536,
vocab 49152, tied embeddings, 2048 positions; fp32, 134.5 M parameters, about 540 MB on disk, so
write it outside the repository. `--shape llama-3.2-1b` gives meta-llama/Llama-3.2-1B's shape
(hidden 2048, 16 layers, 32 heads, 8 KV heads, intermediate 8192, vocab 128256, tied, llama3 rope
scaling): 1.24 B parameters, 2.5 GB in bf16. The output is a real checkpoint (config.json,
model.safetensors, generation_config.json, tokenizer files). The tokenizer is the demo model's
when it is installed, else a small byte-level BPE trained here; its vocabulary is smaller than the
model's, which is fine for benchmarks that feed token ids.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

SMOLLM_135M = dict(
    hidden_size=576,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    intermediate_size=1536,
    vocab_size=49152,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    hidden_act="silu",
    initializer_range=0.02,
)
LLAMA_32_1B = dict(
    hidden_size=2048,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=64,
    intermediate_size=8192,
    vocab_size=128256,
    max_position_embeddings=131072,
    tie_word_embeddings=True,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    hidden_act="silu",
    initializer_range=0.02,
)
SHAPES = {"smollm-135m": SMOLLM_135M, "llama-3.2-1b": LLAMA_32_1B}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")
BPE_VOCAB_SIZE = 512
BPE_CORPUS = """\
This checkpoint has the shape of a small open language model and weights drawn at random.
It exists to measure an inference server: prompt processing, token by token decoding, batching,
memory bandwidth and arithmetic throughput. Its outputs carry no meaning at all.
The quick brown fox jumps over the lazy dog; 0 1 2 3 4 5 6 7 8 9; {"key": [1, 2, 3]}.
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path, help="directory to write (e.g. /tmp/smollm-shaped)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument("--shape", choices=tuple(SHAPES), default="smollm-135m")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument("--device", default="cpu", help="where to draw the weights (cuda: faster)")
    parser.add_argument(
        "--tokenizer-from", type=Path, help="copy the tokenizer files from this model directory"
    )
    return parser.parse_args()


def tokenizer_source(explicit: Path | None) -> Path | None:
    if explicit is not None:
        if not (explicit / "tokenizer.json").exists():
            raise SystemExit(f"error: no tokenizer.json in {explicit}")
        return explicit
    from pytgi.demo_model import demo_model_path

    demo = Path(demo_model_path())
    return demo if (demo / "tokenizer.json").exists() else None


def copy_tokenizer(source: Path, out_dir: Path) -> None:
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy2(source / name, out_dir / name)


def train_tokenizer(out_dir: Path) -> None:
    """A byte-level BPE (any text encodes) with <s>/</s>/<pad> specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([BPE_CORPUS], trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=SMOLLM_135M["max_position_embeddings"],  # the tokenizer's, not the model's
    )
    wrapped.save_pretrained(out_dir)


def special_ids(out_dir: Path) -> dict[str, int | None]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    return {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }


def build_model(args: argparse.Namespace, token_ids: dict[str, int | None]):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**SHAPES[args.shape], **token_ids)
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(args.seed)
    with torch.device(args.device):
        model = LlamaForCausalLM(config)
    return model.to(getattr(torch, args.dtype)).eval()


def main() -> None:
    args = parse_args()
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    start_s = time.perf_counter()
    source = tokenizer_source(args.tokenizer_from)
    if source is None:
        train_tokenizer(out_dir)
    else:
        copy_tokenizer(source, out_dir)
    model = build_model(args, special_ids(out_dir))
    model.save_pretrained(out_dir, safe_serialization=True)
    num_params = sum(p.numel() for p in model.parameters())
    size_mb = sum(f.stat().st_size for f in out_dir.glob("*.safetensors")) / 1e6
    print(
        f"wrote {out_dir}: {num_params / 1e6:.1f} M parameters, {size_mb:.0f} MB of safetensors, "
        f"tokenizer {'from ' + str(source) if source else 'trained here'}, "
        f"{time.perf_counter() - start_s:.0f} s"
    )


if __name__ == "__main__":
    main()
