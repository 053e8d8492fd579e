"""Response cache implementations: an in-process LRU bounded in bytes, and Redis (as Triton's redis cache)."""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass
from typing import Protocol

from nereid.core.errors import NereidError

__all__ = ["ResponseCache", "LocalCache", "RedisCache", "CacheCounters", "create_cache", "parse_cache_config"]

log = logging.getLogger("nereid.cache")


@dataclass
class CacheCounters:
    lookups: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    entries: int = 0
    bytes_used: int = 0
    capacity: int = 0


class ResponseCache(Protocol):
    counters: CacheCounters

    async def get(self, key: bytes) -> bytes | None: ...

    async def put(self, key: bytes, value: bytes) -> None: ...

    async def close(self) -> None: ...


class LocalCache:
    """LRU over byte strings; an entry larger than the whole cache is simply not stored."""

    def __init__(self, size: int) -> None:
        self._entries: collections.OrderedDict[bytes, bytes] = collections.OrderedDict()
        self.counters = CacheCounters(capacity=size)

    async def get(self, key: bytes) -> bytes | None:
        counters = self.counters
        counters.lookups += 1
        value = self._entries.get(key)
        if value is None:
            counters.misses += 1
            return None
        self._entries.move_to_end(key)
        counters.hits += 1
        return value

    async def put(self, key: bytes, value: bytes) -> None:
        counters = self.counters
        size = len(key) + len(value)
        if size > counters.capacity or key in self._entries:
            return
        while counters.bytes_used + size > counters.capacity and self._entries:
            old_key, old_value = self._entries.popitem(last=False)
            counters.bytes_used -= len(old_key) + len(old_value)
            counters.evictions += 1
        self._entries[key] = value
        counters.bytes_used += size
        counters.entries = len(self._entries)

    async def close(self) -> None:
        self._entries.clear()


class RedisCache:
    """Entries live in Redis under `nereid:<key hex>`; Redis' own maxmemory policy bounds them."""

    def __init__(self, options: dict[str, str]) -> None:
        try:
            import redis.asyncio as redis
        except ImportError:
            raise NereidError.unavailable("the redis cache needs the 'redis' package: pip install nereid[redis]") from None
        self._client = redis.Redis(
            host=options.get("host", "localhost"),
            port=int(options.get("port", 6379)),
            username=options.get("user") or None,
            password=options.get("password") or None,
            db=int(options.get("db", 0)),
            socket_timeout=float(options.get("timeout_ms", 5000)) / 1000,
        )
        self._ttl = int(options["ttl"]) if options.get("ttl") else None
        self.counters = CacheCounters()

    async def get(self, key: bytes) -> bytes | None:
        self.counters.lookups += 1
        try:
            value = await self._client.get(b"nereid:" + key.hex().encode())
        except Exception as exc:  # a cache outage must degrade to misses, never fail inference
            log.warning("redis cache lookup failed: %s", exc)
            value = None
        if value is None:
            self.counters.misses += 1
            return None
        self.counters.hits += 1
        return value if isinstance(value, bytes) else str(value).encode()

    async def put(self, key: bytes, value: bytes) -> None:
        try:
            await self._client.set(b"nereid:" + key.hex().encode(), value, ex=self._ttl)
            self.counters.entries += 1
        except Exception as exc:
            log.warning("redis cache insert failed: %s", exc)

    async def close(self) -> None:
        await self._client.aclose()


def parse_cache_config(values: list[str]) -> tuple[str, dict[str, str]] | None:
    """Triton's `--cache-config <name>,<key>=<value>` flags (repeatable) -> (name, options)."""
    name = ""
    options: dict[str, str] = {}
    for value in values:
        head, _, rest = value.partition(",")
        if not rest or "=" not in rest:
            raise ValueError(f"--cache-config expects <cache>,<key>=<value>, got '{value}'")
        if name and head != name:
            raise ValueError(f"only one cache can be configured, got '{name}' and '{head}'")
        name = head
        key, _, option = rest.partition("=")
        options[key] = option
    if not name:
        return None
    if name not in ("local", "redis"):
        raise ValueError(f"unknown cache '{name}': expected 'local' or 'redis'")
    if name == "local":
        if "size" not in options:
            raise ValueError("--cache-config local needs size=<bytes>")
        int(options["size"])
    return name, options


def create_cache(name: str, options: dict[str, str]) -> ResponseCache:
    if name == "local":
        return LocalCache(int(options["size"]))
    return RedisCache(options)


