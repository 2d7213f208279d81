"""Encoded image bytes -> a PIL image, bounded: the pixel count is read from the header and
checked before any pixel is decoded (decompression bombs), a truncated or non-image file is a
422, and animated images give their first frame."""

from __future__ import annotations

import io
import warnings

from PIL import Image, UnidentifiedImageError

from pytgi.router.errors import input_error
from pytgi.router.images.config import ImageConfig


def decode_image(data: bytes, config: ImageConfig) -> Image.Image:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            width, height = image.size
            if width * height > config.max_pixels:
                raise input_error(
                    f"invalid image: {width}x{height} pixels exceeds the maximum of "
                    f"{config.max_pixels} pixels"
                )
            image.load()
    except (UnidentifiedImageError, Image.DecompressionBombError, Image.DecompressionBombWarning,
            OSError, SyntaxError, ValueError) as exc:  # fmt: skip
        raise input_error(f"invalid image: {exc}") from exc
    return image  # the model's processor converts it to RGB as it would for transformers
