"""The Ray ingresses' rollouts without Ray: two ingresses' controllers over one replica directory (its class, called
in process) and fake replicas. A command given to one ingress, and a gate's decision taken by one, reach the
other; two changes made at once: the first one wins on both; the replicas hold the rollout's versions."""

from __future__ import annotations

import asyncio
from typing import Any

from nereid.ray.directory import NereidDirectory
from nereid.ray.rollouts import ReplicaVersions, SharedRollouts


class _Remote:
    def __init__(self, method: Any) -> None:
        self.method = method

    async def remote(self, *args: Any) -> Any:
        await asyncio.sleep(0)
        return self.method(*args)


class _Directory:
    """NereidDirectory's methods as a deployment handle's (`handle.method.remote(...)`, awaited)."""

    def __init__(self, directory: NereidDirectory) -> None:
        self.directory = directory

    def __getattr__(self, name: str) -> _Remote:
        return _Remote(getattr(self.directory, name))


class _Replicas:
    """Two replicas holding `m` (versions 1 and 2 ready), recording the holds they were told."""

    def __init__(self, directory: _Directory) -> None:
        self.directory = directory
        self.holds: list[tuple[str, list[str], bool, bool]] = []

    async def each_replica(self, what: str, *args: Any, node_ip: str = "") -> dict[str, tuple[str, Any]]:
        if what == "hold":
            self.holds.append(args)
        ready = {"ready": ["1", "2"], "default": "2", "folders": ["1", "2"], "parameters": {}}
        return {rid: ("ok", ready if what == "versions" else ready["ready"]) for rid in ("r1", "r2")}


def _ingress(directory: _Directory) -> tuple[SharedRollouts, _Replicas]:
    replicas = _Replicas(directory)
    return SharedRollouts(ReplicaVersions(replicas), directory), replicas


async def _two_ingresses() -> tuple[SharedRollouts, SharedRollouts, _Replicas, _Replicas, NereidDirectory]:
    """Two ingresses over one directory; each one's view of the replicas (the same two replicas)."""
    shared = NereidDirectory()
    directory = _Directory(shared)
    (a, seen_by_a), (b, seen_by_b) = _ingress(directory), _ingress(directory)
    for ingress in (a, b):
        ingress.restore()
        await ingress.sync()
        await ingress._view.refresh("m")
    return a, b, seen_by_a, seen_by_b, shared


def test_a_rollout_started_on_one_ingress_runs_on_the_other_and_its_versions_are_held_on_the_replicas() -> None:
    async def run() -> None:
        a, b, replicas, _, shared = await _two_ingresses()
        await a.begin("m", "1", "canary=20%/60s:10")  # version 2 is the default: version 1 is the candidate
        await b.sync()
        assert b.status("m")["state"] == "running" and (b.get("m").primary, b.get("m").candidate) == ("2", "1")
        assert b.get("m").history[0].at == a.get("m").history[0].at  # the same rollout, not a new one
        assert b.routing["m"].split is not None  # b splits its requests too
        await asyncio.sleep(0.01)
        assert shared.rollout_holds() == {"m": (["2", "1"], True)}  # for the replicas that start later
        assert ("m", ["2", "1"], True, False) in replicas.holds
        # A command on the other ingress comes back to the first.
        await b.act("m", "pause")
        await a.sync()
        assert a.status("m")["state"] == "paused"
        await a.act("m", "resume")
        await b.sync()
        assert b.status("m")["state"] == "running"

    asyncio.run(run())


def test_a_gate_decision_on_one_ingress_is_pushed_to_the_other_and_the_first_change_wins() -> None:
    async def run() -> None:
        a, b, _, told_by_b, _ = await _two_ingresses()
        await a.begin("m", "1", "canary=20%/60s:10")
        await b.sync()
        rollout = a.get("m")
        for i in range(20):
            rollout.record("1", 1_000_000, failed=i % 2 == 0)
            rollout.record("2", 1_000_000, failed=False)
        a.judge()  # a's own window fails the gate
        assert a.status("m")["state"] == "rolled_back"
        await asyncio.gather(*a._publishing)
        await b.sync()
        assert b.status("m")["state"] == "rolled_back" and "error rate" in b.status("m")["reason"]
        assert b.routing["m"].route(None).version == "2"  # every request to the primary, on both
        # Two changes at once (b promotes while a aborts, each before seeing the other's): the first stands.
        await a.begin("m", "1", "canary=20%/60s:10")
        await b.sync()
        a.get("m").abort(a._clock())
        b.get("m").promote(b._clock())
        await a._publish("m")
        await b._publish("m")  # refused: b adopts a's
        assert a.status("m")["state"] == b.status("m")["state"] == "aborted"
        await asyncio.sleep(0.01)
        assert told_by_b.holds[-1][:2] == ("m", ["2"])  # what b held for its promotion is let go on the replicas

    asyncio.run(run())


def test_an_ingress_that_starts_later_or_a_restarted_directory_catches_up() -> None:
    async def run() -> None:
        a, _, _, _, shared = await _two_ingresses()
        await a.begin("m", "1", "canary=20%/60s:10")
        late, _ = _ingress(_Directory(shared))
        late.restore()
        await late.sync()
        assert late.status("m")["state"] == "running"
        # The directory restarts empty: a publishes its rollouts to it again, and a new ingress learns them there.
        fresh = NereidDirectory()
        a._directory = _Directory(fresh)
        await a.sync()
        newcomer, _ = _ingress(_Directory(fresh))
        await newcomer.sync()
        assert newcomer.status("m")["candidate"] == "1"

    asyncio.run(run())


class _Unreachable:
    def __getattr__(self, name: str) -> _Remote:
        def fail(*args: Any) -> Any:
            raise ConnectionError("the directory is restarting")

        return _Remote(fail)


def test_without_the_directory_an_ingress_still_runs_its_rollouts_and_publishes_them_when_it_is_back() -> None:
    async def run() -> None:
        lonely, _ = _ingress(_Unreachable())  # type: ignore[arg-type]
        await lonely._view.refresh("m")
        await lonely.begin("m", "1", "canary=20%/60s:10")
        await lonely.act("m", "pause")
        assert lonely.status("m")["state"] == "paused"
        back = NereidDirectory()
        lonely._directory = _Directory(back)
        await lonely.sync()
        other, _ = _ingress(_Directory(back))
        await other.sync()
        assert other.status("m")["state"] == "paused"

    asyncio.run(run())
