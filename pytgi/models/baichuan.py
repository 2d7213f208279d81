"""Baichuan and Baichuan 2 (`BaiChuanForCausalLM`, `BaichuanForCausalLM`): Llama's blocks with
q/k/v stored as one tensor. transformers has no class for them (the hub ships remote code, which
pytgi does not run); their checkpoint layout is:

- config.json: model_type "baichuan", Llama's field names (hidden_size, intermediate_size,
  num_attention_heads, num_hidden_layers, rms_norm_eps, vocab_size, hidden_act "silu"), the
  context length as max_position_embeddings (7B) or model_max_length (13B); no KV-head count
  (every head has its own K/V) and untied embeddings;
- tensors: Llama's names (model.embed_tokens, model.layers.{i}.{input_layernorm,
  post_attention_layernorm}, .self_attn.o_proj, .mlp.{gate,up,down}_proj, model.norm, lm_head)
  except `model.layers.{i}.self_attn.W_pack.weight` [3 * hidden, hidden] = [q | k | v];
- positions: rotary (base 10000) in Baichuan-7B (`BaiChuanForCausalLM`) and Baichuan2-7B, ALiBi
  without scaling in the 13B models, which have hidden_size 5120: `BaichuanForCausalLM` is rotary
  exactly when hidden_size == 4096 (vLLM's and TGI's rule);
- Baichuan 2 (vocabulary 125696) has a NormHead: its LM head's rows are L2-normalised before use,
  done here once when the weight is loaded.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from pytgi.layers.embedding import ParallelLMHead
from pytgi.models.config import ALIBI, DecoderSpec, decoder_spec_from_hf
from pytgi.models.decoder import DecoderForCausalLM

BAICHUAN2_VOCAB_SIZE = 125696
ROTARY_HIDDEN_SIZE = 4096  # BaichuanForCausalLM: 7B is rotary, 13B (5120) ALiBi


class NormHead(ParallelLMHead):
    """Baichuan 2's LM head: each vocabulary row divided by its L2 norm at load time (before a
    quantized head packs it)."""

    def weight_loader(self, param, loaded: torch.Tensor, shard_id=None) -> None:
        super().weight_loader(param, F.normalize(loaded.float(), dim=-1).to(loaded.dtype))

    def _load_rows(self, param, loaded: torch.Tensor, shard_id=None) -> None:
        super()._load_rows(param, F.normalize(loaded.float(), dim=-1).to(loaded.dtype))


class BaichuanForCausalLM(DecoderForCausalLM):
    packed_modules_mapping = {
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }
    weight_renames = ((r"\.self_attn\.W_pack\.", ".self_attn.qkv_proj."),)

    @staticmethod
    def lm_head_class(spec: DecoderSpec) -> type[ParallelLMHead]:
        return NormHead if spec.vocab_size == BAICHUAN2_VOCAB_SIZE else ParallelLMHead

    @classmethod
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict) -> DecoderSpec:
        if getattr(hf_config, "max_position_embeddings", None) is None:  # the 13B models
            hf_config.max_position_embeddings = getattr(hf_config, "model_max_length", None)
        spec = decoder_spec_from_hf(hf_config, architecture, flags)
        spec = dataclasses.replace(spec, tie_word_embeddings=False)
        rotary = architecture == "BaiChuanForCausalLM" or spec.hidden_size == ROTARY_HIDDEN_SIZE
        return spec if rotary else dataclasses.replace(spec, position_encoding=ALIBI)
