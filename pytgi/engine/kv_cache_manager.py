"""KVCacheManager: each request's block table, prefix-cache lookups, allocation of slots for new
tokens.

Invariant: a request owning `len(blocks)` blocks can hold `len(blocks) * block_size` tokens; the
first `num_computed_tokens` of its tokens are in those blocks. Full blocks of computed tokens are
published to the prefix cache (prompt and generated tokens alike, so a multi-turn conversation hits
its own history). A block holding image placeholder tokens is keyed by the images' content hashes
too, so two prompts with the same text and different images never share it.

KV groups (docs/KV_CACHE.md): a model's layers fall in groups by window (`groups`: each group's
window, None for full attention, and its block count). Each group has its own pool of blocks and
its own table per request; every table covers the same positions (block i of each holds positions
i * block_size ..), so one count of blocks sent to the workers serves every group. One group is
the common case: full attention, or every layer windowed (its window the largest). A model mixing
windowed and full layers (Gemma 2/3, Cohere 2) has the full group first, then its window groups.

Sliding windows: a windowed group's query at position p reads only keys p - W < pos <= p, so once
a request has computed n tokens no later query of that group reads positions below n - W + 1: the
group's blocks wholly below that go back to its pool (`free_out_of_window`), and a placeholder
(`NULL_BLOCK`, never read) keeps its table's positions. The full group keeps every block.
A freed block keeps its prefix-cache entry until the pool hands it out again (which evicts the
hash), so a later prefix hit reads only blocks whose contents are intact; a hit is a run of blocks
from the sequence's start in every group, so once an early block of any group is evicted nothing
past it matches and the prompt is recomputed from there. A hit's windowed-group blocks below its
window are not taken (placeholders): only the blocks its first query can read are revived.

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

from collections.abc import Sequence
from dataclasses import dataclass, field

from pytgi.engine.block_pool import Block, BlockHash, BlockPool, hash_block
from pytgi.engine.request import Request
from pytgi.messages.bidirectional import PROMPT, span_around, spans_of
from pytgi.utils.math import cdiv

NULL_BLOCK = Block(block_id=0)  # a freed out-of-window position: never read, never freed


@dataclass
class PrefixHit:
    """Cached leading blocks of a request: `blocks[g]` is group g's run (a windowed group's
    blocks below the window of the first uncached position are NULL_BLOCK placeholders)."""

    num_blocks: int = 0
    blocks: list[list[Block]] = field(default_factory=list)

    def __len__(self) -> int:
        return self.num_blocks


@dataclass
class _Group:
    window: int | None  # None: full attention
    pool: BlockPool
    tables: dict[str, list[Block]] = field(default_factory=dict)  # request id -> its blocks


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        sliding_window: int | None = None,
        bidirectional: str | None = None,
        groups: Sequence[tuple[int | None, int]] | None = None,
    ):
        """One group of `num_blocks` blocks with `sliding_window`, or `groups`: (window,
        num_blocks) per KV group, the full group first (its blocks bound the tokens that fit)."""
        self.block_size = block_size
        groups = list(groups) if groups else [(sliding_window, num_blocks)]
        self.groups = [_Group(w, BlockPool(n, enable_prefix_caching)) for w, n in groups]
        # every layer's window (None: some layer attends to the whole sequence)
        self.sliding_window = groups[0][0] if len(groups) == 1 else None
        self.bidirectional = bidirectional
        self.enable_prefix_caching = enable_prefix_caching
        self._hashes: dict[str, list[BlockHash]] = {}  # of the request's full blocks, in order
        self._num_published: dict[str, int] = {}  # leading blocks already in the prefix cache
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0

    @property
    def pool(self) -> BlockPool:
        """The first group's pool (the only one for most models)."""
        return self.groups[0].pool

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    def block_ids(self, request_id: str, start: int = 0, group: int = 0) -> list[int]:
        """Group `group`'s block ids of the request from its `start`-th block on."""
        return [b.block_id for b in self.groups[group].tables.get(request_id, ())[start:]]

    def find_cached_prefix(self, request: Request) -> PrefixHit:
        """Longest run of cached full blocks matching the request's tokens in every group,
        leaving >= 1 token to compute.
        """
        if not self.enable_prefix_caching or request.sampling.prefill_logprobs:
            return PrefixHit()  # prefill logprobs need every prompt position computed (as TGI)
        hashes = self._full_block_hashes(request)
        max_blocks = (request.num_tokens - 1) // self.block_size
        runs: list[list[Block]] = []
        for group in self.groups:
            run: list[Block] = []
            for block_hash in hashes[: min([max_blocks] + [len(r) for r in runs])]:
                block = group.pool.get_cached_block(block_hash)
                if block is None:
                    break
                run.append(block)
            runs.append(run)
        num_hit = min(len(run) for run in runs)
        if self.bidirectional:  # a hit never ends inside a span (nor a prompt, for PaliGemma)
            num_hit = self._outside_spans(request, num_hit * self.block_size) // self.block_size
        self.num_queried_tokens += request.num_prompt_tokens
        self.num_hit_tokens += num_hit * self.block_size
        if num_hit == 0:
            return PrefixHit()
        blocks = []
        for group, run in zip(self.groups, runs, strict=True):
            run = run[:num_hit]
            num_dead = self._num_out_of_window(group, num_hit * self.block_size)
            blocks.append([NULL_BLOCK] * num_dead + run[num_dead:])
        return PrefixHit(num_hit, blocks)

    def spans(self, request: Request):
        return spans_of(self.bidirectional, request.num_prompt_tokens, request.multimodal_inputs)

    def _outside_spans(self, request: Request, num_tokens: int) -> int:
        """The largest block boundary <= num_tokens that cuts no bidirectional span."""
        spans = self.spans(request)
        while (span := span_around(spans, num_tokens)) is not None:
            num_tokens = span[0] // self.block_size * self.block_size
        return num_tokens

    def allocate_slots(
        self, request: Request, num_new_tokens: int, cached: PrefixHit | None = None
    ) -> bool:
        """Make room for `num_new_tokens` more tokens after the computed ones, in every group;
        False if some group's blocks ran out.

        `cached` are prefix-hit blocks for a request being admitted (its num_computed_tokens is then
        advanced by the caller). On failure nothing changes.
        """
        cached = cached or PrefixHit(0, [[] for _ in self.groups])
        rid = request.request_id
        num_held = len(self.groups[0].tables.get(rid, ()))  # every group's table is this long
        num_computed = request.num_computed_tokens + cached.num_blocks * self.block_size
        num_needed = cdiv(num_computed + num_new_tokens, self.block_size) - num_held
        num_needed -= cached.num_blocks
        for group, hit in zip(self.groups, cached.blocks, strict=True):
            # cached blocks sitting in the free list are revived: they are not available as new
            num_revived = sum(1 for b in hit if b is not NULL_BLOCK and b.ref_cnt == 0)
            if num_needed > group.pool.num_free_blocks - num_revived:
                return False
        for group, hit in zip(self.groups, cached.blocks, strict=True):
            blocks = group.tables.setdefault(rid, [])
            group.pool.touch(b for b in hit if b is not NULL_BLOCK)
            blocks.extend(hit)
            if num_needed > 0:
                blocks.extend(group.pool.allocate(num_needed))
        return True

    def cache_computed_blocks(self, request: Request) -> None:
        """Publish the request's full, computed blocks to the prefix cache (every group's)."""
        if not self.enable_prefix_caching:
            return
        rid = request.request_id
        num_blocks = len(self.groups[0].tables.get(rid, ()))
        num_full = min(request.num_computed_tokens // self.block_size, num_blocks)
        first = self._num_published.get(rid, 0)
        if num_full <= first:
            return
        hashes = self._full_block_hashes(request)
        for group in self.groups:
            blocks = group.tables[rid][first:num_full]
            for block, block_hash in zip(blocks, hashes[first:num_full], strict=True):
                if block is not NULL_BLOCK:
                    group.pool.cache_block(block, block_hash)
        self._num_published[rid] = num_full

    def free_out_of_window(self, request: Request) -> int:
        """Return the request's blocks that no later query of their group can read (the windowed
        groups'); the number freed."""
        num_freed = 0
        for group in self.groups:
            blocks = group.tables.get(request.request_id, [])
            num_gone = min(self._num_out_of_window(group, request.num_computed_tokens), len(blocks))
            freed = [b for b in blocks[:num_gone] if b is not NULL_BLOCK]
            group.pool.free(freed)
            blocks[:num_gone] = [NULL_BLOCK] * num_gone
            num_freed += len(freed)
        return num_freed

    def _num_out_of_window(self, group: _Group, num_computed: int) -> int:
        """Leading blocks no query at position >= num_computed reads in `group`."""
        if group.window is None:
            return 0
        first_needed = num_computed - group.window + 1  # a position
        return max(0, first_needed) // self.block_size

    def num_held_blocks(self, request_id: str, group: int = 0) -> int:
        table = self.groups[group].tables.get(request_id, ())
        return sum(1 for b in table if b is not NULL_BLOCK)

    def free(self, request: Request) -> None:
        for group in self.groups:
            blocks = group.tables.pop(request.request_id, [])
            group.pool.free(b for b in reversed(blocks) if b is not NULL_BLOCK)
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
