"""Helpers for the vision-language parity tests: prompts with images built by pytgi's own image
pipeline, and transformers' eager greedy generate on the same processor outputs."""

from __future__ import annotations

import asyncio
import uuid

import numpy as np
import torch
from fixtures.images import data_uri, png_bytes

from pytgi.messages.request import EngineRequest
from pytgi.messages.sampling_params import SamplingParams, StoppingParams
from pytgi.router.images.config import ImageConfig
from pytgi.router.images.pipeline import ImagePipeline
from pytgi.tokenizer.tokenizer import Tokenizer


class VlmPrompts:
    def __init__(self, model_dir):
        self.tokenizer = Tokenizer.from_dir(model_dir)
        self.pipeline = ImagePipeline.for_model(
            model_dir, self.tokenizer.backend.token_to_id, ImageConfig()
        )

    def build(self, text: str, images: list[tuple[int, int, int]]):
        """`text` with `{0}`, `{1}`... where images (width, height, seed) go -> (ids, inputs)."""
        uris = [f"![]({data_uri(png_bytes(w, h, seed))})" for w, h, seed in images]
        expanded, processed = asyncio.run(self.pipeline.expand(text.format(*uris)))
        ids = self.tokenizer.encode(expanded, add_special_tokens=False).ids
        return ids, self.pipeline.place(ids, processed)


def processor_inputs(processor, text: str, images: list[tuple[int, int, int]], kept: tuple):
    """The model's own transformers processor on `text` (images as its image token) and the
    same PNGs -> (ids, its tensors named in `kept`): the reference's inputs."""
    import io

    from PIL import Image

    pils = [Image.open(io.BytesIO(png_bytes(w, h, seed))) for w, h, seed in images]
    out = processor(text=text, images=[pils] if pils else None, return_tensors="pt")
    return out["input_ids"][0].tolist(), {k: v for k, v in out.items() if k in kept}


def engine_request(ids, images, max_new_tokens: int) -> EngineRequest:
    stopping = StoppingParams(max_new_tokens=max_new_tokens, ignore_eos_token=True)
    return EngineRequest(
        uuid.uuid4().hex, list(ids), SamplingParams(), stopping, multimodal_inputs=images
    )


@torch.no_grad()
def hf_greedy(
    hf, ids, images, max_new_tokens: int, inputs: dict | None = None
) -> tuple[list[int], list[float]]:
    """transformers' greedy tokens and each chosen token's logprob, on the same pixel values
    (or on `inputs`, the model's own processor's tensors besides the ids, when given)."""
    kwargs = dict(inputs or {})
    if images and inputs is None:
        for name in images[0].features:
            arrays = [i.features[name] for i in images]
            if hf.config.model_type == "idefics2":  # images of a sample padded to the largest
                h, w = max(a.shape[-2] for a in arrays), max(a.shape[-1] for a in arrays)
                pads = [[(0, 0)] * (a.ndim - 2) + [(0, h - a.shape[-2]), (0, w - a.shape[-1])]
                        for a in arrays]  # fmt: skip
                arrays = [np.pad(a, pad) for a, pad in zip(arrays, pads, strict=True)]
            if arrays[0].ndim == 5:  # Llava-Next tiles [1, P, C, S, S]: padded to the most P
                most = max(a.shape[1] for a in arrays)
                pads = [[(0, 0), (0, most - a.shape[1])] + [(0, 0)] * 3 for a in arrays]
                arrays = [np.pad(a, pad) for a, pad in zip(arrays, pads, strict=True)]
            kwargs[name] = torch.from_numpy(np.concatenate(arrays))
        tiles_per_sample = hf.config.model_type in ("idefics2", "idefics3")
        if kwargs["pixel_values"].dim() == 4 and tiles_per_sample:  # one sample of n tiles
            kwargs["pixel_values"] = kwargs["pixel_values"].unsqueeze(0)
            if "pixel_attention_mask" in kwargs:  # [n, H, W] -> [1, n, H, W]
                kwargs["pixel_attention_mask"] = kwargs["pixel_attention_mask"].unsqueeze(0)
    out = hf.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=0,
        output_scores=True,
        return_dict_in_generate=True,
        **kwargs,
    )
    tokens = out.sequences[0, len(ids) :].tolist()
    logprobs = [
        torch.log_softmax(s[0], -1)[t].item() for s, t in zip(out.scores, tokens, strict=True)
    ]
    return tokens, logprobs
