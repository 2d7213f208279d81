"""KVCacheManager: each request's block table, prefix-cache lookups, allocation of slots for new
tokens.

Invariant: a request owning `len(blocks)` blocks can hold `len(blocks) * block_size` tokens; the
first `num_computed_tokens` of its tokens are in those blocks. Full blocks of computed tokens are
published to the prefix cache (prompt and generated tokens alike, so a multi-turn conversation hits
its own history). A block holding image placeholder tokens is keyed by the images' content hashes
too, so two prompts with the same text and different images never share it.

Sliding windows: when every attention layer has one (`sliding_window` = the largest), a query at
position p reads only keys p - W < pos <= p, so once a request has computed n tokens no later
query reads positions below n - W + 1: its blocks wholly below that go back to the pool
(`free_out_of_window`), and a placeholder (`NULL_BLOCK`, never read) keeps its table's positions.
A freed block keeps its prefix-cache entry until the pool hands it out again (which evicts the
hash), so a later prefix hit reads only blocks whose contents are intact; a hit is a run of blocks
from the sequence's start, so once an early block is evicted nothing past it matches and the
prompt is recomputed from there.

Bidirectional spans (`bidirectional`, messages/bidirectional.py): a span's tokens see each
other both ways, so their K/V are right only when the whole span ran in one step. A hit never
ends inside a span: it is cut back to the block boundary before the span (repeatedly, when that
boundary falls inside an earlier span). With the "prompt" mode (PaliGemma's prefix-LM) every
prompt token's K/V depends on the whole prompt, so the chain also starts from the prompt's
length: prompts of different lengths never share a block, and a hit covering the prompt (in
practice a preempted request re-hitting its own prompt and output) proves every prompt token
equal. With "images" (Gemma 3) a block holding image tokens is keyed by the image's content hash
already, and an image's K/V depend only on its own tokens and those before it.
"""

from __future__ import annotations

from pytgi.engine.block_pool import Block, BlockHash, BlockPool, hash_block
from pytgi.engine.request import Request
from pytgi.messages.bidirectional import PROMPT, span_around, spans_of
from pytgi.utils.math import cdiv

NULL_BLOCK = Block(block_id=0)  # a freed out-of-window position: never read, never freed


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        sliding_window: int | None = None,
        bidirectional: str | None = None,
    ):
        self.block_size = block_size
        self.sliding_window = sliding_window
        self.bidirectional = bidirectional
        self.pool = BlockPool(num_blocks, enable_prefix_caching)
        self.enable_prefix_caching = enable_prefix_caching
        self._blocks: dict[str, list[Block]] = {}
        self._hashes: dict[str, list[BlockHash]] = {}  # of the request's full blocks, in order
        self._num_published: dict[str, int] = {}  # leading blocks already in the prefix cache
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    def block_ids(self, request_id: str, start: int = 0) -> list[int]:
        """The request's block ids from its `start`-th block on."""
        return [b.block_id for b in self._blocks.get(request_id, ())[start:]]

    def find_cached_prefix(self, request: Request) -> list[Block]:
        """Longest run of cached full blocks matching the request's tokens, leaving >= 1 token to
        compute.
        """
        if not self.enable_prefix_caching or request.sampling.prefill_logprobs:
            return []  # prefill logprobs need every prompt position computed (as TGI)
        hashes = self._full_block_hashes(request)
        max_blocks = (request.num_tokens - 1) // self.block_size
        hit: list[Block] = []
        for block_hash in hashes[:max_blocks]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            hit.append(block)
        if self.bidirectional:
            hit = hit[: self._outside_spans(request, len(hit) * self.block_size) // self.block_size]
        self.num_queried_tokens += request.num_prompt_tokens
        self.num_hit_tokens += len(hit) * self.block_size
        return hit

    def spans(self, request: Request):
        return spans_of(self.bidirectional, request.num_prompt_tokens, request.multimodal_inputs)

    def _outside_spans(self, request: Request, num_tokens: int) -> int:
        """The largest block boundary <= num_tokens that cuts no bidirectional span."""
        spans = self.spans(request)
        while (span := span_around(spans, num_tokens)) is not None:
            num_tokens = span[0] // self.block_size * self.block_size
        return num_tokens

    def allocate_slots(
        self, request: Request, num_new_tokens: int, cached: list[Block] | None = None
    ) -> bool:
        """Make room for `num_new_tokens` more tokens after the computed ones; False if blocks ran
        out.

        `cached` are prefix-hit blocks for a request being admitted (its num_computed_tokens is then
        advanced by the caller). On failure nothing changes.
        """
        cached = cached or []
        blocks = self._blocks.setdefault(request.request_id, [])
        num_computed = request.num_computed_tokens + len(cached) * self.block_size
        num_needed = (
            cdiv(num_computed + num_new_tokens, self.block_size) - len(blocks) - len(cached)
        )
        # cached blocks sitting in the free list are revived: they are not available as new ones
        num_revived = sum(1 for b in cached if b.ref_cnt == 0)
        if num_needed > self.pool.num_free_blocks - num_revived:
            if not blocks:
                del self._blocks[request.request_id]
            return False
        self.pool.touch(cached)
        blocks.extend(cached)
        if num_needed > 0:
            blocks.extend(self.pool.allocate(num_needed))
        return True

    def cache_computed_blocks(self, request: Request) -> None:
        """Publish the request's full, computed blocks to the prefix cache."""
        if not self.enable_prefix_caching:
            return
        rid = request.request_id
        blocks = self._blocks.get(rid, [])
        num_full = min(request.num_computed_tokens // self.block_size, len(blocks))
        first = self._num_published.get(rid, 0)
        if num_full <= first:
            return
        hashes = self._full_block_hashes(request)
        for block, block_hash in zip(blocks[first:num_full], hashes[first:num_full], strict=True):
            if block is not NULL_BLOCK:
                self.pool.cache_block(block, block_hash)
        self._num_published[rid] = num_full

    def free_out_of_window(self, request: Request) -> int:
        """Return the request's blocks that no later query can read (every layer windowed);
        the number freed."""
        if self.sliding_window is None:
            return 0
        blocks = self._blocks.get(request.request_id, [])
        first_needed = request.num_computed_tokens - self.sliding_window + 1  # a position
        num_gone = min(max(0, first_needed) // self.block_size, len(blocks))
        freed = [b for b in blocks[:num_gone] if b is not NULL_BLOCK]
        self.pool.free(freed)
        blocks[:num_gone] = [NULL_BLOCK] * num_gone
        return len(freed)

    def num_held_blocks(self, request_id: str) -> int:
        return sum(1 for b in self._blocks.get(request_id, ()) if b is not NULL_BLOCK)

    def free(self, request: Request) -> None:
        blocks = self._blocks.pop(request.request_id, [])
        self.pool.free(b for b in reversed(blocks) if b is not NULL_BLOCK)
        self._hashes.pop(request.request_id, None)
        self._num_published.pop(request.request_id, None)

    def _full_block_hashes(self, request: Request) -> list[BlockHash]:
        """Hashes of every full block of the request's known tokens, extended incrementally."""
        hashes = self._hashes.setdefault(request.request_id, [])
        num_full = request.num_tokens // self.block_size
        if num_full == len(hashes):
            return hashes
        bs = self.block_size
        for i in range(len(hashes), num_full):
            # a LoRA adapter (or an input every token depends on) changes every layer's K/V: the
            # first block chains from it
            parent = hashes[-1] if hashes else _root(request, self.bidirectional == PROMPT)
            tokens = tuple(request.token_ids(i * bs, (i + 1) * bs))
            images = _images_in(request, i * bs, (i + 1) * bs)
            hashes.append(hash_block(parent, tokens + images if images else tokens))
        return hashes


def _images_in(request: Request, start: int, end: int) -> tuple[str, ...]:
    """Content hashes of the images whose placeholder tokens overlap [start, end): a block's K/V
    depends on them, while its token ids (the placeholders) are the same for every image."""
    return tuple(
        mm.content_hash for mm in request.multimodal_inputs if mm.offset < end and mm.end > start
    )


def _root(request: Request, bidirectional_prompt: bool) -> BlockHash | None:
    """The first block's parent: a LoRA adapter and inputs every token depends on (Mllama's
    images) change every block's K/V, and so does a bidirectional prompt's length."""
    whole = tuple(mm.content_hash for mm in request.multimodal_inputs if mm.keys_whole_request)
    root = None
    if request.adapter_id is not None or whole:
        root = hash(("root", request.adapter_id, whole))
    if bidirectional_prompt:
        root = hash(("prompt", request.num_prompt_tokens, root))
    return root
