"""TGI's markdown image syntax, data URIs and decoding: every bad image is a 422 with TGI's
message prefix, before any model work."""

from __future__ import annotations

import pytest
from fixtures.images import bomb_png, data_uri, png_bytes

from pytgi.errors import ValidationError
from pytgi.router.images.config import ImageConfig
from pytgi.router.images.decode import decode_image
from pytgi.router.images.sources import (
    ImageChunk,
    TextChunk,
    decode_data_uri,
    has_markdown_image,
    split_markdown,
)


def test_split_markdown_keeps_text_and_images_in_order():
    text = "Look ![](http://a/x.png) and ![alt](data:image/png;base64,AAAA) done"
    assert split_markdown(text) == [
        TextChunk("Look "),
        ImageChunk("http://a/x.png"),
        TextChunk(" and "),
        ImageChunk("data:image/png;base64,AAAA"),
        TextChunk(" done"),
    ]
    assert split_markdown("plain") == [TextChunk("plain")]
    assert has_markdown_image(text) and not has_markdown_image("![not an image")


def test_data_uri_round_trip_and_refusals():
    config = ImageConfig(max_fetch_bytes=10_000)
    data = png_bytes(8, 8)
    assert decode_data_uri(data_uri(data), config) == ("image/png", data)
    cases = {
        "data:image/png;base64,@@@@": "Input validation error: base64 encoding is invalid: ",
        "data:text/plain;base64,QUJD": "Input validation error: invalid image content: ",
        "data:image/png,raw": "Input validation error: invalid image content: ",
    }
    for uri, prefix in cases.items():
        with pytest.raises(ValidationError) as err:
            decode_data_uri(uri, config)
        assert err.value.message.startswith(prefix), err.value.message
    big = data_uri(b"\0" * 12_000)
    with pytest.raises(ValidationError) as err:
        decode_data_uri(big, config)
    assert err.value.message == (
        "Input validation error: Image size 12000 bytes exceeds maximum allowed size of 10000 bytes"
    )


@pytest.mark.parametrize(
    "data",
    [b"not an image at all", png_bytes(32, 32)[:60], bomb_png()],
    ids=["text", "truncated", "bomb-20000x20000"],
)
def test_bad_images_are_invalid(data):
    with pytest.raises(ValidationError) as err:
        decode_image(data, ImageConfig())
    assert err.value.status_code == 422
    assert err.value.message.startswith("Input validation error: invalid image: ")


def test_pixel_limit_is_read_from_the_header():
    with pytest.raises(ValidationError, match="64x64 pixels exceeds the maximum of 1000"):
        decode_image(png_bytes(64, 64), ImageConfig(max_pixels=1000))
    assert decode_image(png_bytes(64, 64), ImageConfig()).size == (64, 64)
