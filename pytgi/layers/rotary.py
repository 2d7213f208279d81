"""Rotary position embeddings and their scaling variants, in two layouts: rotate-half (neox:
feature i pairs with i + rotary_dim / 2) and interleaved (GPT-J, Cohere: feature 2i pairs with
2i + 1).

`get_rope(...)` builds one `RotaryEmbedding` per model, with its cos/sin table for every position
the model serves (built when the model is built; the runner extends it before a step that goes
further, e.g. past max_position_embeddings with dynamic NTK). Its forward maps the step's
positions to (cos, sin) once per step; every attention layer then rotates q and k with its
`ApplyRotary`. The inverse frequencies of each variant (`ROPE_SCALINGS`: default, linear,
dynamic, yarn, llama3, longrope) follow the published formulas and are checked against
transformers' `ROPE_INIT_FUNCTIONS`; `freq_factors` divides the default frequencies by the
per-pair factors a GGUF file carries as its `rope_freqs` tensor, as llama.cpp does.

Dynamic NTK in a paged server: a token's rotation depends only on its own position p, using the
frequencies transformers would use for a sequence of length max(p + 1, max_position_embeddings).
Within max_position_embeddings this is exactly plain RoPE (transformers agrees), and beyond it it is
what transformers' generate() does token by token with a KV cache. It never depends on the batch,
the chunking or the other requests, so cached K/V (and prefix-cache hits) stay valid. It differs
from transformers only for a single prefill longer than max_position_embeddings, which transformers
rotates with the frequencies of the whole prompt's length.

LongRoPE (Phi-3's "su"/"longrope") the same way: position p < original_max_position_embeddings
uses the short factors, later positions the long ones, for the same reasons (batch- and
chunking-independent, cached K/V stay valid). transformers differs for every sequence longer than
the original length: its Phi-3 drops the KV cache when a sequence crosses it and recomputes the
whole sequence with the long factors; TGI and vLLM pick the factors per batch instead.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from pytgi.errors import ModelLoadError
from pytgi.layers.build_context import current_build_context
from pytgi.layers.custom_op import CustomOp


def default_inv_freq(dim: int, base: float) -> torch.Tensor:
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim  # [dim/2]
    return 1.0 / (base**exponents)


def _linear(dim, base, max_position, scaling):
    return default_inv_freq(dim, base) / scaling["factor"], 1.0


def _dynamic(dim, base, max_position, scaling, seq_len=None):
    """NTK-aware scaling for a sequence of `seq_len` tokens (an int, or a tensor [L] of lengths
    for one row of frequencies each: [L, dim/2])."""
    if seq_len is None:
        return default_inv_freq(dim, base), 1.0
    factor = scaling["factor"]
    lengths = torch.as_tensor(seq_len, dtype=torch.float64).clamp(min=max_position)
    bases = base * ((factor * lengths / max_position) - (factor - 1)) ** (dim / (dim - 2))
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).double() / dim  # [dim/2]
    return (1.0 / bases.unsqueeze(-1) ** exponents).float(), 1.0


def _llama3(dim, base, max_position, scaling):
    inv_freq = default_inv_freq(dim, base)
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    # long wavelengths are interpolated by `factor`, short ones kept, the band between blended
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_mid = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(is_mid, blended, scaled), 1.0


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn(dim, base, max_position, scaling):
    factor = scaling["factor"]
    original = scaling.get("original_max_position_embeddings") or max_position
    attn_factor = scaling.get("attention_factor")
    mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if attn_factor is None and mscale and mscale_all_dim:
        attn_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
    elif attn_factor is None:
        attn_factor = _yarn_mscale(factor)

    def correction_dim(num_rotations: float) -> float:
        return dim * math.log(original / (num_rotations * 2 * math.pi)) / (2 * math.log(base))

    low = correction_dim(scaling.get("beta_fast") or 32)
    high = correction_dim(scaling.get("beta_slow") or 1)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolated = default_inv_freq(dim, base)
    interpolated = extrapolated / factor
    keep = 1 - ramp  # 1 = high-frequency dims that keep their original frequency
    return interpolated * (1 - keep) + extrapolated * keep, float(attn_factor)


def _longrope(dim, base, max_position, scaling, long: bool = False):
    """Phi-3's LongRoPE: per-frequency factors (short below the original length, long beyond);
    the attention factor from max_position / original_max_position_embeddings."""
    original = scaling.get("original_max_position_embeddings")
    factor = max_position / original if original else scaling.get("factor", 1.0)
    original = original or max_position
    attn_factor = scaling.get("attention_factor")
    if attn_factor is None:
        attn_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    factors = torch.tensor(scaling["long_factor" if long else "short_factor"], dtype=torch.float32)
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim  # [dim/2]
    return 1.0 / (factors * base**exponents), float(attn_factor)


def _freq_factors(dim, base, max_position, scaling):
    """llama.cpp's `rope_freqs` tensor (GGUF files of Llama 3.1-3.3): each pair's frequency
    divided by its factor, at every position (llama.cpp's own arithmetic; the file's factors are
    the llama3 scaling its converter computed from the HF config)."""
    factors = torch.tensor(scaling["freq_factors"], dtype=torch.float32)  # [dim/2]
    if factors.shape != (dim // 2,):
        raise ModelLoadError(
            f"rope frequency factors: {factors.numel()} values for {dim // 2} rotary pairs"
        )
    return default_inv_freq(dim, base) / factors, 1.0


ROPE_SCALINGS = {
    "default": lambda dim, base, max_position, scaling: (default_inv_freq(dim, base), 1.0),
    "linear": _linear,
    "dynamic": _dynamic,
    "llama3": _llama3,
    "yarn": _yarn,
    "longrope": _longrope,
    "freq_factors": _freq_factors,  # pytgi's name: a GGUF file's rope_freqs tensor
}


class RotaryEmbedding(nn.Module):
    """positions -> (cos, sin) [T, 1, rotary_dim] for `ApplyRotary`, from a table of
    `num_positions` rows (the build context's max_model_len when longer than max_position)."""

    def __init__(
        self,
        rotary_dim: int,
        base: float,
        max_position: int,
        scaling: dict | None,
        num_positions: int | None = None,
        interleaved: bool = False,
    ):
        super().__init__()
        self.rotary_dim, self.base, self.max_position = rotary_dim, base, max_position
        self.interleaved = interleaved
        self.scaling = scaling or {"rope_type": "default"}
        self.rope_type = self.scaling.get("rope_type", "default")
        if self.rope_type not in ROPE_SCALINGS:
            raise ModelLoadError(
                f"unsupported rope_scaling type '{self.rope_type}' "
                f"(supported: {', '.join(sorted(ROPE_SCALINGS))})"
            )
        self._build_table(max(max_position, num_positions or 0))

    def _inv_freqs(self, length: int) -> tuple[torch.Tensor, float]:
        """Frequencies [dim/2] shared by all positions, or [length, dim/2] (dynamic, longrope)."""
        fn = ROPE_SCALINGS[self.rope_type]
        args = (self.rotary_dim, self.base, self.max_position, self.scaling)
        if self.rope_type == "longrope":
            original = self.scaling.get("original_max_position_embeddings") or self.max_position
            if length <= original:
                return fn(*args)
            (short, attn_factor), (long, _) = fn(*args), fn(*args, long=True)
            rows = [short.expand(original, -1), long.expand(length - original, -1)]
            return torch.cat(rows), attn_factor
        if self.rope_type != "dynamic" or length <= self.max_position:
            return fn(*args)
        # beyond the trained length, position p uses the frequencies for a sequence of p + 1
        longer = torch.arange(self.max_position + 1, length + 1, dtype=torch.float64)  # [L - M]
        rows = [fn(*args)[0].expand(self.max_position, -1), fn(*args, longer)[0]]
        return torch.cat(rows), 1.0

    def _build_table(self, length: int) -> None:
        inv_freq, attn_factor = self._inv_freqs(length)
        freqs = torch.arange(length).float().unsqueeze(1) * inv_freq  # [L, dim/2]
        cos, sin = freqs.cos() * attn_factor, freqs.sin() * attn_factor
        if self.interleaved:  # pair (2i, 2i+1): x * [c, c] + [x2i+1, x2i] * [-s, s]
            self.cos_table = cos.repeat_interleave(2, dim=-1)  # [L, dim]
            self.sin_table = torch.stack([-sin, sin], dim=-1).flatten(-2)  # [L, dim]
            return
        self.cos_table = torch.cat([cos, cos], dim=-1)  # [L, dim]
        # rotate-half folded into a sign: x * cos + swap_halves(x) * [-sin | sin]
        self.sin_table = torch.cat([-sin, sin], dim=-1)  # [L, dim]

    @property
    def num_positions(self) -> int:
        return self.cos_table.shape[0]

    def reserve(self, num_positions: int) -> bool:
        """Cover positions < num_positions (grown geometrically, on the table's device); True when
        the table was rebuilt. The model runner calls it before a step's forward with the step's
        longest sequence: never inside the forward (nor inside a captured CUDA graph, which
        would go on reading the old table: the runner captures again)."""
        if num_positions <= self.num_positions:
            return False
        with torch.device(self.cos_table.device):
            self._build_table(max(num_positions, 2 * self.num_positions))
        return True

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """positions [T] (each < the table's length) -> (cos, signed sin), each [T, 1,
        rotary_dim] in `dtype`."""
        cos = self.cos_table.index_select(0, positions).to(dtype).unsqueeze(1)  # [T, 1, dim]
        sin = self.sin_table.index_select(0, positions).to(dtype).unsqueeze(1)  # [T, 1, dim]
        return cos, sin


def apply_rotary(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False
) -> torch.Tensor:
    """x [T, heads, head_dim] rotated in its first rotary_dim features."""
    rotary_dim = cos.shape[-1]
    rot = x[..., :rotary_dim]
    if interleaved:
        swapped = rot.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)  # [T, h, rd] = [x1, x0, x3, ...]
    else:
        half = rotary_dim // 2
        swapped = rot.unflatten(-1, (2, half)).flip(-2).flatten(-2)  # [T, h, rd] = [x2 | x1]
    out = rot * cos + swapped * sin  # [T, h, rd]
    if rotary_dim == x.shape[-1]:
        return out
    return torch.cat([out, x[..., rotary_dim:]], dim=-1)


class ApplyRotary(CustomOp):
    """x [T, heads, head_dim] rotated by (cos, sin) [T, 1, rotary_dim] in the rotate-half or the
    interleaved layout. The CPU and CUDA kernels rotate x in place, the reference returns a new
    tensor: use the return value, and do not need x unrotated afterwards. The CUDA kernel knows
    the rotate-half layout only: interleaved rotary runs the reference there."""

    def __init__(self, interleaved: bool = False):
        super().__init__()
        self.interleaved = interleaved
        if interleaved:
            self.native_on("cuda")

    def forward_native(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        return apply_rotary(x, cos, sin, self.interleaved)

    def forward_cpu(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        # cos/sin [T, 1, rd] -> [T, rd]
        self.kernels.rotary_(x, cos.squeeze(1), sin.squeeze(1), self.interleaved)
        return x

    def forward_cuda(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        self.kernels.rotary_(x, cos.squeeze(1), sin.squeeze(1))  # the Triton kernel, in place
        return x


def get_rope(
    head_dim: int,
    rotary_dim: int,
    max_position: int,
    base: float,
    scaling: dict | None,
    interleaved: bool = False,
) -> RotaryEmbedding:
    assert rotary_dim <= head_dim and rotary_dim % 2 == 0, (rotary_dim, head_dim)
    num_positions = current_build_context().max_model_len
    return RotaryEmbedding(rotary_dim, base, max_position, scaling, num_positions, interleaved)


class MRotaryEmbedding(RotaryEmbedding):
    """Qwen2-VL's multimodal rotary (M-RoPE): the rotary frequencies are split into three
    sections (`mrope_section`, summing to rotary_dim / 2) rotated by a temporal, a height and a
    width position. positions [3, T] -> (cos, sin) [T, 1, rotary_dim]: each feature takes its
    section's position row. A text token has the same position in all three rows, which is
    plain RoPE, so a [T] positions tensor is served as such."""

    def __init__(self, *args, mrope_section: tuple[int, ...], **kwargs):
        super().__init__(*args, **kwargs)
        half = self.rotary_dim // 2
        if sum(mrope_section) != half or len(mrope_section) != 3:
            raise ModelLoadError(
                f"mrope_section {list(mrope_section)} must be 3 sections summing to {half}"
            )
        sections = torch.repeat_interleave(torch.arange(3), torch.tensor(mrope_section))  # [d/2]
        self.section_of_feature = torch.cat([sections, sections]).tolist()  # [rotary_dim]

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        if positions.dim() == 1:
            return super().forward(positions, dtype)
        section = torch.tensor(self.section_of_feature, device=positions.device)  # [rd]
        # gather per feature: the row of table[positions[section[j]], j]
        rows = positions[section].t()  # [T, rd]: the position each feature of a token rotates by
        cos = self.cos_table.gather(0, rows).to(dtype).unsqueeze(1)  # [T, 1, rd]
        sin = self.sin_table.gather(0, rows).to(dtype).unsqueeze(1)
        return cos, sin
