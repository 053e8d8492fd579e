"""The model repositories of one server that live in object stores (s3://, gs://, as://): the local copy of each,
brought up to date together before start-up, each poll and each explicit load. It never reads the environment."""

from __future__ import annotations

import asyncio

from nereid.core.settings import ServerSettings
from nereid.repository.azure import AzureSync
from nereid.repository.gcs import GcsSync
from nereid.repository.remote_copy import RemoteCopy
from nereid.repository.s3 import S3Sync

__all__ = ["RemoteRepositories"]


class RemoteRepositories:
    """`refresh` brings every local copy up to date, one refresh at a time; the first store that cannot be read
    raises NereidError (start-up fails on it; a poll skips its round and serves what it has)."""

    def __init__(self, settings: ServerSettings) -> None:
        self._copies: list[RemoteCopy] = [
            *(S3Sync(r) for r in settings.s3_repositories),
            *(GcsSync(r) for r in settings.gcs_repositories),
            *(AzureSync(r) for r in settings.azure_repositories),
        ]
        self._lock = asyncio.Lock()

    def __bool__(self) -> bool:
        return bool(self._copies)

    async def refresh(self) -> bool:
        if not self._copies:
            return False
        async with self._lock:
            changed = False
            for copy in self._copies:
                changed |= await asyncio.to_thread(copy.sync)
            return changed
