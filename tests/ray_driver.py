"""The Ray driver of the Ray tests, in a process of its own: it starts the loopback cluster, deploys
`nereid ray serve`'s application and answers the test's questions (placement, replica count, the directory)
and orders (add a node, kill one) as JSON lines, so the test process never holds a Ray connection (a driver's
threads beside the test client's gevent have crashed the test process). It stops the cluster when told, or
when its standard input closes (the test process went away)."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
import traceback
from typing import Any

import ray
from ray import serve

from nereid.ray.cli import APP_NAME, deploy, ingress_addresses, parse_ray_serve_args
from nereid.ray.replica import replica_address
from tests.ray_cluster import LoopbackCluster, kill_node

PREFIX = "@@ "  # marks this driver's answers on stdout (Ray may print there too)


def read_answer(driver: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    """The driver's next answer line, read by the test that started it (other lines on its stdout are Ray's own)."""
    assert driver.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([driver.stdout], [], [], max(deadline - time.monotonic(), 0.01))
        if not ready:
            break
        line = driver.stdout.readline()
        if not line:
            raise AssertionError(f"the Ray driver exited ({driver.poll()}); see its log")
        if line.startswith(PREFIX):
            return json.loads(line[len(PREFIX) :])  # type: ignore[no-any-return]
    raise AssertionError(f"the Ray driver did not answer within {timeout:g} s")


def _placement() -> dict[str, Any]:
    replicas = serve.get_deployment_handle("NereidReplica", APP_NAME)
    directory = serve.get_deployment_handle("NereidDirectory", APP_NAME)
    found: dict[str, Any] = {}
    for replica_id in directory.replicas.remote().result(timeout_s=30):
        handle = replicas.options(multiplexed_model_id=replica_address(replica_id))
        for _ in range(4):  # Serve may route an addressed call elsewhere while its replica is busy
            try:
                who, status, value = handle.call.remote("where").result(timeout_s=30)
            except Exception:  # a replica that has just died is not placed anywhere
                break
            if who == replica_id and status == "ok":
                found[who] = value
                break
    return found


def main() -> int:
    setup = json.loads(sys.stdin.readline())
    loopback = LoopbackCluster(tuple(setup["nodes"]), tmp=setup["tmp"], owns_tmp=False)
    try:
        loopback.start()
        # The deployment's flags come with the setup, or on the next line (the test measures footprints meanwhile).
        args = setup["args"] if "args" in setup else json.loads(sys.stdin.readline())["args"]
        _, options = parse_ray_serve_args(args)
        ingress = deploy(options)
        print(PREFIX + json.dumps({"ingress": ingress_addresses(ingress, len(setup["nodes"]))}), flush=True)
        for line in sys.stdin:
            order = json.loads(line)
            try:
                op = order["op"]
                if op == "stop":
                    break
                if op == "placement":
                    answer: Any = _placement()
                elif op == "holders":
                    directory = serve.get_deployment_handle("NereidDirectory", APP_NAME)
                    answer = directory.holders.remote(order["model"]).result(timeout_s=30)
                elif op == "replicas":
                    status = serve.status().applications[APP_NAME].deployments["NereidReplica"]
                    answer = int(status.replica_states.get("RUNNING", 0))
                elif op == "ingress":
                    status = serve.status().applications[APP_NAME].deployments["NereidIngress"]
                    alive = sum(1 for node in ray.nodes() if node["Alive"])
                    answer = {"running": int(status.replica_states.get("RUNNING", 0)), "nodes": alive}
                elif op == "add_node":
                    loopback.add(order["node"])
                    answer = True
                elif op == "kill":
                    assert loopback.cluster is not None
                    kill_node(loopback.cluster, loopback.workers[order["node"]])
                    answer = True
                else:
                    raise ValueError(f"unknown order {op!r}")
                print(PREFIX + json.dumps({"ok": answer}), flush=True)
            except Exception as exc:
                print(PREFIX + json.dumps({"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}), flush=True)
    finally:
        loopback.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
