"""Vocabulary-parallel token embedding and LM head.

The vocabulary is split into equal contiguous ranges, one per rank (the last range padded with zero
rows). The embedding looks up local ids, zeroes the others and all-reduces; the LM head computes
local logits and gathers them to rank 0, which is the only rank that samples.

On CPU in fp32 the LM head re-lays its [V, D] matrix after loading as column blocks [C, D, n]
(zero-padded): n = 16 tiles for the compiled `linear_packed` kernel, else n = VOCAB_BLOCK and one
batched matmul over the blocks, which streams the matrix faster than `F.linear` on the row-major
matrix at 1-16 rows, what decode asks of it (docs/PERFORMANCE.md, "Kernel choices").
The row-major copy is then freed; a tied embedding looks its rows up in the blocks instead, so the
matrix is held once.

A quantized head (the QuantConfig's `get_lm_head_method`, see layers/quantization/packed.py) packs
this rank's vocabulary rows in its kernel layout as they load, never in fp32; a tied embedding
then dequantises the rows it looks up. An untied embedding can be quantized the same way
(`get_embedding_method`: a GGUF file's quantized token_embd), looking its rows up in its own
packed weight.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from pytgi.distributed.comm import tp_all_reduce, tp_gather_to_first_rank
from pytgi.errors import ModelLoadError
from pytgi.layers.build_context import current_build_context
from pytgi.layers.quantization.base import QuantConfig, set_weight_attrs
from pytgi.layers.quantization.unquantized import TILE, pack_column_tiles, packed_matmul
from pytgi.utils.math import cdiv

VOCAB_BLOCK = 4096  # columns per block of the head without the kernels (best of 1024-8192)


class VocabParallelEmbedding(nn.Module):
    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        params_dtype=None,
        quant_config: QuantConfig | None = None,
    ):
        super().__init__()
        self.tp = current_build_context().tp
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        per_rank = cdiv(num_embeddings, self.tp.world_size)
        self.num_local = per_rank  # rows of this rank's (padded) part
        self.vocab_start = min(self.tp.rank * per_rank, num_embeddings)
        self.vocab_end = min(self.vocab_start + per_rank, num_embeddings)
        self.kernels = current_build_context().kernels
        dtype = params_dtype or torch.get_default_dtype()
        self.weight = nn.Parameter(
            torch.empty(per_rank, embedding_dim, dtype=dtype), requires_grad=False
        )
        set_weight_attrs(self.weight, weight_loader=self.weight_loader)
        self.blocks: torch.Tensor | None = None  # [C, D, width] once packed (CPU head)
        # tied to a quantized head: local ids [T] -> dequantised rows [T, D] (a function, not the
        # module, which would make the module tree cyclic)
        self.row_lookup: Callable[[torch.Tensor], torch.Tensor] | None = None
        # a quantized embedding (not tied): its rows packed in a quantized layout as they load
        quant_ops = current_build_context().quant() if quant_config else None
        self.row_method = quant_config.get_embedding_method(quant_ops) if quant_config else None
        if self.row_method is not None:
            self._quantized_weight(self.row_method, dtype)

    def _quantized_weight(self, method, dtype: torch.dtype) -> None:
        """Replace the dense weight by `method`'s packed one (this rank's real rows only)."""
        del self.weight
        num_rows = self.vocab_end - self.vocab_start
        method.create_weights(self, self.embedding_dim, [num_rows], dtype, self._load_rows)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        expected = (self.num_embeddings, self.embedding_dim)[: param.dim()]  # weight or bias
        if tuple(loaded.shape) != expected:
            raise ModelLoadError(
                f"checkpoint shape {tuple(loaded.shape)} does not match the expected {expected}"
            )
        num_local = self.vocab_end - self.vocab_start
        param.data[:num_local].copy_(loaded[self.vocab_start : self.vocab_end])
        param.data[num_local:].zero_()

    def _load_rows(self, param, loaded, shard_id=None) -> None:
        """The quantized weight's loader: this rank's vocabulary rows of `loaded` (a tensor or a
        QuantizedWeight) into the method's row collector."""
        expected = (self.num_embeddings, self.embedding_dim)
        if tuple(loaded.shape) != expected:
            raise ModelLoadError(
                f"checkpoint shape {tuple(loaded.shape)} does not match the expected {expected}"
            )
        num_rows = self.vocab_end - self.vocab_start
        param.data.narrow(0, 0, num_rows).copy_(loaded.narrow(0, self.vocab_start, num_rows))

    def process_weights_after_loading(self) -> None:
        if self.row_method is not None:
            self.row_method.process_weights_after_loading(self)

    def _rows(self, local_ids: torch.Tensor) -> torch.Tensor:
        """local_ids [T] -> [T, D] from the row-major weight or, once packed, the blocks."""
        if self.row_lookup is not None:
            return self.row_lookup(local_ids)
        if self.row_method is not None:
            return self.row_method.rows(self, local_ids)
        if self.blocks is None:
            return F.embedding(local_ids, self.weight)
        block = self.blocks.shape[-1]
        return self.blocks.transpose(1, 2)[local_ids // block, local_ids % block]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.world_size == 1:
            return self._rows(input_ids)  # [T, D]
        is_local = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)  # [T]
        local_ids = (input_ids - self.vocab_start) * is_local  # [T]
        y = self._rows(local_ids).masked_fill_(~is_local.unsqueeze(1), 0.0)
        return tp_all_reduce(y)  # [T, D]


class ParallelLMHead(VocabParallelEmbedding):
    """Projects hidden states to vocabulary logits (plus a bias when the checkpoint has one: Phi,
    GPT-J); may share its weight with the embedding."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        params_dtype=None,
        quant_config: QuantConfig | None = None,
        bias: bool = False,
    ):
        super().__init__(num_embeddings, embedding_dim, params_dtype)
        self.tied_embedding: VocabParallelEmbedding | None = None
        dtype = params_dtype or torch.get_default_dtype()
        self.bias = None  # [num_local], this rank's vocabulary range (zero past the vocabulary)
        self.bias_packed = None  # [C * width] once the weight is packed
        if bias:
            self.bias = nn.Parameter(torch.empty(self.num_local, dtype=dtype), requires_grad=False)
            set_weight_attrs(self.bias, weight_loader=self.weight_loader)
        quant_ops = current_build_context().quant() if quant_config else None
        self.head_method = quant_config.get_lm_head_method(quant_ops) if quant_config else None
        if self.head_method is not None:  # this rank's real rows, packed as they load
            self._quantized_weight(self.head_method, dtype)

    def tie(self, embedding: VocabParallelEmbedding) -> None:
        """Share the embedding's matrix (tie_word_embeddings). Quantized: the checkpoint's
        embedding loads into the head, and the embedding looks its rows up there."""
        self.tied_embedding = embedding
        if self.head_method is not None:
            embedding.weight = self.weight
            embedding.row_lookup = self.quantized_rows
            return
        self.weight = embedding.weight

    def quantized_rows(self, local_ids: torch.Tensor) -> torch.Tensor:
        """local_ids [T] -> [T, D], dequantised from the packed head."""
        return self.head_method.rows(self, local_ids)

    def process_weights_after_loading(self) -> None:
        if self.head_method is not None:
            self.head_method.process_weights_after_loading(self)
            return
        weight = self.weight
        if weight.device.type != "cpu" or weight.dtype != torch.float32:
            return
        width = TILE if self.kernels is not None else VOCAB_BLOCK
        self.blocks = pack_column_tiles(weight.data, width)
        if self.bias is not None:
            padding = self.blocks.shape[0] * width - self.num_local
            self.bias_packed = torch.cat([self.bias.data, self.bias.new_zeros(padding)])
        if self.tied_embedding is not None:
            self.tied_embedding.blocks = self.blocks
        weight.data = weight.data.new_empty(0, self.embedding_dim)  # the blocks hold it now

    def _local_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, D] -> this rank's logits [N, num_local]."""
        if self.head_method is not None:
            logits = self.head_method.apply(self, hidden)  # [N, real rows of this rank]
            if self.bias is not None:
                logits = logits + self.bias[: logits.shape[1]]
            padding = self.num_local - logits.shape[1]  # F.pad copies even when it pads nothing
            return F.pad(logits, (0, padding)) if padding else logits
        if self.blocks is None:
            return F.linear(hidden, self.weight, self.bias)
        logits = packed_matmul(hidden, self.blocks, self.bias_packed, self.kernels)
        return logits[:, : self.num_local]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """hidden [N, D] -> logits [N, V] on rank 0, None on the other ranks."""
        local = self._local_logits(hidden)  # [N, V_local]
        logits = local if self.tp.world_size == 1 else tp_gather_to_first_rank(local)  # [N, V_pad]
        if logits is None:
            return None
        return logits[:, : self.num_embeddings]  # drops the padding rows of the last rank
