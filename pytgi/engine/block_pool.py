"""BlockPool: the KV blocks, their reference counts, the prefix-cache hash map and LRU eviction.

A block is either in use (ref_cnt > 0) or free (ref_cnt == 0, in `_free` in LRU order, oldest
first). A free block may still hold a cached prefix (it has a `block_hash` and is in `_cached`): it
can be revived by a prefix hit (`touch`) until it is handed out again by `allocate`, which evicts
its hash first. So "free" counts cached blocks too: the cache never makes the pool refuse an
allocation.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

BlockHash = int


def hash_block(parent_hash: BlockHash | None, token_ids: tuple[int, ...]) -> BlockHash:
    """Hash of a full block: chains the parent block's hash so equal blocks match only with equal
    prefixes.
    """
    return hash((parent_hash, token_ids))


@dataclass(eq=False)
class Block:
    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True):
        if num_blocks <= 0:
            raise ValueError("num_blocks must be > 0")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in self.blocks)
        self._cached: dict[BlockHash, Block] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def get_cached_block(self, block_hash: BlockHash) -> Block | None:
        return self._cached.get(block_hash)

    def allocate(self, num_blocks: int) -> list[Block]:
        """Hand out `num_blocks` free blocks, least recently freed first, evicting their cached
        hashes.
        """
        if num_blocks > len(self._free):
            raise RuntimeError(f"cannot allocate {num_blocks} blocks, {len(self._free)} free")
        out = []
        for _ in range(num_blocks):
            _, block = self._free.popitem(last=False)
            self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: Iterable[Block]) -> None:
        """Take a reference on blocks found by a prefix hit (reviving them if they were free)."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def free(self, blocks: Iterable[Block]) -> None:
        """Drop a reference; blocks reaching zero go to the MRU end of the free list.

        Callers pass a request's blocks in reverse order so that its last blocks are evicted first.
        """
        for block in blocks:
            assert block.ref_cnt > 0, f"double free of block {block.block_id}"
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = block

    def cache_block(self, block: Block, block_hash: BlockHash) -> None:
        """Publish a full block under its hash (first writer wins; a duplicate stays uncached)."""
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self._cached:
            return
        block.block_hash = block_hash
        self._cached[block_hash] = block

    def _evict(self, block: Block) -> None:
        if block.block_hash is not None:
            if self._cached.get(block.block_hash) is block:
                del self._cached[block.block_hash]
            block.block_hash = None
