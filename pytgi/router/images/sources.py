"""TGI's image syntax in a prompt: `![](url)` / `![alt](url)` chunks, where url is `http(s)://…`
or `data:<mime>;base64,<data>`; and the bytes behind one such url (a data URI decoded here, a
URL fetched by `fetch`)."""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

from pytgi.router.errors import input_error
from pytgi.router.images.config import ImageConfig

# TGI's router matches `!\[\]\([^\)]*\)`; pytgi also accepts alt text (ignored)
_MARKDOWN_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)]*)\)")


@dataclass(frozen=True)
class TextChunk:
    text: str


@dataclass(frozen=True)
class ImageChunk:
    url: str


def split_markdown(text: str) -> list[TextChunk | ImageChunk]:
    """The prompt as text and image chunks in order (one text chunk when it has no image)."""
    chunks: list[TextChunk | ImageChunk] = []
    end = 0
    for match in _MARKDOWN_IMAGE.finditer(text):
        if match.start() > end:
            chunks.append(TextChunk(text[end : match.start()]))
        chunks.append(ImageChunk(match.group(1).strip()))
        end = match.end()
    if end < len(text) or not chunks:
        chunks.append(TextChunk(text[end:]))
    return chunks


def has_markdown_image(text: str) -> bool:
    return "![" in text and _MARKDOWN_IMAGE.search(text) is not None


def decode_data_uri(url: str, config: ImageConfig) -> tuple[str, bytes]:
    """`data:<mime>;base64,<data>` -> (mime, bytes), bounded by `max_fetch_bytes`."""
    header, sep, payload = url[len("data:") :].partition(",")
    if not sep or not header.endswith(";base64"):
        raise input_error(f"invalid image content: {url[:64]}")
    mime = header[: -len(";base64")]
    if not mime.startswith("image/"):
        raise input_error(f"invalid image content: unsupported content type `{mime}`")
    estimate = len(payload) * 3 // 4
    check_size(estimate, config)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise input_error(f"base64 encoding is invalid: {exc}") from exc
    check_size(len(data), config)
    return mime, data


def check_size(size: int, config: ImageConfig) -> None:
    if size > config.max_fetch_bytes:
        raise input_error(
            f"Image size {size} bytes exceeds maximum allowed size of "
            f"{config.max_fetch_bytes} bytes"
        )
