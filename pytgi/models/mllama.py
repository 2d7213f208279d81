"""Mllama (Llama 3.2 Vision): a Llama language model with gated cross-attention layers
(`cross_attention_layers`) that attend to the images' states, instead of image embeddings merged
into the prompt. Each image is one <|image|> token in the prompt; the processor tiles it into up
to `max_num_tiles` tiles (`aspect_ratio_ids` names the tiling, `aspect_ratio_mask` the real
tiles). The tower runs a local transformer (gated positional and tile-position embeddings, each
tile's patches padded to a multiple of 8) and a gated global transformer over all the image's
tiles, padding tiles included (transformers masks only pairs of two padding positions); its
output concatenates the last layer with `intermediate_layers_indices`' layers (those
interleaved channel by channel), projected to the language model's width:
[tiles x (patches + 1), hidden] per image.

Cross-attention, as transformers computes it (`cross_attention_mask`): a text token sees the
image whose <|image|> token starts its span (a span runs to the next <|image|>, consecutive
images share the span after the last of them, the last span covers the rest of the prompt and
every generated token), the image's real tiles only. A row before the first image sees no image
(`full_text_row_masked_out_mask`): its attention is unmasked over all the request's image tokens
(padding tiles included) and its cross-attention MLP is zeroed. A step without images skips the
cross-attention layers; rows of text-only requests pass them unchanged (both as transformers).

The per-request keys and values of the cross-attention layers (`CrossAttentionState`) are
computed by the worker (worker/cross_attention.py) and reach the layers in a `CrossAttentionBatch`.

Checkpoint names: `language_model.model.*` / `language_model.lm_head` (or `model.language_model.*`
and `lm_head`), `vision_model.*`, `multi_modal_projector.*` (or under `model.`). The token table
has vocab_size + 8 rows (the image token among them), the LM head vocab_size.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from pytgi.errors import ModelLoadError
from pytgi.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from pytgi.layers.norm import RMSNorm
from pytgi.layers.quantization.base import QuantConfig
from pytgi.messages.request import MultimodalInput
from pytgi.models.blocks import DecoderLayer, GatedMLP
from pytgi.models.config import OUTSIDE, DecoderSpec, decoder_spec_from_hf
from pytgi.models.decoder import LLAMA_PACKED_MODULES, DecoderModel
from pytgi.models.multimodal import MultimodalLM
from pytgi.models.qwen2_vl import VISION_ACTS

EXTRA_TOKEN_ROWS = 8  # the token table's rows past vocab_size (<|image|> is one of them)
ROW_CHUNK = 256  # text rows per cross-attention score block


@dataclass(frozen=True, kw_only=True)
class MllamaSpec(DecoderSpec):
    vision: dict = field(metadata=OUTSIDE)
    cross_attention_layers: tuple[int, ...] = field(metadata=OUTSIDE)


# ---- the vision tower ---------------------------------------------------------------------------


class MllamaVisionAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        # checkpoint: q_proj / k_proj / v_proj, renamed (the language model packs those names)
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x [B, N, dim], mask [B, 1, N, N] additive -> [B, N, dim]."""
        b, n, _ = x.shape

        def heads(t):
            return t.view(b, n, self.num_heads, -1).transpose(1, 2)  # [B, H, N, D]

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + mask
        out = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class MllamaVisionLayer(nn.Module):
    """Pre-norm ViT layer; the global transformer's layers scale both branches by tanh(gate)."""

    def __init__(self, vision: dict, gated: bool):
        super().__init__()
        dim, eps = vision["hidden_size"], vision["norm_eps"]
        self.self_attn = MllamaVisionAttention(dim, vision["attention_heads"])
        self.mlp = nn.Module()
        self.mlp.fc1 = nn.Linear(dim, vision["intermediate_size"])
        self.mlp.fc2 = nn.Linear(vision["intermediate_size"], dim)
        self.act = VISION_ACTS[vision["hidden_act"]]
        self.input_layernorm = nn.LayerNorm(dim, eps=eps)
        self.post_attention_layernorm = nn.LayerNorm(dim, eps=eps)
        self.gated = gated
        if gated:
            self.gate_attn = nn.Parameter(torch.zeros(1))
            self.gate_ffn = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.self_attn(self.input_layernorm(x), mask)
        x = x + (self.gate_attn.tanh() * h if self.gated else h)
        h = self.mlp.fc2(self.act(self.mlp.fc1(self.post_attention_layernorm(x))))
        return x + (self.gate_ffn.tanh() * h if self.gated else h)


class MllamaVisionEncoder(nn.Module):
    def __init__(self, vision: dict, num_layers: int, gated: bool):
        super().__init__()
        self.layers = nn.ModuleList(MllamaVisionLayer(vision, gated) for _ in range(num_layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
        """Every layer's output."""
        outs = []
        for layer in self.layers:
            x = layer(x, mask)
            outs.append(x)
        return outs


class TileEmbedding(nn.Module):
    """Per aspect ratio, a learned vector per tile (pre/post tile positional embedding), gated."""

    def __init__(self, vision: dict):
        super().__init__()
        self.tiles, self.dim = vision["max_num_tiles"], vision["hidden_size"]
        self.embedding = nn.Embedding(vision["max_aspect_ratio_id"] + 1, self.tiles * self.dim)
        self.gate = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor, aspect_ratio_ids: torch.Tensor) -> torch.Tensor:
        """x [I, tiles, N, dim], aspect_ratio_ids [I]."""
        emb = self.embedding(aspect_ratio_ids).view(-1, self.tiles, 1, self.dim)
        return x + emb * self.gate.tanh()


class GatedPositionalEmbedding(nn.Module):
    """(1 - tanh(gate)) x patch positions + tanh(gate) x the aspect ratio's tile positions."""

    def __init__(self, vision: dict, num_patches: int):
        super().__init__()
        self.tiles, self.dim, self.num_patches = (
            vision["max_num_tiles"],
            vision["hidden_size"],
            num_patches,
        )
        self.gate = nn.Parameter(torch.zeros(1))
        self.embedding = nn.Parameter(torch.zeros(num_patches, self.dim))
        rows = vision["max_aspect_ratio_id"] + 1
        self.tile_embedding = nn.Embedding(rows, self.tiles * num_patches * self.dim)

    def forward(self, x: torch.Tensor, aspect_ratio_ids: torch.Tensor) -> torch.Tensor:
        """x [I, tiles, patches + 1, dim]."""
        gate = self.gate.tanh()
        x = x + (1 - gate) * self.embedding
        tiles = self.tile_embedding(aspect_ratio_ids)
        return x + gate * tiles.view(-1, self.tiles, self.num_patches, self.dim)


class MllamaVisionModel(nn.Module):
    def __init__(self, vision: dict):
        super().__init__()
        dim, patch = vision["hidden_size"], vision["patch_size"]
        self.num_patches = (vision["image_size"] // patch) ** 2 + 1  # with the CLS token
        self.intermediate = tuple(vision["intermediate_layers_indices"])
        self.patch_embedding = nn.Conv2d(
            vision["num_channels"], dim, kernel_size=patch, stride=patch, bias=False
        )
        self.class_embedding = nn.Parameter(torch.zeros(dim))
        self.gated_positional_embedding = GatedPositionalEmbedding(vision, self.num_patches)
        self.pre_tile_positional_embedding = TileEmbedding(vision)
        self.post_tile_positional_embedding = TileEmbedding(vision)
        self.layernorm_pre = nn.LayerNorm(dim)
        self.layernorm_post = nn.LayerNorm(dim)
        self.transformer = MllamaVisionEncoder(vision, vision["num_hidden_layers"], gated=False)
        self.global_transformer = MllamaVisionEncoder(vision, vision["num_global_layers"], True)

    def forward(
        self, pixels: torch.Tensor, aspect_ratio_ids: torch.Tensor, tile_mask: torch.Tensor
    ) -> torch.Tensor:
        """pixels [I, tiles, C, S, S], aspect_ratio_ids [I], tile_mask [I, tiles] (1: a real
        tile) -> [I, tiles, patches + 1, dim x (1 + len(intermediate))]."""
        images, tiles = pixels.shape[:2]
        x = self.patch_embedding(pixels.flatten(0, 1).to(self.patch_embedding.weight.dtype))
        x = x.flatten(2).transpose(1, 2)  # [I * tiles, patches, dim]
        dim = x.shape[-1]
        x = self.pre_tile_positional_embedding(x.view(images, tiles, -1, dim), aspect_ratio_ids)
        cls = self.class_embedding.expand(images * tiles, 1, dim)
        x = torch.cat([cls, x.flatten(0, 1)], dim=1).view(images, tiles, self.num_patches, dim)
        x = self.layernorm_pre(self.gated_positional_embedding(x, aspect_ratio_ids))
        pad = (8 - self.num_patches % 8) % 8  # patches padded to a multiple of 8
        x = F.pad(x, (0, 0, 0, pad))
        length = self.num_patches + pad
        mask = self._mask(tile_mask, length, x.dtype)
        local = self.transformer(x.view(images, tiles * length, dim), mask)
        x = self.layernorm_post(local[-1]).view(images, tiles, length, dim)
        x = self.post_tile_positional_embedding(x, aspect_ratio_ids)
        x = self.global_transformer(x.view(images, tiles * length, dim), mask)[-1]
        # the intermediate layers interleaved channel by channel (stacked on a last axis)
        middle = torch.stack([local[i] for i in self.intermediate], dim=-1).flatten(-2)
        out = torch.cat([t.view(images, tiles, length, -1) for t in (x, middle)], dim=-1)
        return out[:, :, : self.num_patches]

    def _mask(self, tile_mask: torch.Tensor, length: int, dtype: torch.dtype) -> torch.Tensor:
        """[I, 1, tiles x length, tiles x length] additive, as transformers builds it (min x the
        outer product of the padding indicator): only a padding query with a padding key (padding
        tiles, padding patches) is masked; real positions attend to padding too."""
        images, tiles = tile_mask.shape
        real = tile_mask.to(dtype).view(images, tiles, 1).repeat(1, 1, length)
        real[:, :, self.num_patches :] = 0
        pad = (1 - real).reshape(images, tiles * length, 1)
        return (pad @ pad.transpose(-1, -2) * torch.finfo(dtype).min).unsqueeze(1)


# ---- cross-attention ----------------------------------------------------------------------------


@dataclass
class CrossAttentionState:
    """A request's cross-attention keys and values, per cross-attention layer (in layer order):
    k, v [KVH, N, D] over its images' tokens (image by image, every tile, padding ones too)."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for pair in self.kv for t in pair)


@dataclass
class CrossAttentionRows:
    """One request's rows of the step: flat rows [start, start + n); `bias` [n, N] additive
    (0 for the image tokens the row sees, -inf otherwise; all 0 for a row that sees no image),
    `mlp_rows` [m] int64: the rows (0..n-1) that see an image (the others' MLP is zeroed)."""

    start: int
    state: CrossAttentionState
    bias: torch.Tensor
    mlp_rows: torch.Tensor


@dataclass
class CrossAttentionBatch:
    """The step's rows that pass the cross-attention layers (requests with images); other rows
    pass them unchanged."""

    requests: list[CrossAttentionRows]


class MllamaCrossAttention(nn.Module):
    def __init__(self, spec: DecoderSpec):
        super().__init__()
        h, kvh, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = h, kvh, d
        # checkpoint: q_proj / k_proj / v_proj, renamed (q reads text, k / v read image states)
        self.q = nn.Linear(spec.hidden_size, h * d, bias=False)
        self.k = nn.Linear(spec.hidden_size, kvh * d, bias=False)
        self.v = nn.Linear(spec.hidden_size, kvh * d, bias=False)
        self.o_proj = nn.Linear(h * d, spec.hidden_size, bias=False)
        self.q_norm = RMSNorm(d, spec.norm_eps)
        self.k_norm = RMSNorm(d, spec.norm_eps)

    def kv(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Image states [N, hidden] -> k, v [KVH, N, D] (k normed; no rotary)."""
        n = states.shape[0]
        k = self.k_norm(self.k(states).view(n, self.num_kv_heads, self.head_dim))
        v = self.v(states).view(n, self.num_kv_heads, self.head_dim)
        return k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor):
        """x [n, hidden] (one request's rows), k / v [KVH, N, D], bias [n, N] -> [n, hidden].
        Eager softmax in fp32 as transformers' eager path; rows in chunks of ROW_CHUNK so the
        scores [H, rows, N] stay bounded; query heads grouped on their KV head (head h reads
        KV head h // groups) instead of repeating k / v."""
        n, kvh, d = x.shape[0], self.num_kv_heads, self.head_dim
        groups = self.num_heads // kvh
        q = self.q_norm(self.q(x).view(n, self.num_heads, d))  # [n, H, D]
        out = torch.empty_like(q)
        for lo in range(0, n, ROW_CHUNK):
            hi = min(n, lo + ROW_CHUNK)
            qc = q[lo:hi].permute(1, 0, 2).reshape(kvh, groups * (hi - lo), d)  # [KVH, G*r, D]
            scores = (qc @ k.transpose(-1, -2) * d**-0.5).view(kvh, groups, hi - lo, -1)
            probs = torch.softmax(scores + bias[lo:hi], dim=-1, dtype=torch.float32)
            o = probs.to(q.dtype).view(kvh, groups * (hi - lo), -1) @ v  # [KVH, G*r, D]
            out[lo:hi] = o.view(self.num_heads, hi - lo, d).transpose(0, 1)
        return self.o_proj(out.flatten(1))


class MllamaCrossAttentionLayer(nn.Module):
    """stream += tanh(attn_gate) x cross_attn(norm(stream)); then stream += tanh(mlp_gate) x
    mlp(norm(stream)) on the rows that see an image."""

    def __init__(self, spec: DecoderSpec, index: int, quant_config: QuantConfig | None, prefix):
        super().__init__()
        self.index = index  # among the cross-attention layers
        self.cross_attn = MllamaCrossAttention(spec)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.mlp = GatedMLP(spec, quant_config, f"{prefix}.mlp")
        self.cross_attn_attn_gate = nn.Parameter(torch.zeros(1))
        self.cross_attn_mlp_gate = nn.Parameter(torch.zeros(1))

    def forward(self, hidden, residual, batch: CrossAttentionBatch):
        """(hidden, residual) [T, hidden] -> the same; only `batch`'s rows change."""
        stream = hidden.clone() if residual is None else hidden + residual
        attn_gate, mlp_gate = self.cross_attn_attn_gate.tanh(), self.cross_attn_mlp_gate.tanh()
        for rows in batch.requests:
            span = slice(rows.start, rows.start + rows.bias.shape[0])
            k, v = rows.state.kv[self.index]
            x = stream[span]
            x = x + attn_gate * self.cross_attn(self.input_layernorm(x), k, v, rows.bias)
            if rows.mlp_rows.numel():
                y = x[rows.mlp_rows]
                y = y + mlp_gate * self.mlp(self.post_attention_layernorm(y))
                x = x.index_copy(0, rows.mlp_rows, y)
            stream[span] = x
        return stream, None


class MllamaTextStack(nn.ModuleList):
    """Self-attention decoder layers (the shared blocks, paged KV) interleaved with the
    cross-attention layers at `cross_attention_layers`, parameter names `layers.{i}`."""

    def __init__(self, spec: MllamaSpec, quant_config: QuantConfig | None, prefix: str):
        cross = spec.cross_attention_layers
        super().__init__(
            MllamaCrossAttentionLayer(spec, cross.index(i), quant_config, f"{prefix}.{i}")
            if i in cross
            else DecoderLayer(spec, i, quant_config, f"{prefix}.{i}")
            for i in range(spec.num_layers)
        )

    def forward(self, hidden, cos, sin, cross: CrossAttentionBatch | None):
        residual = None
        for layer in self:
            if isinstance(layer, MllamaCrossAttentionLayer):
                if cross is not None and cross.requests:
                    hidden, residual = layer(hidden, residual, cross)
            else:
                hidden, residual = layer(hidden, residual, cos, sin)
        return hidden, residual


class MllamaForConditionalGeneration(MultimodalLM):
    uses_cross_attention = True
    packed_modules_mapping = LLAMA_PACKED_MODULES
    weight_renames = (
        (r"^language_model\.model\.", "model."),
        (r"^language_model\.lm_head\.", "lm_head."),
        (r"^model\.language_model\.", "model."),
        (r"^model\.(vision_model|multi_modal_projector)", r"\1"),
        (r"^(vision_model\..*\.self_attn)\.([qkv])_proj\.", r"\1.\2."),
        (r"(\.cross_attn)\.([qkv])_proj\.", r"\1.\2."),
    )

    @classmethod
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict) -> MllamaSpec:
        text = hf_config.text_config
        base = decoder_spec_from_hf(text, architecture, flags)
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        vision = hf_config.vision_config.to_dict()
        vision["max_aspect_ratio_id"] = hf_config.vision_config.max_aspect_ratio_id
        expected = vision["hidden_size"] * (1 + len(vision["intermediate_layers_indices"]))
        if vision["vision_output_dim"] != expected:
            raise ModelLoadError(
                f"vision_output_dim {vision['vision_output_dim']} is not hidden_size x (1 + "
                f"intermediate layers) = {expected}"
            )
        return MllamaSpec(
            **fields, vision=vision, cross_attention_layers=tuple(text.cross_attention_layers)
        )

    def __init__(self, spec: MllamaSpec, quant_config: QuantConfig | None = None):
        super().__init__()
        if quant_config is not None:
            raise ModelLoadError(f"{spec.architecture} does not run quantized weights yet")
        self.spec = spec
        self.model = DecoderModel(dataclasses.replace(spec, num_layers=0), quant_config)
        self.model.embed_tokens = VocabParallelEmbedding(
            spec.vocab_size + EXTRA_TOKEN_ROWS, spec.hidden_size
        )
        self.model.layers = MllamaTextStack(spec, quant_config, prefix="model.layers")
        self.vision_model = MllamaVisionModel(spec.vision)
        self.multi_modal_projector = nn.Linear(spec.vision["vision_output_dim"], spec.hidden_size)
        self.lm_head = ParallelLMHead(spec.vocab_size, spec.hidden_size)
        if spec.tie_word_embeddings:
            raise ModelLoadError("Mllama with tied word embeddings is not supported")

    @property
    def tokens_per_tile(self) -> int:
        return self.vision_model.num_patches

    def encode_images(self, images: Sequence[MultimodalInput]) -> list[torch.Tensor]:
        """Each image's states [tiles x (patches + 1), hidden], every tile (padding ones too),
        all images through the tower in one call."""
        device = self.lm_head.weight.device

        def stack(name):
            return torch.cat([torch.from_numpy(i.features[name]) for i in images]).to(device)

        pixels = stack("pixel_values")  # [I, tiles, C, S, S]
        states = self.vision_model(pixels, stack("aspect_ratio_ids"), stack("aspect_ratio_mask"))
        states = self.multi_modal_projector(states)  # [I, tiles, patches + 1, hidden]
        return list(states.flatten(1, 2).unbind(0))

    def cross_attention_state(self, states: torch.Tensor) -> CrossAttentionState:
        """A request's images' states [N, hidden] -> its keys and values per cross layer."""
        layers = [m for m in self.model.layers if isinstance(m, MllamaCrossAttentionLayer)]
        return CrossAttentionState([layer.cross_attn.kv(states) for layer in layers])

    def forward(self, input_ids, positions, inputs_embeds=None, cross_attention=None):
        m = self.model
        hidden = m.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        cos, sin = m.rotary(positions, hidden.dtype)
        hidden, residual = m.layers(hidden, cos, sin, cross_attention)
        return m.norm(hidden, residual)[0] if residual is not None else m.norm(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        return self.lm_head.compute_logits(hidden)


def image_spans(offsets: Sequence[int]) -> list[tuple[int, float]]:
    """Per image (its <|image|> token at `offsets[i]`, ascending), the token range [start, end)
    that sees it, as MllamaProcessor's `get_cross_attention_token_mask` builds it: to the next
    image, consecutive images sharing the span after the last of them, the last to the end
    (generated tokens included: transformers repeats the last prompt row)."""
    spans = [[a, b] for a, b in zip(offsets, [*offsets[1:], math.inf], strict=True)]
    last_end = math.inf
    for span in reversed(spans):
        if span[0] == span[1] - 1:
            span[1] = last_end
        last_end = span[1]
    return [(a, b) for a, b in spans]
