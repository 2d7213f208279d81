"""`ServerContext`: what every route needs, built once by `create_app` (in `app.state.ctx`).

`model_info` (from the launcher) may carry: `model_id`, `model_sha`, `model_pipeline_tag`, `sha`,
`docker_label`, `validation_workers`, `compute_type`, `model_architecture`,
`model_implementation` ("native" or "transformers": which code serves the model), `quantize` (the
`--quantize` method, or "gguf") and `weight_types` (a GGUF file's tensor types, e.g. "Q4_1 x210,
F32 x61") and `speculate`; the last five are extra /info keys. Missing keys fall back to the
configs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import Request

from pytgi.config import CacheInfo, ServerConfig
from pytgi.engine.client import EngineClient
from pytgi.server.headers import DEFAULT_COMPUTE_TYPE
from pytgi.server.health import HealthState
from pytgi.server.protocol import Info
from pytgi.version import __version__

if TYPE_CHECKING:  # the router is only called through these methods
    from pytgi.router.infer import Infer

TGI_VERSION = "3.3.6-dev0"  # the TGI release whose API we serve (/info.version, OpenAPI)
DEFAULT_VALIDATION_WORKERS = 2
# extra /info keys, when known
MODEL_KEYS = (
    "model_architecture",
    "model_implementation",
    "quantize",
    "weight_types",
    "speculate",  # --speculate: draft tokens per decode step
)


@dataclass
class ServerContext:
    infer: Infer
    engine: EngineClient
    config: ServerConfig
    cache_info: CacheInfo
    model_info: dict[str, Any]
    health: HealthState
    keep_alive_s: float
    started_at: float = field(default_factory=time.time)

    @property
    def model_id(self) -> str:
        return self.model_info.get("model_id") or self.config.model_id

    @property
    def lora_adapters(self) -> tuple[str, ...]:
        """The ids of the LoRA adapters the engine serves (chat `model` and `adapter_id` values)."""
        return self.cache_info.lora_adapters

    @property
    def compute_type(self) -> str:
        return self.model_info.get("compute_type") or DEFAULT_COMPUTE_TYPE

    @property
    def system_fingerprint(self) -> str:
        return f"{TGI_VERSION}-{self.model_info.get('docker_label') or 'native'}"

    @property
    def max_input_tokens(self) -> int:
        limit = self.config.limits.max_input_tokens
        return limit if limit is not None else self.cache_info.max_input_tokens

    @property
    def max_total_tokens(self) -> int:
        limit = self.config.limits.max_total_tokens
        return limit if limit is not None else self.cache_info.max_total_tokens

    def info(self) -> Info:
        limits, cache = self.config.limits, self.cache_info
        return Info(
            model_id=self.model_id,
            model_sha=self.model_info.get("model_sha") or self.config.model_sha,
            model_pipeline_tag=self.model_info.get("model_pipeline_tag"),
            max_concurrent_requests=limits.max_concurrent_requests,
            max_best_of=limits.max_best_of,
            max_stop_sequences=limits.max_stop_sequences,
            max_input_tokens=self.max_input_tokens,
            max_total_tokens=self.max_total_tokens,
            validation_workers=self.model_info.get(
                "validation_workers", DEFAULT_VALIDATION_WORKERS
            ),
            max_client_batch_size=limits.max_client_batch_size,
            version=TGI_VERSION,
            sha=self.model_info.get("sha"),
            docker_label=self.model_info.get("docker_label"),
            pytgi_version=__version__,
            max_batch_total_tokens=cache.max_batch_total_tokens,
            max_top_n_tokens=limits.max_top_n_tokens,
            kv_cache={
                "num_blocks": cache.num_blocks,
                "block_size": cache.block_size,
                "dtype": cache.kv_cache_dtype or cache.dtype,
                "model_dtype": cache.dtype,
                "bytes_per_token": cache.kv_bytes_per_token,
                "device": cache.device,
                # a model mixing windowed and full layers: each KV group's blocks (the full
                # group's bound the tokens that fit, max_batch_total_tokens)
                **_kv_groups(cache),
            },
            **({"lora_adapters": list(self.lora_adapters)} if self.lora_adapters else {}),
            **{k: self.model_info[k] for k in MODEL_KEYS if self.model_info.get(k)},
        )


def _kv_groups(cache) -> dict:
    if not cache.kv_groups:
        return {}
    return {"groups": [{"sliding_window": w, "num_blocks": n} for w, n in cache.kv_groups]}


def get_context(request: Request) -> ServerContext:
    return request.app.state.ctx
