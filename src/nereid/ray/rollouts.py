"""Rollouts through the Ray ingress (docs/rollouts.md, "Through the Ray ingress"): each ingress runs a
RolloutController over the model replicas (`ReplicaVersions`, the VersionsView), chooses the version of every
request naming none before forwarding it, so that every replica serves the split the same way, and counts its
outcome. The ingresses (one per node) agree through the replica directory (`SharedRollouts`): a command or a gate
decision taken by one ingress is published there and adopted by the others."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from nereid.config.model_config import mc
from nereid.core.errors import NereidError
from nereid.ray.wire import unpack_error
from nereid.rollouts.controller import RolloutController
from nereid.rollouts.rollout import Rollout

__all__ = ["ReplicaVersions", "SharedRollouts", "SYNC_SECS"]

log = logging.getLogger("nereid.ray")

# How often an ingress asks the directory for the rollouts the other ingresses changed.
SYNC_SECS = 0.5


class _Replicas(Protocol):
    """What the view needs of the ingress's server: a call to every live replica, and the directory's handle."""

    directory: Any

    async def each_replica(self, what: str, *args: Any, node_ip: str = "") -> dict[str, tuple[str, Any]]: ...


class ReplicaVersions:
    """The model replicas as one repository for the ingress's rollouts. What the controller asks synchronously
    (ready versions, the default one, folders, parameters) comes from the replicas' last answers, asked again
    (`refresh`) before a rollout starts and after versions are loaded or retired; holding is forwarded to every
    replica (and kept in the directory for the replicas that start later), loading only where the model is."""

    def __init__(self, replicas: _Replicas) -> None:
        self._replicas = replicas
        self._known: dict[str, dict[str, Any]] = {}  # model -> the replicas' answers, merged
        self._held: dict[str, tuple[list[str], bool]] = {}
        self._pushing: set[asyncio.Task[None]] = set()

    async def refresh(self, model: str) -> None:
        answers = await self._replicas.each_replica("versions", model)
        found = [value for status, value in answers.values() if status == "ok"]
        holding = [value for value in found if value["ready"]]
        # Ready: on every replica that holds the model, so that a request naming it is served wherever it lands.
        ready = set(holding[0]["ready"]) if holding else set()
        for value in holding[1:]:
            ready &= set(value["ready"])
        defaults = [value["default"] for value in holding if value["default"] is not None]
        self._known[model] = {
            "ready": sorted(ready, key=int),
            "default": max(defaults, key=int) if defaults else None,
            "folders": sorted({v for value in found for v in value["folders"]}, key=int),
            "parameters": next((value["parameters"] for value in found if value["parameters"]), {}),
        }

    def ready_versions(self, model: str) -> list[str]:
        return list(self._known.get(model, {}).get("ready", []))

    def default_version(self, model: str) -> str | None:
        return self._known.get(model, {}).get("default")

    def parameters(self, model: str, version: str) -> Any:
        config = mc.ModelConfig()
        for key, value in self._known.get(model, {}).get("parameters", {}).items():
            config.parameters[key].string_value = value
        return config.parameters

    def in_repository(self, model: str, version: str) -> bool:
        return version in self._known.get(model, {}).get("folders", [])

    def hold(self, model: str, versions: list[str], pin: bool) -> None:
        """Held here at once; every replica (and the directory) is told in the background. `apply_held` tells them
        again and waits."""
        self.remember(model, versions, pin)
        task = asyncio.get_running_loop().create_task(self._push_quietly(model))
        self._pushing.add(task)
        task.add_done_callback(self._pushing.discard)

    def remember(self, model: str, versions: list[str], pin: bool) -> None:
        """Held here only: what another ingress holds already on the replicas."""
        self._held[model] = (list(versions), pin)

    async def apply_held(self, model: str) -> None:
        await self._push(model, apply=True)
        await self.refresh(model)

    async def close(self) -> None:
        for task in list(self._pushing):
            task.cancel()
        await asyncio.gather(*self._pushing, return_exceptions=True)

    async def _push_quietly(self, model: str) -> None:
        try:
            await self._push(model, apply=False)
        except NereidError as exc:
            log.warning("rollout of model '%s': holding versions on the replicas failed: %s", model, exc.message)

    async def _push(self, model: str, apply: bool) -> None:
        versions, pin = self._held.get(model, ([], False))  # the latest, whatever was held since the call
        try:
            await self._replicas.directory.hold.remote(model, versions, pin)
        except Exception as exc:  # replicas started later miss it; the live ones are told below
            log.warning("rollout of model '%s': the directory did not take its held versions: %s", model, exc)
        answers = await self._replicas.each_replica("hold", model, versions, pin, apply)
        for status, value in answers.values():
            if status == "error":
                raise unpack_error(value)


class SharedRollouts(RolloutController):
    """The ingress's controller, kept in step with the other ingresses' through the directory: every change made
    here (a command, or a gate's step, rollback or promotion) is published; a change published by another ingress
    is adopted (fresh windows at its step). Each ingress's gates judge its own window."""

    def __init__(self, versions: ReplicaVersions, directory: Any, state_file: str = "", **options: Any) -> None:
        super().__init__(versions, state_file, **options)
        self._view = versions
        self._directory = directory
        self._epoch = ""  # the directory's, at the last sync
        self._seen = 0  # the last generation seen of any rollout
        self._generations: dict[str, int] = {}  # model -> the generation this ingress's state of it follows
        self._sync_lock = asyncio.Lock()
        self._syncing: asyncio.Task[None] | None = None
        self._publishing: set[asyncio.Task[None]] = set()

    # -- life ------------------------------------------------------------------------------------------------------
    def start(self) -> None:
        super().start()
        self._syncing = asyncio.get_running_loop().create_task(self._sync_forever())

    async def close(self) -> None:
        tasks = [self._syncing, *self._publishing]
        for task in tasks:
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in tasks if t is not None), return_exceptions=True)
        await self._view.close()
        await super().close()

    async def _sync_forever(self) -> None:
        while True:
            try:
                await self.sync()
            except Exception as exc:  # the directory may be restarting elsewhere; the next round finds it
                log.debug("rollouts not synced with the directory: %s", exc)
            await asyncio.sleep(SYNC_SECS)

    # -- what changes here is published --------------------------------------------------------------------------
    async def begin(self, model: str, candidate: str, steps: str, sticky_key: str = "") -> Rollout:
        await self._sync_quietly()  # a command meets the latest state the other ingresses published
        await super().begin(model, candidate, steps, sticky_key)
        await self._publish_quietly(model)
        return self.get(model)

    async def act(self, model: str, action: str) -> Rollout:
        await self._sync_quietly()
        await super().act(model, action)
        await self._publish_quietly(model)
        return self.get(model)

    def judge(self) -> None:
        before = {r.model: _key(r) for r in self.all()}
        super().judge()
        for rollout in self.all():
            if before.get(rollout.model) != _key(rollout):
                task = asyncio.get_running_loop().create_task(self._publish_quietly(rollout.model))
                self._publishing.add(task)
                task.add_done_callback(self._publishing.discard)

    async def _publish_quietly(self, model: str) -> None:
        """Publish; without the directory (restarting elsewhere), the change holds here, and reaches the others
        when this ingress publishes its rollouts to the directory again."""
        try:
            await self._publish(model)
        except Exception as exc:
            log.warning("rollout of model '%s': its change did not reach the other ingresses: %s", model, exc)

    async def _sync_quietly(self) -> None:
        try:
            await self.sync()
        except Exception as exc:
            log.warning("rollouts: the other ingresses' changes could not be read from the directory: %s", exc)

    async def _publish(self, model: str) -> None:
        async with self._sync_lock:
            rollout = self.get(model)
            accepted, generation, data = await self._directory.publish_rollout.remote(
                model, rollout.to_json(), self._generations.get(model, 0)
            )
            self._generations[model] = generation
            if not accepted and data is not None and _json_key(data) != _key(rollout):
                # Another ingress changed it first: its change stands here too.
                log.info("rollout of model '%s': another ingress changed it first; its state is adopted", model)
                self._adopt(data)

    # -- what changes elsewhere is adopted -----------------------------------------------------------------------
    async def sync(self) -> None:
        """Adopt what the other ingresses published since the last sync; after the directory restarted, publish
        this ingress's rollouts to it again (each taken unless another ingress's is there first)."""
        async with self._sync_lock:
            epoch, published = await self._directory.rollouts_since.remote(self._seen)
            if epoch != self._epoch:
                # A directory met for the first time (this ingress has just started) or restarted: every
                # publication counts again, and the rollouts it does not know are published to it.
                self._epoch, self._seen, self._generations = epoch, 0, {}
                epoch, published = await self._directory.rollouts_since.remote(0)
                for rollout in self.all():
                    if rollout.model not in published:
                        accepted, generation, data = await self._directory.publish_rollout.remote(
                            rollout.model, rollout.to_json(), 0
                        )
                        self._generations[rollout.model] = generation
                        if not accepted and data is not None:
                            published[rollout.model] = (generation, data)
                            self._generations.pop(rollout.model)
            for model, (generation, data) in sorted(published.items(), key=lambda item: item[1][0]):
                self._seen = max(self._seen, generation)
                if generation <= self._generations.get(model, 0):
                    continue
                self._generations[model] = generation
                current = self._rollouts.get(model)
                if current is None or _key(current) != _json_key(data):
                    self._adopt(data)

    def _adopt(self, data: dict[str, Any]) -> None:
        now = self._clock()
        rollout = Rollout.from_json(data, now)
        del rollout.history[len(data.get("history", [])) :]  # from_json logs a restart that did not happen here
        rollout.step_started = float(data.get("step_started", now))
        self._rollouts[rollout.model] = self.routing[rollout.model] = rollout
        self._announce(rollout)
        # The ingress that made the change loads or retires versions on the replicas; this one tells them again
        # (a no-op where they match), so that a change it lost to (see _publish) is undone there too.
        self._settle(rollout)
        self._save()


def _key(rollout: Rollout) -> tuple[Any, ...]:
    started = rollout.history[0].at if rollout.history else 0.0
    return (rollout.primary, rollout.candidate, rollout.state.value, rollout.step, started)


def _json_key(data: dict[str, Any]) -> tuple[Any, ...]:
    history = data.get("history") or [{"at": 0.0}]
    return (data["primary"], data["candidate"], data["state"], int(data["step"]), history[0]["at"])
