"""Rollouts inside a real in-process Server: the version a request naming none gets, windows filled from real
answers, shadow copies compared and never answered to the client, gates acting, and state across a restart."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from nereid.core.settings import ServerSettings
from nereid.core.types import InferenceRequest, InputTensor, RequestedOutput
from nereid.rollouts.rollout import RolloutState
from nereid.server import Server
from tests.unit.rollouts import versioned_backend
from tests.unit.rollouts.versioned_backend import versioned_repository

T = TypeVar("T")


@pytest.fixture()
def repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return versioned_repository(tmp_path, monkeypatch, fail_every_2=5)




def _run(root: Path, body: Callable[[Server], Awaitable[T]], state_file: str = "") -> T:
    async def main() -> T:
        server = Server(ServerSettings(model_repositories=[root], exit_on_error=False, rollout_state_file=state_file))
        await server.start()
        try:
            return await body(server)
        finally:
            await server.stop()

    return asyncio.run(main())


def _request(user: str | None = None, version: str = "") -> InferenceRequest:
    parameters = {"user": user} if user is not None else {}
    return InferenceRequest("m", version, [InputTensor("IN", "FP32", (1, 1), np.zeros((1, 1), np.float32))], parameters=parameters)


async def _answered_by(server: Server, request: InferenceRequest) -> str:
    """Which version answered: its OUT is IN + version (an error: the failing version 2)."""
    response = await server.infer(request, raise_error=False)
    return "2" if response.error is not None else str(int(response.outputs[0].data[0, 0]))


def test_without_a_rollout_a_request_naming_no_version_gets_tritons_latest(repository: Path) -> None:
    async def body(server: Server) -> set[str]:
        return {await _answered_by(server, _request()) for _ in range(10)}

    assert _run(repository, body) == {"2"}


def test_a_canary_splits_requests_and_a_failing_candidate_is_rolled_back_with_bounded_failures(repository: Path) -> None:
    async def body(server: Server) -> tuple[dict[str, int], int, RolloutState, str, set[str]]:
        await server.rollouts.begin("m", "2", "canary=20%/60s:20")
        seen: dict[str, int] = {"1": 0, "2": 0}
        failures = 0
        while server.rollouts.get("m").open:
            response = await server.infer(_request(), raise_error=False)
            failures += response.error is not None
            seen["2" if response.error is not None else str(int(response.outputs[0].data[0, 0]))] += 1
            server.rollouts.judge()
        rollout = server.rollouts.get("m")
        after = {await _answered_by(server, _request()) for _ in range(20)}
        return seen, failures, rollout.state, rollout.reason, after

    seen, failures, state, reason, after = _run(repository, body)
    assert state is RolloutState.ROLLED_BACK and "error rate" in reason
    total = seen["1"] + seen["2"]
    assert 0.15 <= seen["2"] / total <= 0.25  # the canary's share
    assert failures <= 0.2 * seen["2"] + 1  # users saw only the failures of the canary's share
    assert after == {"1"}  # all traffic on the primary from the next request, although version 2 is the newest


def test_a_shadow_copy_never_answers_the_client_and_its_answers_are_compared(repository: Path) -> None:
    async def body(server: Server) -> tuple[set[str], dict[str, float | int]]:
        await server.rollouts.begin("m", "2", "shadow=100%/60s:1000")
        answered = {await _answered_by(server, _request()) for _ in range(50)}
        for _ in range(100):  # the comparisons reach the loop from the comparator's thread
            await asyncio.sleep(0.01)
            if server.rollouts.get("m").windows["2"].compared >= 30:
                break
        return answered, server.rollouts.status("m")["versions"]["2"]

    answered, candidate = _run(repository, body)
    assert answered == {"1"}  # the client gets the primary's answer, never the failing candidate's error
    assert candidate["requests"] == 50 and candidate["errors"] == 10
    assert candidate["shadow_comparisons"] >= 30
    assert candidate["divergence"] == pytest.approx(0.5)  # 2 against 1: a relative difference of a half


def test_a_sticky_user_meets_one_version_and_a_named_version_is_always_served(repository: Path) -> None:
    async def body(server: Server) -> tuple[dict[str, set[str]], set[str]]:
        await server.rollouts.begin("m", "2", "canary=50%/60s:100000", sticky_key="user")
        users: dict[str, set[str]] = {}
        for _ in range(4):
            for i in range(20):
                version = await _answered_by(server, _request(user=f"user-{i}"))
                users.setdefault(f"user-{i}", set()).add(version)
        named = {await _answered_by(server, _request(version="1")) for _ in range(10)}
        return users, named

    users, named = _run(repository, body)
    assert all(len(versions) == 1 for versions in users.values())
    assert {next(iter(v)) for v in users.values()} == {"1", "2"}
    assert named == {"1"}


def test_a_rollout_resumes_its_step_after_a_restart_and_a_rollback_survives_one(repository: Path, tmp_path: Path) -> None:
    state = str(tmp_path / "rollouts.json")

    async def start(server: Server) -> None:
        await server.rollouts.begin("m", "2", "canary=10%/60s:1000,canary=50%/60s")

    async def resumed(server: Server) -> tuple[str, int]:
        rollout = server.rollouts.get("m")
        status = (rollout.state.value, rollout.step)
        await server.rollouts.act("m", "abort")
        return status

    async def after_abort(server: Server) -> tuple[str, set[str]]:
        return server.rollouts.get("m").state.value, {await _answered_by(server, _request()) for _ in range(10)}

    _run(repository, start, state)
    assert _run(repository, resumed, state) == ("running", 0)
    assert json.loads(Path(state).read_text())["rollouts"][0]["state"] == "aborted"
    assert _run(repository, after_abort, state) == ("aborted", {"1"})


def test_a_shadow_copy_runs_only_once_the_primary_has_answered_the_client(
    repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The primary never waits on its own copy: the copy is sent after the client's answer."""
    events: list[str] = []
    execute = versioned_backend._VersionedInstance.execute

    async def logged(self: Any, requests: list[InferenceRequest]) -> Any:
        events.append(f"v{self.version} ran")
        await asyncio.sleep(0.01 if self.version == 1 else 0)  # the primary takes its time
        return await execute(self, requests)

    monkeypatch.setattr(versioned_backend._VersionedInstance, "execute", logged)

    async def body(server: Server) -> None:
        await server.rollouts.begin("m", "2", "shadow=100%/60s:1000")
        for _ in range(5):
            answered = asyncio.get_running_loop().create_future()
            assert server.submit(_request(), lambda response, f=answered: (events.append("answered"), f.set_result(None)))
            await answered
            await asyncio.sleep(0.01)

    _run(repository, body)
    assert events == ["v1 ran", "answered", "v2 ran"] * 5


def test_a_shadow_copy_reads_inputs_from_shared_memory_as_they_were_when_the_primary_ran(repository: Path) -> None:
    """The client may write a shared-memory region again as soon as it has its answer: the copy keeps the values
    the primary saw (here the client writes 1000 into the region; the copy still compares 2 with 1)."""

    async def body(server: Server) -> float:
        await server.rollouts.begin("m", "2", "shadow=100%/60s:1000")
        for _ in range(10):
            region = np.zeros((1, 1), np.float32)
            tensor = InputTensor("IN", "FP32", (1, 1), region, {"shared_memory_region": "r"})
            answered = asyncio.get_running_loop().create_future()

            def done(response: Any, f: asyncio.Future[None] = answered, region: np.ndarray = region) -> None:
                region[...] = 1000.0  # the client reuses its region
                f.set_result(None)

            assert server.submit(InferenceRequest("m", "", [tensor]), done)
            await answered
        for _ in range(100):
            await asyncio.sleep(0.01)
            if server.rollouts.get("m").windows["2"].compared >= 10:
                break
        return float(server.rollouts.status("m")["versions"]["2"]["divergence"])

    assert _run(repository, body) == pytest.approx(0.5)


def test_a_shadow_answer_is_compared_with_the_primarys_own_outputs_not_its_classes(repository: Path) -> None:
    """A client asking for the top class gets classes; the comparison still sees the model's numbers (2 against 1)."""

    async def body(server: Server) -> float:
        await server.rollouts.begin("m", "2", "shadow=100%/60s:1000")
        for _ in range(10):
            request = _request()
            request.outputs = [RequestedOutput("OUT", {"classification": 1})]
            response = await server.infer(request)
            assert response.outputs[0].datatype == "BYTES"
        for _ in range(100):
            await asyncio.sleep(0.01)
            if server.rollouts.get("m").windows["2"].compared >= 8:
                break
        return float(server.rollouts.status("m")["versions"]["2"]["divergence"])

    assert _run(repository, body) == pytest.approx(0.5)
