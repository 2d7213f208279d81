"""Prefix-cache keys of blocks holding image placeholders include the images' content hashes."""

from __future__ import annotations

from pytgi.engine.kv_cache_manager import KVCacheManager
from pytgi.engine.request import Request
from pytgi.messages.request import EngineRequest, MultimodalInput


def request(rid: str, image_hash: str | None) -> Request:
    ids = list(range(100, 108)) + [7] * 8 + list(range(200, 208))  # 8 text, 8 image, 8 text
    images = () if image_hash is None else (MultimodalInput("image", 8, 8, image_hash),)
    return Request.from_engine_request(EngineRequest(rid, ids, multimodal_inputs=images))


def test_blocks_after_an_image_depend_on_its_content():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    a, b, c = request("a", "cat"), request("b", "dog"), request("c", "cat")
    ha, hb, hc = (kv._full_block_hashes(r) for r in (a, b, c))
    assert ha[:2] == hb[:2]  # text before the image
    assert all(x != y for x, y in zip(ha[2:], hb[2:], strict=True))  # the image and after
    assert ha == hc
    assert kv._full_block_hashes(request("d", None))[2] != ha[2]


def test_a_different_image_is_never_a_prefix_hit():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    first = request("a", "cat")
    assert kv.allocate_slots(first, first.num_tokens)
    first.num_computed_tokens = first.num_tokens
    kv.cache_computed_blocks(first)
    assert len(kv.find_cached_prefix(request("b", "dog"))) == 2  # the 8 text tokens only
    assert len(kv.find_cached_prefix(request("c", "cat"))) == 5  # all but the last token's block
