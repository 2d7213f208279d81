"""Fetching an image URL within bounds: http(s) only, at most `max_redirects` redirects (each hop
checked again), `fetch_timeout_s` for the whole fetch, `max_fetch_bytes` read (the body is
streamed and cut there), an `image/*` (or untyped) content type.

Addresses: unless `allow_private_urls`, a host is refused when it resolves to anything but a
global unicast address (loopback, private, link-local, shared, reserved and multicast ranges).
The check is made where the connection is opened (`_GuardedBackend.connect_tcp`), on the very
address connected to, so a name that resolves differently between a check and the connect
(DNS rebinding) cannot slip through. TGI has no such check; see docs/TGI_COMPATIBILITY.md.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urljoin, urlsplit

import httpcore

from pytgi.router.errors import input_error
from pytgi.router.images.config import ImageConfig
from pytgi.router.images.sources import check_size

_REDIRECTS = {301, 302, 303, 307, 308}
_ALLOWED_TYPES = ("image/", "application/octet-stream", "binary/octet-stream")


class RefusedAddress(OSError):
    """The URL's host resolves to an address images may not be fetched from."""


def is_public_address(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    mapped = getattr(ip, "ipv4_mapped", None)
    if mapped is not None:
        ip = mapped
    return ip.is_global and not ip.is_multicast


class _GuardedBackend(httpcore.AsyncNetworkBackend):
    """Resolves the host itself and connects only to an allowed address."""

    def __init__(self, allow_private: bool):
        self.allow_private = allow_private
        self.inner = httpcore.AnyIOBackend()

    async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = [info[4][0] for info in infos]
        allowed = [a for a in addresses if self.allow_private or is_public_address(a)]
        if not allowed:
            raise RefusedAddress(
                f"{host} resolves to a private, loopback or link-local address, "
                "which images are not fetched from"
            )
        return await self.inner.connect_tcp(
            allowed[0], port, timeout, local_address, socket_options
        )

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


async def fetch_image(url: str, config: ImageConfig) -> tuple[str, bytes]:
    """(content type, bytes) of an http(s) URL; every failure is a 422 with TGI's prefixes."""
    try:
        return await asyncio.wait_for(_fetch(url, config), config.fetch_timeout_s)
    except TimeoutError as exc:
        raise input_error(
            f"Could not fetch image: no answer within {config.fetch_timeout_s:g} s"
        ) from exc


async def _fetch(url: str, config: ImageConfig) -> tuple[str, bytes]:
    timeouts = {k: config.fetch_timeout_s for k in ("connect", "read", "write", "pool")}
    async with httpcore.AsyncConnectionPool(
        network_backend=_GuardedBackend(config.allow_private_urls), retries=0
    ) as pool:
        for _ in range(config.max_redirects + 1):
            _check_scheme(url)
            try:
                async with pool.stream(
                    "GET", url, headers={"Accept": "image/*"}, extensions={"timeout": timeouts}
                ) as response:
                    location = _header(response, b"location")
                    if response.status in _REDIRECTS and location:
                        url = urljoin(url, location)
                        continue
                    if response.status != 200:
                        raise input_error(f"Could not fetch image: HTTP status {response.status}")
                    return _content_type(response), await _read_bounded(response, config)
            except RefusedAddress as exc:
                raise input_error(f"Could not fetch image: {exc}") from exc
            except (httpcore.NetworkError, httpcore.ProtocolError, OSError) as exc:
                raise input_error(f"Could not fetch image: {exc or type(exc).__name__}") from exc
            except httpcore.TimeoutException as exc:
                raise input_error("Could not fetch image: timed out") from exc
            except httpcore.UnsupportedProtocol as exc:
                raise input_error(f"Could not fetch image: {exc}") from exc
    raise input_error(f"Could not fetch image: more than {config.max_redirects} redirects")


def _check_scheme(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise input_error(f"Could not fetch image: unsupported URL `{url[:100]}`")


def _header(response, name: bytes) -> str | None:
    for key, value in response.headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _content_type(response) -> str:
    value = (_header(response, b"content-type") or "").split(";")[0].strip().lower()
    if value and not value.startswith(_ALLOWED_TYPES):
        raise input_error(f"invalid image content: unsupported content type `{value}`")
    return value


async def _read_bounded(response, config: ImageConfig) -> bytes:
    length = _header(response, b"content-length")
    if length is not None and length.isdigit():
        check_size(int(length), config)
    data = bytearray()
    async for piece in response.aiter_stream():
        data += piece
        check_size(len(data), config)
    return bytes(data)
