"""Fetching image URLs within bounds, against a loopback server: loopback is refused unless
`allow_private_urls` is on; redirects, size, time and content type are bounded."""

from __future__ import annotations

import asyncio

import pytest
from fixtures.images import image_server, png_bytes, png_route, redirect_route

from pytgi.errors import ValidationError
from pytgi.router.images.config import ImageConfig
from pytgi.router.images.fetch import fetch_image, is_public_address

OPEN = ImageConfig(allow_private_urls=True, fetch_timeout_s=2.0, max_fetch_bytes=50_000)
PNG = png_bytes(16, 16)


def fetch(url, config=OPEN):
    return asyncio.run(fetch_image(url, config))


def refused(url, config=OPEN) -> str:
    with pytest.raises(ValidationError) as err:
        fetch(url, config)
    assert err.value.status_code == 422
    return err.value.message


@pytest.mark.parametrize(
    "address, public",
    [("8.8.8.8", True), ("127.0.0.1", False), ("10.1.2.3", False), ("192.168.0.1", False),
     ("169.254.169.254", False), ("::1", False), ("fe80::1", False), ("::ffff:127.0.0.1", False),
     ("100.64.0.1", False), ("0.0.0.0", False), ("224.0.0.1", False)],
)  # fmt: skip
def test_public_addresses(address, public):
    assert is_public_address(address) is public


def test_fetch_bounds():
    routes = {
        "/a.png": png_route(PNG),
        "/octet": png_route(PNG, "application/octet-stream"),
        "/hop1": redirect_route("/hop2"),
        "/hop2": redirect_route("/a.png"),
        "/loop": redirect_route("/loop"),
        "/html": png_route(b"<html></html>", "text/html"),
        "/big": png_route(b"\0" * 60_000),
        "/slow": png_route(PNG, delay=3.0),
    }
    with image_server(routes) as base:
        assert fetch(f"{base}/a.png") == ("image/png", PNG)
        assert fetch(f"{base}/octet")[1] == PNG
        assert fetch(f"{base}/hop1")[1] == PNG  # two redirects, within the default 3
        message = refused(f"{base}/loop")
        assert message == "Input validation error: Could not fetch image: more than 3 redirects"
        assert "invalid image content: unsupported content type `text/html`" in refused(
            f"{base}/html"
        )
        assert refused(f"{base}/big") == (
            "Input validation error: Image size 60000 bytes exceeds maximum allowed size of "
            "50000 bytes"
        )
        assert "Could not fetch image: HTTP status 404" in refused(f"{base}/missing")
        assert "Could not fetch image: " in refused(f"{base}/slow")
        # private addresses: refused by default, the redirect target included
        closed = ImageConfig(fetch_timeout_s=2.0)
        assert "resolves to a private, loopback or link-local address" in refused(
            f"{base}/a.png", closed
        )
        assert "private" in refused(base.replace("127.0.0.1", "localhost") + "/a.png", closed)
    assert "unsupported URL" in refused("ftp://example.com/a.png")
