"""Bounds on the images a request may carry (flags `--max-image-fetch-size`,
`--image-fetch-timeout`, `--max-image-pixels`, `--allow-private-image-urls`)."""

from __future__ import annotations

from dataclasses import dataclass

from pytgi.errors import ConfigError


@dataclass(frozen=True)
class ImageConfig:
    max_fetch_bytes: int = 32 * 2**20  # one image's encoded bytes (URL or data URI)
    fetch_timeout_s: float = 10.0  # a whole fetch, redirects included
    max_redirects: int = 3
    max_pixels: int = 40_000_000  # decoded width x height (decompression bombs)
    max_images: int = 32  # per request
    allow_private_urls: bool = False  # loopback, private, link-local, reserved addresses
    cache_bytes: int = 256 * 2**20  # processed images kept, by content hash

    def __post_init__(self):
        for name in ("max_fetch_bytes", "max_pixels", "max_images"):
            if getattr(self, name) < 1:
                raise ConfigError(f"`{name}` must be >= 1")
        if not self.fetch_timeout_s > 0:
            raise ConfigError("`image_fetch_timeout` must be > 0")
        if self.max_redirects < 0 or self.cache_bytes < 0:
            raise ConfigError("image redirect and cache bounds must be >= 0")
