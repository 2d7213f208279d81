"""Llama 4 (Scout / Maverick), text model (`Llama4ForCausalLM`): Llama's blocks with

- interleaved chunked attention: layers with `layer_types` "chunked_attention" see only their
  query's chunk of `attention_chunk_size` tokens; the no-rope layers (`no_rope_layers` 0) are
  global and skip the rotary;
- attention temperature tuning on the no-rope layers (`attn_temperature_tuning`): queries scaled
  by 1 + attn_scale * log1p(floor((p + 1) / floor_scale));
- `use_qk_norm`: a weightless L2 (RMS) norm of q and k after the rotary, on the rope layers;
- rotary in the interleaved (complex-pair) layout, llama3 scaling when `rope_scaling` is set;
- a sparse MoE block on `moe_layers` (every `interleave_moe_layer_step`-th): a top-k sigmoid
  router whose weight scales each expert's input, plus an always-on shared expert of the
  experts' size; the other layers run a dense MLP of `intermediate_size_mlp`.

Checkpoint names: `feed_forward` -> `mlp`, `feed_forward.router` -> `mlp.gate`,
`feed_forward.shared_expert` -> `mlp.shared_experts`; the experts are stacked [in, out] tensors
(`experts.gate_up_proj` [E, hidden, 2 * I], `experts.down_proj` [E, I, hidden]), so a
`--quantize` method is refused on them as on DBRX's stacked experts.

`Llama4ForConditionalGeneration` adds the vision side: each image tile (336 px in the released
models) through transformers' own `Llama4VisionModel` (an unfold patch embedding, a class token,
learned positions, a ViT with 2D rotary over the patch grid, then the pixel shuffle and its
two-layer GELU MLP: one vector per 2 x 2 patches), then `multi_modal_projector.linear_1` to the
text width; the vectors replace the tile's run of <|patch|> tokens. The tower runs once per tile
in plain torch, so its module is taken as transformers maintains it rather than rewritten.
Checkpoint names: `language_model.model.*` / `language_model.lm_head`, `vision_model.*`,
`multi_modal_projector.*`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from pytgi.errors import ModelLoadError
from pytgi.layers.embedding import ParallelLMHead
from pytgi.layers.moe.config import SIGMOID_TOPK, MoEConfig
from pytgi.layers.moe.experts import DOWN_STACKED, GATE_UP_STACKED
from pytgi.layers.quantization.base import QuantConfig
from pytgi.messages.request import MultimodalInput
from pytgi.models.config import OUTSIDE, DecoderSpec, decoder_spec_from_hf, require
from pytgi.models.decoder import LLAMA_PACKED_MODULES, DecoderForCausalLM, DecoderModel
from pytgi.models.multimodal import MultimodalLM

CHUNKED = "chunked_attention"


def llama4_text_spec(hf_config, architecture: str, flags: dict) -> DecoderSpec:
    """The decoder spec of a `Llama4TextConfig`."""
    spec = decoder_spec_from_hf(hf_config, architecture, flags)
    num_layers = spec.num_layers
    chunk = getattr(hf_config, "attention_chunk_size", None)
    layer_types = getattr(hf_config, "layer_types", None) or ["full_attention"] * num_layers
    no_rope = getattr(hf_config, "no_rope_layers", None) or [1] * num_layers
    moe_layers = set(require(hf_config, "moe_layers"))
    moe = MoEConfig(
        num_experts=require(hf_config, "num_local_experts"),
        top_k=require(hf_config, "num_experts_per_tok"),
        intermediate_size=spec.intermediate_size,
        hidden_act=spec.hidden_act,
        router=SIGMOID_TOPK,
        renormalize=False,
        scale_input=True,
        shared_intermediate_size=spec.intermediate_size,
        sparse_layers=tuple(i in moe_layers for i in range(num_layers)),
        per_expert_checkpoint=False,
    )
    temperature = None
    if getattr(hf_config, "attn_temperature_tuning", False):
        temperature = (float(hf_config.floor_scale), float(hf_config.attn_scale))
    rope = spec.rope_scaling
    if rope is not None:  # transformers applies llama3 scaling to any rope_scaling Llama 4 has
        rope = {**rope, "rope_type": "llama3"}
    if len(layer_types) != num_layers or len(no_rope) != num_layers:
        raise ModelLoadError("layer_types and no_rope_layers need one entry per layer")
    return dataclasses.replace(
        spec,
        intermediate_size=require(hf_config, "intermediate_size_mlp"),
        rotary_interleaved=True,
        rope_scaling=rope,
        sliding_windows=(),
        attention_chunk_sizes=tuple(chunk if t == CHUNKED else None for t in layer_types),
        nope_layers=tuple(not bool(r) for r in no_rope),
        qk_l2_norm=bool(getattr(hf_config, "use_qk_norm", False)),
        attn_temperature=temperature,
        moe=moe,
    )


class Llama4ForCausalLM(DecoderForCausalLM):
    weight_renames = (
        (r"\.feed_forward\.router\.", ".mlp.gate."),
        (r"\.feed_forward\.shared_expert\.", ".mlp.shared_experts."),
        (r"\.feed_forward\.", ".mlp."),
    )

    @classmethod
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict) -> DecoderSpec:
        return llama4_text_spec(hf_config, architecture, flags)

    def expert_weight_mapping(self):
        # ".mlp.experts." never matches the shared expert's ".mlp.shared_experts."
        return [
            (".mlp.experts.w13_weight", ".mlp.experts.gate_up_proj", None, GATE_UP_STACKED),
            (".mlp.experts.w2_weight", ".mlp.experts.down_proj", None, DOWN_STACKED),
        ]


@dataclass(frozen=True, kw_only=True)
class Llama4VisionSpec(DecoderSpec):
    vision: dict = field(metadata=OUTSIDE)


class Llama4ForConditionalGeneration(MultimodalLM):
    packed_modules_mapping = LLAMA_PACKED_MODULES
    weight_renames = (
        (r"^language_model\.model\.", "model."),
        (r"^language_model\.lm_head\.", "lm_head."),
        (r"^model\.language_model\.", "model."),
        (r"^model\.(vision_model|multi_modal_projector)\.", r"\1."),
        *Llama4ForCausalLM.weight_renames,
    )

    @classmethod
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict) -> Llama4VisionSpec:
        base = llama4_text_spec(hf_config.text_config, architecture, flags)
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        return Llama4VisionSpec(**fields, vision=hf_config.vision_config.to_dict())

    def __init__(self, spec: Llama4VisionSpec, quant_config: QuantConfig | None = None):
        super().__init__()
        if quant_config is not None:
            raise ModelLoadError(f"{spec.architecture} does not run quantized weights yet")
        from transformers import Llama4VisionConfig
        from transformers.models.llama4.modeling_llama4 import Llama4VisionModel

        self.spec = spec
        self.model = DecoderModel(spec, quant_config)
        vision = Llama4VisionConfig(**spec.vision)
        vision._attn_implementation = "eager"  # its own non-causal attention over a tile
        self.vision_model = Llama4VisionModel(vision)
        self.multi_modal_projector = nn.Module()
        self.multi_modal_projector.linear_1 = nn.Linear(
            vision.vision_output_dim, spec.hidden_size, bias=False
        )
        self.lm_head = ParallelLMHead(spec.vocab_size, spec.hidden_size)
        if spec.tie_word_embeddings:
            self.lm_head.tie(self.model.embed_tokens)

    def expert_weight_mapping(self):
        # the tower's tensors load under their own names: this pass-through row is matched
        # before the language model's packed names, which the tower's q_proj would otherwise hit
        return [
            *Llama4ForCausalLM.expert_weight_mapping(self),
            ("vision_model.", "vision_model.", None, None),
        ]

    def encode_images(self, images: Sequence[MultimodalInput]) -> list[torch.Tensor]:
        """Each run is one tile [1, C, S, S]: all of the step's tiles in one tower call."""
        device = self.lm_head.weight.device
        dtype = self.multi_modal_projector.linear_1.weight.dtype
        tiles = torch.cat([torch.from_numpy(i.features["pixel_values"]) for i in images])
        features = self.vision_model(tiles.to(device, dtype)).last_hidden_state  # [n, seq, dv]
        return list(self.multi_modal_projector.linear_1(features).unbind(0))  # [seq, hidden]

    def forward(self, input_ids, positions, inputs_embeds=None) -> torch.Tensor:
        m = self.model
        hidden = m.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        cos, sin = m.rotary(positions, hidden.dtype)
        hidden, residual = m.layers(hidden, cos, sin)
        return m.norm(hidden, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        return self.lm_head.compute_logits(hidden)
