"""What the repository remembers of one model name: its serving and retired versions, its failure and its lock.

Plain data: the lifecycle (manager), routing and residency modules change it; nothing here acts on a model."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from nereid.repository.model_version import ModelVersion

__all__ = ["ModelRecord"]


@dataclass
class ModelRecord:
    name: str
    serving: dict[int, ModelVersion] = field(default_factory=dict)
    # Versions that are not serving, kept for the repository index (failed or unloaded).
    retired: dict[int, ModelVersion | str] = field(default_factory=dict)
    reason: str = ""  # a failure before any version could be named (a bad config)
    fingerprint: str = ""
    # The folder's files but its config, as the serving versions loaded them: a load that finds them unchanged and
    # a config that differs in instance_group only updates the instances in place.
    content: str = ""
    # The folder's fingerprint, the config prepared from its files (serialized) and the versions chosen, as of
    # the last prepare: a load on demand of an unchanged folder takes them back.
    prepared: tuple[str, bytes, list[int]] | None = None
    override_dir: Path | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Loaded because someone asked for it (not only because an ensemble needs it): unload_dependents keeps it.
    explicit: bool = False
    # A load is running (the index shows LOADING), and its versions so far.
    loading: bool = False
    # Failures of loads that were not asked for at start-up or explicitly (on demand) leave readiness alone.
    lazy: bool = False
