"""--model-control-mode=poll: rescan the repositories, load new models, reload changed ones, forget removed ones.

It decides what changed; the lifecycle itself stays with the owner, which hands down the `PollingCalls` it makes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from nereid.core.errors import NereidError
from nereid.core.settings import ServerSettings
from nereid.repository.layout import fingerprint, scan_repositories
from nereid.repository.records import ModelRecord

__all__ = ["PollingCalls", "RepositoryPoller"]

log = logging.getLogger("nereid.repository")


@dataclass(frozen=True, slots=True)
class PollingCalls:
    """The lifecycle operations a poll asks for; the owner hands them down. The poller reads `records` and writes
    only a record's `fingerprint` (the folder as it was when last polled)."""

    records: Mapping[str, ModelRecord]
    refresh: Callable[[], Awaitable[object]]  # bring the local copies of s3://, gs:// and as:// repositories up to date
    load: Callable[[str], Awaitable[None]]  # load or reload a model for the poll; raises NereidError
    unload: Callable[[str], Awaitable[None]]
    forget: Callable[[str], None]  # drop a model from the index and from routing


class RepositoryPoller:
    def __init__(self, settings: ServerSettings, calls: PollingCalls) -> None:
        self._settings = settings
        self._calls = calls
        self._task: asyncio.Task[None] | None = None

    async def poll_once(self) -> None:
        """Load new models, reload changed ones and unload removed ones. Loading on demand, a model nobody has
        used yet stays unloaded; a changed one reloads only if it is loaded."""
        calls = self._calls
        settings = self._settings
        try:
            await calls.refresh()
        except NereidError as exc:  # a remote repository that cannot be read: skip the round, serve what is loaded
            log.error("poll: %s; this round is skipped", exc.message)
            return
        sources = scan_repositories(settings.model_repositories, settings.model_config_name)
        for name in [n for n in calls.records if n not in sources]:
            log.info("poll: '%s' was removed from the repository", name)
            await calls.unload(name)
            # Gone from the repository, gone from the index and from routing, as Triton forgets it.
            calls.forget(name)
        for name, source in sources.items():
            record = calls.records.get(name)
            current = fingerprint(source.path)
            if record is not None and record.fingerprint == current:
                continue
            if settings.model_load_on_demand and (record is None or not record.serving):
                continue  # loaded when a request names it
            try:
                await calls.load(name)
            except NereidError as exc:
                log.error("poll: failed to load '%s': %s", name, exc.message)
            record = calls.records.get(name)
            if record is not None:
                record.fingerprint = current

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._poll_forever())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self._settings.repository_poll_secs)
            try:
                await self.poll_once()
            except Exception:
                log.exception("repository poll failed")
