"""The autoscaling policies: the replica deployment's, Serve's custom policy over the queue time that replicas
report (`record_autoscaling_stats`), and the ingress's, one replica per alive node. They only decide a replica
count; Serve applies the bounds and delays."""

from __future__ import annotations

import math
import time
from typing import Any

__all__ = ["OnePerNodePolicy", "QueueTimePolicy"]


class QueueTimePolicy:
    """One replica more while the replicas' mean queue time is above `target_queue_time_us`; one less once it has
    fallen below a quarter of that and no replica holds more than `idle_inflight` requests. Queue time is what a
    waiting request costs a client, which Serve's default (ongoing requests) cannot tell from a busy but keeping-up
    replica."""

    def __init__(self, target_queue_time_us: float = 5000.0, idle_inflight: float = 0.5) -> None:
        self.target = float(target_queue_time_us)
        self.idle_inflight = float(idle_inflight)

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        current = int(ctx.current_num_replicas)
        metrics = ctx.aggregated_metrics or {}
        queue = list((metrics.get("queue_time_us") or {}).values())
        inflight = list((metrics.get("inflight") or {}).values())
        if current == 0 or not queue:
            return ctx.target_num_replicas, {}
        mean_queue = sum(queue) / len(queue)
        if mean_queue > self.target:
            # Proportional, at most doubling per decision: a long queue gets more than one replica at once.
            return min(current * 2, max(current + 1, math.ceil(current * mean_queue / self.target))), {}
        if mean_queue < self.target / 4 and max(inflight or [0.0]) <= self.idle_inflight:
            return current - 1, {}
        return current, {}


class OnePerNodePolicy:
    """As many ingress replicas as the cluster has alive nodes: with at most one per node (its ports are the
    node's), a node that joins gets an ingress of its own and a node that is gone takes its ingress away. It runs
    in Serve's controller, which asks it every loop; the node count is read from Ray at most every
    `refresh_secs`."""

    def __init__(self, refresh_secs: float = 1.0) -> None:
        self.refresh_secs = float(refresh_secs)
        self._nodes = 0
        self._read_at = -math.inf

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        now = time.monotonic()
        if now - self._read_at >= self.refresh_secs:
            import ray

            try:
                self._nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
                self._read_at = now
            except Exception:  # the GCS is briefly unreachable: keep what the cluster had
                return ctx.target_num_replicas, {}
        return max(1, self._nodes), {}
