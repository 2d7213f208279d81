"""Write a random-weight checkpoint of a model family with SmolLM-135M's parameter count: the
per-family benchmark models of docs/PERFORMANCE.md ("Model families").

    python scripts/make_family_shaped.py gemma2 /tmp/shaped-gemma2
    python scripts/make_family_shaped.py --list

Every family gets SmolLM-135M's widths where it can (hidden 576, 30 layers, 9 query heads of 64,
vocabulary 49152, 2048 positions, tied embeddings unless the family has an LM-head bias) and its
own structure (plain or gated MLP, multi-query or grouped KV heads, biases, post-norms); the MLP
width is then chosen so that the parameter count is SmolLM's 134.5 M (within 0.3 %). `baichuan`
writes the 13B layout (ALiBi, W_pack) from a Llama of that shape. The tokenizer comes from
make_smollm_shaped.py (the demo model's when installed).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import make_smollm_shaped as smollm  # noqa: E402

TARGET_PARAMS = 134_515_008  # SmolLM-135M (make_smollm_shaped.py)
BASE = dict(vocab_size=49152, max_position_embeddings=2048, tie_word_embeddings=True)
LLAMA = dict(
    BASE,
    hidden_size=576,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    rms_norm_eps=1e-5,
)
GPT = dict(  # GPT-2 style names (learned positions, n_inner)
    vocab_size=49152,
    n_positions=2048,
    n_embd=576,
    n_layer=30,
    n_head=9,
    tie_word_embeddings=True,
)

# family -> (config class, model class, config kwargs, the name of the MLP width field)
FAMILIES: dict[str, tuple[str, str, dict, str]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", LLAMA, "intermediate_size"),
    "phi": (
        "PhiConfig",
        "PhiForCausalLM",
        dict(LLAMA, partial_rotary_factor=0.5, tie_word_embeddings=False),
        "intermediate_size",
    ),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", LLAMA, "intermediate_size"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(LLAMA, head_dim=64), "intermediate_size"),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(LLAMA, head_dim=64, query_pre_attn_scalar=64, sliding_window=1024),
        "intermediate_size",
    ),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(LLAMA, head_dim=64, query_pre_attn_scalar=64, sliding_window=512),
        "intermediate_size",
    ),
    "cohere": ("CohereConfig", "CohereForCausalLM", LLAMA, "intermediate_size"),
    "starcoder2": (
        "Starcoder2Config",
        "Starcoder2ForCausalLM",
        dict(LLAMA, sliding_window=1024),
        "intermediate_size",
    ),
    "falcon_7b": (
        "FalconConfig",
        "FalconForCausalLM",
        dict(BASE, hidden_size=576, num_hidden_layers=30, num_attention_heads=9, multi_query=True),
        "ffn_hidden_size",
    ),
    "falcon_40b": (
        "FalconConfig",
        "FalconForCausalLM",
        dict(
            BASE,
            hidden_size=576,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_kv_heads=3,
            new_decoder_architecture=True,
        ),
        "ffn_hidden_size",
    ),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", GPT, "n_inner"),
    "gpt_bigcode": ("GPTBigCodeConfig", "GPTBigCodeForCausalLM", GPT, "n_inner"),
    "gptj": (
        "GPTJConfig",
        "GPTJForCausalLM",
        dict(GPT, rotary_dim=32, tie_word_embeddings=False),
        "n_inner",
    ),
    "baichuan": (  # written as a Llama, then in Baichuan's layout (no GQA, no tied head)
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(LLAMA, num_key_value_heads=9, tie_word_embeddings=False),
        "intermediate_size",
    ),
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("family", nargs="?", choices=sorted(FAMILIES))
    parser.add_argument("out_dir", nargs="?", type=Path, help="directory to write")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument("--list", action="store_true", help="print each family's MLP width")
    return parser.parse_args()


def make_config(family: str, width: int, token_ids: dict):
    import transformers

    config_cls, model_cls, kwargs, width_field = FAMILIES[family]
    config = getattr(transformers, config_cls)(**kwargs, **{width_field: width}, **token_ids)
    config.architectures = [model_cls]
    return config


def num_params(family: str, width: int) -> int:
    import torch
    import transformers

    config = make_config(family, width, {})
    with torch.device("meta"):
        model = getattr(transformers, FAMILIES[family][1])(config)
    return sum(p.numel() for p in model.parameters())


def mlp_width(family: str) -> int:
    """The MLP width (a multiple of 32) whose parameter count is closest to SmolLM-135M's."""
    low, high = 32, 32 * 1024
    while high - low > 32:  # the count grows with the width
        mid = (low + high) // 64 * 32
        if num_params(family, mid) < TARGET_PARAMS:
            low = mid
        else:
            high = mid
    return min((low, high), key=lambda w: abs(num_params(family, w) - TARGET_PARAMS))


def to_baichuan(out_dir: Path) -> None:
    """The Llama just written, in Baichuan-13B's layout (W_pack, ALiBi at this width)."""
    import torch
    from safetensors.torch import load_file, save_file

    config = json.loads((out_dir / "config.json").read_text())
    tensors = load_file(out_dir / "model.safetensors")
    for i in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{i}.self_attn."
        parts = [tensors.pop(f"{prefix}{name}_proj.weight") for name in "qkv"]
        tensors[f"{prefix}W_pack.weight"] = torch.cat(parts)
    config.update(architectures=["BaichuanForCausalLM"], model_type="baichuan")
    config["model_max_length"] = config.pop("max_position_embeddings")
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})


def main() -> None:
    args = parse_args()
    if args.list:
        for family in FAMILIES:
            width = mlp_width(family)
            print(f"{family}: MLP width {width}, {num_params(family, width) / 1e6:.2f} M")
        return
    if args.family is None or args.out_dir is None:
        raise SystemExit("error: give a family and an output directory (or --list)")
    import torch
    import transformers

    start_s = time.perf_counter()
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    smollm.copy_tokenizer(smollm.tokenizer_source(None), out_dir)
    config = make_config(args.family, mlp_width(args.family), smollm.special_ids(out_dir))
    torch.manual_seed(args.seed)
    model = getattr(transformers, FAMILIES[args.family][1])(config).float().eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    count = sum(p.numel() for p in model.parameters())
    if args.family == "baichuan":
        to_baichuan(out_dir)
    print(
        f"wrote {args.family} to {out_dir}: {count / 1e6:.1f} M parameters, "
        f"{time.perf_counter() - start_s:.0f} s"
    )


if __name__ == "__main__":
    main()
