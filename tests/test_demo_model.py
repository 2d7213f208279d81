"""The bundled demo model (pytgi/demo_model/): a trained checkpoint that transformers and tokenizers
load, that scores held-out KJV text far better than chance and greedily writes English words,
where the same architecture with random weights does neither."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from tokenizers import Tokenizer
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from pytgi.demo_model import demo_model_path

MODEL_DIR = Path(demo_model_path())
CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
)
# Ruth 1:16; the whole book of Ruth is held out of training.
HELDOUT_VERSE = (
    "And Ruth said, Intreat me not to leave thee, or to return from following after thee: for "
    "whither thou goest, I will go; and where thou lodgest, I will lodge: thy people shall be my "
    "people, and thy God my God:\n"
)
ROUND_TRIP_TEXT = "  In the beginning\n\nGod  created\tthe heaven, é 漢字 🙂 and the earth.\n"


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(MODEL_DIR)


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return AutoModelForCausalLM.from_pretrained(MODEL_DIR).eval()


@pytest.fixture(scope="module")
def untrained_model(model) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(model.config).eval()


@pytest.fixture(scope="module")
def vocabulary_words(tokenizer) -> list[str]:
    """Alphabetic tokens that start with a space (Ġ), lower-cased, in BPE merge order: the ids
    grow with merge order, so the first ones are the corpus's most frequent words."""
    words = [
        (i, t[1:].lower())
        for t, i in tokenizer.get_vocab().items()
        if re.fullmatch(r"Ġ[A-Za-z]+", t)
    ]
    return [word for _, word in sorted(words)]


def test_demo_model_path_is_the_package_directory():
    assert MODEL_DIR.is_dir()
    assert MODEL_DIR == Path(__file__).resolve().parents[1] / "pytgi" / "demo_model"


def test_checkpoint_is_small_fp32_safetensors():
    for name in CHECKPOINT_FILES:
        assert (MODEL_DIR / name).is_file(), name
    assert not list(MODEL_DIR.glob("*.bin")) and not list(MODEL_DIR.glob("*.pt"))
    total_bytes = sum(p.stat().st_size for p in MODEL_DIR.iterdir() if p.is_file())
    assert total_bytes < 50 * 1024 * 1024
    with safe_open(MODEL_DIR / "model.safetensors", framework="pt") as f:
        dtypes = {f.get_slice(name).get_dtype() for name in f.keys()}
    assert dtypes == {"F32"}


def test_config_is_a_gqa_llama_with_tied_embeddings():
    config = AutoConfig.from_pretrained(MODEL_DIR)
    assert config.architectures == ["LlamaForCausalLM"]
    assert config.model_type == "llama"
    assert config.tie_word_embeddings
    assert config.num_key_value_heads < config.num_attention_heads
    assert config.max_position_embeddings == 1024


def test_both_tokenizer_loaders_agree_and_round_trip(tokenizer):
    raw = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
    ids = tokenizer(ROUND_TRIP_TEXT)["input_ids"]
    assert ids == raw.encode(ROUND_TRIP_TEXT).ids
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == ROUND_TRIP_TEXT
    assert raw.decode(raw.encode(ROUND_TRIP_TEXT, add_special_tokens=False).ids) == ROUND_TRIP_TEXT
    assert tokenizer(ROUND_TRIP_TEXT, add_special_tokens=False)["input_ids"] == ids[1:]


def test_special_tokens_match_the_model_config(tokenizer, model):
    assert tokenizer.bos_token == "<s>" and tokenizer.eos_token == "</s>"
    assert tokenizer.pad_token == "<pad>"
    assert tokenizer.model_max_length == model.config.max_position_embeddings
    assert tokenizer.bos_token_id == model.config.bos_token_id
    assert (
        tokenizer.eos_token_id == model.config.eos_token_id == model.generation_config.eos_token_id
    )
    assert len(tokenizer) == model.config.vocab_size


def test_chat_template_uses_role_tokens(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == "<s><|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\n"
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert ids.count(tokenizer.bos_token_id) == 1
    assert tokenizer.convert_tokens_to_ids("<|assistant|>") in ids
    with pytest.raises(Exception, match="system message"):
        tokenizer.apply_chat_template(messages[::-1], tokenize=False)


def heldout_perplexity(model: LlamaForCausalLM, tokenizer) -> float:
    ids = tokenizer(HELDOUT_VERSE, return_tensors="pt")["input_ids"]  # [1, T]
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss
    return math.exp(loss.item())


def test_heldout_verse_perplexity_is_far_below_chance(model, untrained_model, tokenizer):
    # The committed model scores about 70 here (85 on all held-out books, where the train-set
    # unigram model scores 466); random weights score about 4000.
    assert heldout_perplexity(model, tokenizer) < 150.0
    assert heldout_perplexity(untrained_model, tokenizer) > 1000.0


def greedy_words(model: LlamaForCausalLM, tokenizer, prompt: str) -> list[str]:
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=40, do_sample=False)  # [1, T + 40]
    completion = out[0, inputs["input_ids"].shape[1] :]  # [40]
    return re.findall(r"[A-Za-z]+", tokenizer.decode(completion, skip_special_tokens=True))


def reads_as_english(words: list[str], vocabulary_words: list[str]) -> bool:
    """Varied words (random weights loop on 2-3 tokens), nearly all whole vocabulary words, and
    at least half of them among the 200 most frequent ones (the, and, unto, said, LORD, ...)."""
    lower = [w.lower() for w in words]
    known = sum(w in set(vocabulary_words) for w in lower)
    common = sum(w in set(vocabulary_words[:200]) for w in lower)
    return len(set(lower)) >= 8 and known >= 0.85 * len(lower) and common >= 0.5 * len(lower)


def test_greedy_generation_is_english(model, untrained_model, tokenizer, vocabulary_words):
    words = greedy_words(model, tokenizer, "And God said")
    assert reads_as_english(words, vocabulary_words), words
    untrained_words = greedy_words(untrained_model, tokenizer, "And God said")
    assert not reads_as_english(untrained_words, vocabulary_words), untrained_words
