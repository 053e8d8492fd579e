"""The paged KV cache's bookkeeping: a fixed pool of blocks of `block_size` token positions, handed to sequences
as block tables, with full blocks shared between sequences through a prefix cache (keyed by a hash of the
parent block's key and the block's token ids) and evicted least recently used when the pool needs room.

Pure bookkeeping: no torch, no requests. The model owns the memory; the engine owns the block tables.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque

__all__ = ["BlockManager", "block_keys"]

_ROOT = b"nereid-kv-root"


def block_keys(token_ids: list[int], block_size: int, count: int, parent: bytes = _ROOT) -> list[bytes]:
    """The keys of the first `count` full blocks of a token sequence. A key digests its parent's key and its
    own token ids, so equal keys mean equal whole prefixes (SHA-256: one user cannot forge another's key)."""
    keys = []
    for index in range(count):
        chunk = array("q", token_ids[index * block_size : (index + 1) * block_size]).tobytes()
        parent = hashlib.sha256(parent + chunk).digest()
        keys.append(parent)
    return keys


class BlockManager:
    """Reference-counted blocks. A block is in exactly one of three places: in use (refcount > 0), cached and
    unreferenced (reusable on a prefix hit, evictable, in LRU order), or free (holding nothing anyone can
    find). Allocation takes free blocks first (lowest never-used id next, so blocks below `high_water` are
    exactly those ever handed out), so cached prefixes live as long as the pool allows."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"the KV pool needs at least one block of at least one token (got {num_blocks} x {block_size})")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        # Free blocks, reused last-in first-out: recently used memory is reused before untouched memory is, so a
        # large pool costs resident memory only as far as it is needed (blocks never used are never touched).
        self._free: deque[int] = deque(reversed(range(num_blocks)))
        self._refcount = [0] * num_blocks
        self._key_of: list[bytes | None] = [None] * num_blocks
        self._block_of: dict[bytes, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced; oldest first
        self.high_water = 0  # blocks 0..high_water-1 have been handed out at least once
        # Prefix cache figures in tokens, as vLLM counts them.
        self.prefix_queries = 0
        self.prefix_hits = 0

    # -- figures ---------------------------------------------------------------------------------
    @property
    def num_available(self) -> int:
        """Blocks an allocation can get now: free ones plus cached ones nobody references."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_available

    @property
    def num_cached(self) -> int:
        return len(self._block_of)

    def refcount(self, block: int) -> int:
        return self._refcount[block]

    # -- allocation ------------------------------------------------------------------------------
    def allocate(self, count: int) -> list[int] | None:
        """`count` fresh blocks (refcount 1), or None (and nothing taken) when the pool cannot give them."""
        if count > self.num_available:
            return None
        blocks = []
        for _ in range(count):
            if self._free:
                block = self._free.pop()
            else:
                block, _ = self._evictable.popitem(last=False)  # the least recently used cached block
                key = self._key_of[block]
                if key is not None:
                    del self._block_of[key]
                    self._key_of[block] = None
            self._refcount[block] = 1
            blocks.append(block)
            if block >= self.high_water:
                self.high_water = block + 1
        return blocks

    def free(self, blocks: list[int]) -> None:
        """Drop one reference to each block. Cached blocks stay findable (most recently used last); the last
        block of a table is freed first so that a prefix's head outlives its tail in the LRU order."""
        for block in reversed(blocks):
            count = self._refcount[block] - 1
            if count < 0:
                raise RuntimeError(f"KV block {block} freed more often than it was taken")
            self._refcount[block] = count
            if count == 0:
                if self._key_of[block] is not None:
                    self._evictable[block] = None
                else:
                    self._free.append(block)

    # -- the prefix cache ------------------------------------------------------------------------
    def match_prefix(self, token_ids: list[int]) -> tuple[list[int], list[bytes]]:
        """The cached blocks holding the longest cached prefix of `token_ids`, each now referenced once more,
        and the keys of those blocks. At least the last token is left out, so that it is computed and its
        logits exist."""
        if not self.enable_prefix_caching:
            return [], []
        full = (len(token_ids) - 1) // self.block_size
        self.prefix_queries += len(token_ids)
        if full <= 0:
            return [], []
        blocks: list[int] = []
        keys: list[bytes] = []
        parent = _ROOT
        for index in range(full):
            key = block_keys(token_ids[index * self.block_size : (index + 1) * self.block_size], self.block_size, 1, parent)[0]
            block = self._block_of.get(key)
            if block is None:
                break
            blocks.append(block)
            keys.append(key)
            parent = key
        for block in blocks:
            if self._refcount[block] == 0:
                del self._evictable[block]
            self._refcount[block] += 1
        self.prefix_hits += len(blocks) * self.block_size
        return blocks, keys

    def cache_block(self, block: int, key: bytes) -> None:
        """Make a full, computed block findable by its key. If an equal block is already cached (two sequences
        computed the same prefix at once), this one stays private and is simply freed later."""
        if not self.enable_prefix_caching or self._key_of[block] is not None or key in self._block_of:
            return
        self._key_of[block] = key
        self._block_of[key] = block

    def reset_prefix_cache(self) -> None:
        """Forget every cached block nobody references (used blocks keep their keys until freed)."""
        for block in list(self._evictable):
            key = self._key_of[block]
            if key is not None:
                del self._block_of[key]
                self._key_of[block] = None
            self._free.append(block)
        self._evictable.clear()
