"""--model-control-mode=poll: rescan the repositories, load new models, reload changed ones, forget removed ones.

It decides what changed; the lifecycle itself stays in the manager."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from nereid.core.errors import NereidError
from nereid.repository.layout import fingerprint, scan_repositories

if TYPE_CHECKING:
    from nereid.repository.manager import ModelRepositoryManager

__all__ = ["RepositoryPoller"]

log = logging.getLogger("nereid.repository")


class RepositoryPoller:
    def __init__(self, manager: ModelRepositoryManager) -> None:
        self._manager = manager
        self._task: asyncio.Task[None] | None = None

    async def poll_once(self) -> None:
        """Load new models, reload changed ones and unload removed ones. Loading on demand, a model nobody has
        used yet stays unloaded; a changed one reloads only if it is loaded."""
        manager = self._manager
        settings = manager.settings
        await manager.remote.refresh()  # an S3 repository that cannot be read skips this round, serving what it has
        sources = scan_repositories(settings.model_repositories, settings.model_config_name)
        for name in [n for n in manager.records if n not in sources]:
            log.info("poll: '%s' was removed from the repository", name)
            await manager.unload(name)
            # Gone from the repository, gone from the index and from routing, as Triton forgets it.
            manager.forget(name)
        for name, source in sources.items():
            record = manager.records.get(name)
            current = fingerprint(source.path)
            if record is not None and record.fingerprint == current:
                continue
            if settings.model_load_on_demand and (record is None or not record.serving):
                continue  # loaded when a request names it
            try:
                await manager.load(name, cause="poll")
            except NereidError as exc:
                log.error("poll: failed to load '%s': %s", name, exc.message)
            record = manager.records.get(name)
            if record is not None:
                record.fingerprint = current

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._poll_forever())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self._manager.settings.repository_poll_secs)
            try:
                await self.poll_once()
            except Exception:
                log.exception("repository poll failed")
