"""The directory of live replicas: each replica reports its ID and node every heartbeat, and the ingress asks
which replicas exist (to address each of them) and which run on its own node (its metrics). It holds no state
that a restart would lose for long: the next heartbeats rebuild it.

It is also where the ingresses (one per node) agree on rollouts (docs/rollouts.md, "Through the Ray ingress"):
each rollout's latest state as the ingress that changed it published it, numbered, so that the others adopt it,
and the versions rollouts hold, which a replica that starts later holds too. A restarted directory has a new
`epoch`: the ingresses publish their rollouts to it again."""

from __future__ import annotations

import time
import uuid
from typing import Any

__all__ = ["NereidDirectory", "STALE_SECS", "NO_RELOAD_SECS"]

# A replica not heard from for this long is gone (its node died, or it was stopped).
STALE_SECS = 3.0
# A model a replica dropped (evicted, unloaded) is not replicated back onto it for this long: no thrashing.
NO_RELOAD_SECS = 600.0
# After a hot model was given one more replica, the next one waits this long (the new copy must load and take
# its share first).
REPLICATE_COOLDOWN_SECS = 10.0


class NereidDirectory:
    """The deployment's class (one replica, no CPU); `nereid.ray.app` wraps it with serve.deployment."""

    def __init__(self, replicate_queue_time_us: float = 0.0) -> None:
        self.seen: dict[str, tuple[str, float]] = {}  # replica ID -> (node IP, last heartbeat)
        self.models: dict[str, list[str]] = {}  # replica ID -> the models it holds or is loading
        self.queue_us: dict[str, dict[str, float]] = {}  # replica ID -> model -> mean queue time since its last beat
        self.dropped: dict[str, list[str]] = {}  # replica ID -> models it dropped within NO_RELOAD_SECS
        self.threshold = replicate_queue_time_us  # 0: hot models are not replicated
        self.replicated: dict[str, float] = {}  # model -> when it was last given one more replica
        self.epoch = uuid.uuid4().hex  # a restarted directory is told apart by this
        self.generation = 0  # the last number given to a rollout's publication
        self.rollouts: dict[str, tuple[int, dict[str, Any]]] = {}  # model -> (generation, Rollout.to_json())
        self.holds: dict[str, tuple[list[str], bool]] = {}  # model -> (versions held beside the policy's, pinned)

    def heartbeat(
        self,
        replica_id: str,
        node_ip: str,
        models: list[str],
        queue_us: dict[str, float] | None = None,
        dropped: list[str] | None = None,
    ) -> list[str]:
        """Record a replica's beat; the answer is a hot model this replica should load too (or nothing)."""
        now = time.monotonic()
        self.seen[replica_id] = (node_ip, now)
        self.models[replica_id] = models
        self.queue_us[replica_id] = queue_us or {}
        self.dropped[replica_id] = dropped or []
        hot = self._hot_model_for(replica_id, now)
        return [hot] if hot else []

    def _hot_model_for(self, replica_id: str, now: float) -> str:
        """A model whose every holder reports a queue time above the threshold, that this replica does not hold
        and has not dropped recently: Serve's router only spreads a model over the replicas that hold it."""
        if self.threshold <= 0:
            return ""
        live = self.replicas()
        mine = set(self.models.get(replica_id, ())) | set(self.dropped.get(replica_id, ()))
        candidates: list[tuple[float, str]] = []
        for model in {m for rid in live for m in self.models.get(rid, ())} - mine:
            if now - self.replicated.get(model, -REPLICATE_COOLDOWN_SECS) < REPLICATE_COOLDOWN_SECS:
                continue
            waits = [self.queue_us.get(rid, {}).get(model) for rid in live if model in self.models.get(rid, ())]
            if waits and all(w is not None and w > self.threshold for w in waits):
                candidates.append((min(w for w in waits if w is not None), model))
        if not candidates:
            return ""
        _, model = max(candidates)
        self.replicated[model] = now
        return model

    def holders(self, model: str) -> dict[str, str]:
        """The live replicas holding (or loading) `model`: replica ID -> node IP."""
        return {rid: node for rid, node in self.replicas().items() if model in self.models.get(rid, ())}

    def forget(self, replica_id: str) -> None:
        self.seen.pop(replica_id, None)
        self.models.pop(replica_id, None)
        self.queue_us.pop(replica_id, None)
        self.dropped.pop(replica_id, None)

    def replicas(self) -> dict[str, str]:
        """Live replicas: replica ID -> node IP."""
        now = time.monotonic()
        for replica_id, (_, last) in list(self.seen.items()):
            if now - last > STALE_SECS:
                self.forget(replica_id)
        return {replica_id: node for replica_id, (node, _) in self.seen.items()}

    # -- rollouts, shared by the ingresses ---------------------------------------------------------------------
    def publish_rollout(
        self, model: str, data: dict[str, Any], based_on: int
    ) -> tuple[bool, int, dict[str, Any] | None]:
        """An ingress's new state of a rollout, accepted when it changes the state that ingress last saw (the
        publication numbered `based_on`, 0 for none); otherwise refused with the current one, which it adopts: the
        first of two changes made at once wins. Answers (accepted, generation, the state now)."""
        current = self.rollouts.get(model)
        generation = current[0] if current is not None else 0
        if based_on != generation:
            return False, generation, current[1] if current is not None else None
        self.generation += 1
        self.rollouts[model] = (self.generation, data)
        return True, self.generation, data

    def rollouts_since(self, generation: int) -> tuple[str, dict[str, tuple[int, dict[str, Any]]]]:
        """This directory's epoch, and the rollouts published after `generation`."""
        return self.epoch, {model: entry for model, entry in self.rollouts.items() if entry[0] > generation}

    def hold(self, model: str, versions: list[str], pin: bool) -> None:
        if versions:
            self.holds[model] = (list(versions), pin)
        else:
            self.holds.pop(model, None)

    def rollout_holds(self) -> dict[str, tuple[list[str], bool]]:
        return dict(self.holds)
