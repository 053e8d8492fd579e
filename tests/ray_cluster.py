"""A real multi-node Ray cluster on loopback addresses for the Ray tests and benchmarks: every node and the driver
pinned to 127.0.0.x (never the machine's other addresses), nodes added one at a time, Ray's files under a short
temporary folder, and every process it started gone after `stop`, also when a test failed."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from dataclasses import dataclass, field
from typing import Any

import psutil
import ray
from ray.cluster_utils import Cluster

__all__ = ["LoopbackCluster", "free_port_on", "kill_node"]

# Ray reads these in every process of the cluster: metrics for the autoscaler twice a second instead of every 10 s,
# and no usage reporting.
_RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "0.5",
    "RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "0.5",
}
# A dead node noticed in about two seconds instead of fifteen.
_SYSTEM_CONFIG = {"health_check_period_ms": 500, "health_check_failure_threshold": 4, "health_check_timeout_ms": 500}


def free_port_on(addresses: tuple[str, ...]) -> int:
    """A TCP port free on every one of `addresses`."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((addresses[0], 0))
            port = probe.getsockname()[1]
        try:
            for address in addresses:
                with socket.socket() as other:
                    other.bind((address, port))
            return port
        except OSError:
            continue
    raise RuntimeError(f"no port free on every one of {addresses}")


def kill_node(cluster: Cluster, node: Any) -> None:
    """A machine lost at once: the node's Ray daemons and every worker process under its raylet (the replicas on
    it) are SIGKILLed together; Cluster.remove_node alone leaves the workers to notice their raylet has gone."""
    raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
    workers = raylet.children(recursive=True)
    for process in workers:
        process.kill()
    cluster.remove_node(node, allow_graceful=False)
    psutil.wait_procs(workers, timeout=10)


@dataclass
class LoopbackCluster:
    """Head on nodes[0], a worker on each other address; `start` connects this process as the driver."""

    nodes: tuple[str, ...] = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
    cpus_per_node: int = 1
    tmp: str = ""
    cluster: Cluster | None = None
    workers: dict[str, Any] = field(default_factory=dict)
    owns_tmp: bool = True  # False: the folder is the caller's, left in place by stop()
    _saved: dict[str, str | None] = field(default_factory=dict)

    def start(self) -> LoopbackCluster:
        if not self.tmp:
            self.tmp = tempfile.mkdtemp(prefix="nrray", dir="/tmp")  # short: Ray's socket paths live under it
        os.makedirs(f"{self.tmp}/ray", exist_ok=True)
        self._saved = {key: os.environ.get(key) for key in [*_RAY_ENV, "RAY_TMPDIR"]}
        os.environ.update(_RAY_ENV, RAY_TMPDIR=self.tmp)
        node_args = self._node_args()
        head = self.nodes[0]
        self.cluster = Cluster(initialize_head=True, head_node_args={**node_args, "node_ip_address": head,
                                                                     "_system_config": _SYSTEM_CONFIG})  # fmt: skip
        for address in self.nodes[1:]:  # one at a time: each joins before the next starts
            self.workers[address] = self.cluster.add_node(**node_args, node_ip_address=address)
        ray.init(address=self.cluster.address, _node_ip_address=head, log_to_driver=False)
        return self

    def _node_args(self) -> dict[str, Any]:
        return {"num_cpus": self.cpus_per_node, "object_store_memory": 80 << 20, "include_dashboard": False}

    def add(self, address: str) -> None:
        """A node joining the running cluster (after the deployment, say)."""
        assert self.cluster is not None
        self.workers[address] = self.cluster.add_node(**self._node_args(), node_ip_address=address)

    @property
    def data_dir(self) -> str:
        return self.tmp

    def stop(self) -> None:
        try:
            ray.shutdown()
        finally:
            if self.cluster is not None:
                try:
                    self.cluster.shutdown()
                except ValueError:
                    # A background thread of Serve's handles reconnected the driver after ray.shutdown(); the
                    # refusal disconnected it again, and the second try removes the nodes.
                    ray.shutdown()
                    self.cluster.shutdown()
            # Last resort: a process of this cluster (its session folder is under tmp) still alive is killed.
            for process in psutil.process_iter(["pid", "cmdline"]):
                try:
                    if self.tmp and any(self.tmp in part for part in process.info["cmdline"] or []):
                        process.kill()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
            for key, value in self._saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            if self.owns_tmp:
                shutil.rmtree(self.tmp, ignore_errors=True)
