"""Tiny GGUF files converted from the tiny HF Llama checkpoints, once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.gguf_files import Q, all_f32, write_llama_gguf

# one linear type per module, so that a two-layer model holds every block type
MIXED_TYPES = {
    "q_proj": Q.Q4_K,
    "k_proj": Q.Q5_K,
    "v_proj": Q.Q6_K,
    "o_proj": Q.Q8_0,
    "gate_proj": Q.Q4_0,
    "up_proj": Q.Q4_1,
    "layers.0.mlp.down_proj": Q.Q5_0,
    "layers.1.mlp.down_proj": Q.Q5_1,
    "embed_tokens": Q.BF16,
    "lm_head": Q.F16,
}


def mixed_types(hf_name: str):
    return next(qtype for key, qtype in MIXED_TYPES.items() if f"{key}." in hf_name)


@pytest.fixture(scope="session")
def gguf_factory(tiny_model_factory, tmp_path_factory):
    """`factory(arch, qtype_for=all_f32, **overrides) -> (gguf path, HF model dir)`; the GGUF
    file is alone in its directory."""
    built: dict[tuple, tuple[Path, Path]] = {}

    def factory(arch: str = "llama", qtype_for=all_f32, **overrides) -> tuple[Path, Path]:
        key = (arch, qtype_for, tuple(sorted(overrides.items())))
        if key not in built:
            model_dir = tiny_model_factory(arch, **overrides)
            path = tmp_path_factory.mktemp(f"gguf-{arch}") / f"tiny-{arch}.gguf"
            built[key] = (write_llama_gguf(model_dir, path, qtype_for), model_dir)
        return built[key]

    return factory


@pytest.fixture(scope="session")
def tiny_gguf(gguf_factory) -> tuple[Path, Path]:
    return gguf_factory("llama")


@pytest.fixture(scope="session")
def mixed_gguf(gguf_factory) -> tuple[Path, Path]:
    """Every supported type in one tiny Llama (K-quants need 256-element rows)."""
    return gguf_factory("llama", mixed_types, hidden_size=256, intermediate_size=512)
