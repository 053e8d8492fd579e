"""The directory of live replicas: each replica reports its ID and node every heartbeat, and the ingress asks
which replicas exist (to address each of them) and which run on its own node (its metrics). It holds no state
that a restart would lose for long: the next heartbeats rebuild it."""

from __future__ import annotations

import time

__all__ = ["NereidDirectory", "STALE_SECS"]

# A replica not heard from for this long is gone (its node died, or it was stopped).
STALE_SECS = 3.0


class NereidDirectory:
    """The deployment's class (one replica, no CPU); `nereid.ray.app` wraps it with serve.deployment."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[str, float]] = {}  # replica ID -> (node IP, last heartbeat)
        self.models: dict[str, list[str]] = {}  # replica ID -> the models it holds or is loading

    def heartbeat(self, replica_id: str, node_ip: str, models: list[str]) -> None:
        self.seen[replica_id] = (node_ip, time.monotonic())
        self.models[replica_id] = models

    def holders(self, model: str) -> dict[str, str]:
        """The live replicas holding (or loading) `model`: replica ID -> node IP."""
        return {rid: node for rid, node in self.replicas().items() if model in self.models.get(rid, ())}

    def forget(self, replica_id: str) -> None:
        self.seen.pop(replica_id, None)
        self.models.pop(replica_id, None)

    def replicas(self) -> dict[str, str]:
        """Live replicas: replica ID -> node IP."""
        now = time.monotonic()
        for replica_id, (_, last) in list(self.seen.items()):
            if now - last > STALE_SECS:
                self.forget(replica_id)
        return {replica_id: node for replica_id, (node, _) in self.seen.items()}
