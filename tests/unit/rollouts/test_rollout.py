"""A rollout's state machine: steps, gates, rollback, the hand controls and persistence (time passed in)."""

from __future__ import annotations

import json

import pytest

from nereid.core.errors import NereidError
from nereid.rollouts.gates import Objectives
from nereid.rollouts.rollout import Rollout, RolloutState
from nereid.rollouts.steps import parse_steps

MS = 1_000_000


def _rollout(steps: str = "shadow=100%/60s:50,canary=10%/120s:50,canary=50%/120s:50", **kw: object) -> Rollout:
    return Rollout.start("m", "1", "2", parse_steps(steps), now=1000.0, **kw)  # type: ignore[arg-type]


def _serve(rollout: Rollout, count: int, candidate_ms: float = 5, primary_ms: float = 5, fail_every: int = 0) -> int:
    """Route `count` requests and record their outcomes as each version would answer; the failures a client saw."""
    seen_failures = 0
    for i in range(count):
        route = rollout.route(None)
        for version in {route.version, route.shadow} - {None}:
            failed = version == "2" and fail_every and i % fail_every == 0
            rollout.record(version, int((candidate_ms if version == "2" else primary_ms) * MS), bool(failed))  # type: ignore[arg-type]
            if failed and version == route.version:
                seen_failures += 1
    return seen_failures


def test_a_candidate_like_the_primary_moves_through_every_step_and_is_promoted() -> None:
    rollout = _rollout()
    assert rollout.route(None).shadow == "2" and rollout.route(None).version == "1"  # shadow: the primary answers
    _serve(rollout, 100)
    assert rollout.tick(1030.0) is None  # gate passes but the step lasts 60 s
    assert rollout.tick(1060.0) is not None and rollout.step == 1
    _serve(rollout, 1000)
    assert rollout.tick(1180.0) is not None and rollout.step == 2
    _serve(rollout, 200)
    rollout.tick(1300.0)
    assert rollout.state is RolloutState.PROMOTED
    assert rollout.route(None).version == "2" and rollout.route("any-key").version == "2"
    assert [e.what for e in rollout.history] == ["started", "step passed", "step started", "step passed", "step started", "step passed", "promoted"]


def test_a_step_waits_for_its_minimum_of_candidate_requests_even_past_its_duration() -> None:
    rollout = _rollout("canary=10%/10s:100")
    _serve(rollout, 500)  # about 50 reach the candidate
    assert rollout.tick(2000.0) is None and rollout.state is RolloutState.RUNNING


def test_a_candidate_failing_a_fifth_of_its_requests_is_rolled_back_at_its_first_canary_step() -> None:
    rollout = _rollout("canary=10%/120s:50,canary=50%/120s")
    seen = 0
    while rollout.open:
        seen += _serve(rollout, 10, fail_every=5)
        rollout.tick(1010.0)
    assert rollout.state is RolloutState.ROLLED_BACK and rollout.step == 0
    assert "error rate" in rollout.reason and "failed its gate" in rollout.reason
    assert rollout.route(None).version == "1"  # every request to the primary from the next one
    candidate = rollout.windows["2"].figures()
    assert seen == candidate.errors and seen <= 0.2 * candidate.requests + 1  # users saw only the canary's share


def test_a_candidate_five_times_slower_is_rolled_back_on_latency_in_shadow() -> None:
    rollout = _rollout()
    _serve(rollout, 60, candidate_ms=25, primary_ms=5)
    rollout.tick(1001.0)
    assert rollout.state is RolloutState.ROLLED_BACK and "p99" in rollout.reason


def test_diverging_outputs_stop_the_rollout_in_shadow_when_an_objective_says_so() -> None:
    rollout = _rollout(objectives=Objectives(max_divergence=0.05))
    _serve(rollout, 60)
    for _ in range(60):
        rollout.record_comparison(0.5)
    rollout.tick(1001.0)
    assert rollout.state is RolloutState.ROLLED_BACK and "divergence" in rollout.reason and rollout.step == 0


def test_pause_sends_everything_to_the_primary_and_resume_starts_the_step_over() -> None:
    rollout = _rollout("canary=50%/60s:10")
    rollout.pause(1001.0)
    assert all(rollout.route(None).version == "1" for _ in range(100))
    with pytest.raises(NereidError):
        rollout.pause(1002.0)
    rollout.resume(1010.0)
    assert rollout.step_started == 1010.0 and any(rollout.route(None).version == "2" for _ in range(10))


def test_abort_and_promote_and_undo_by_hand() -> None:
    aborted = _rollout()
    aborted.abort(1001.0)
    assert aborted.state is RolloutState.ABORTED and aborted.route(None).version == "1"
    promoted = _rollout()
    promoted.promote(1001.0)
    assert promoted.route(None).version == "2"
    promoted.undo(1002.0)
    assert promoted.state is RolloutState.ROLLED_BACK and promoted.route(None).version == "1"
    with pytest.raises(NereidError, match="only a promotion can be undone"):
        promoted.undo(1003.0)


def test_a_sticky_key_meets_one_version_throughout_a_step() -> None:
    rollout = _rollout("canary=50%/60s")
    for user in (f"user-{i}" for i in range(100)):
        assert len({rollout.route(user).version for _ in range(10)}) == 1


def test_an_open_rollout_resumes_its_step_after_a_restart_and_a_rollback_stays_rolled_back() -> None:
    rollout = _rollout()
    _serve(rollout, 100)
    rollout.tick(1060.0)
    saved = json.loads(json.dumps(rollout.to_json()))
    resumed = Rollout.from_json(saved, now=5000.0)
    assert resumed.state is RolloutState.RUNNING and resumed.step == 1 and resumed.step_started == 5000.0
    assert resumed.windows["2"].requests == 0 and resumed.history[-1].what == "resumed after a restart"

    resumed.roll_back(5001.0, "a test")
    after = Rollout.from_json(json.loads(json.dumps(resumed.to_json())), now=6000.0)
    assert after.state is RolloutState.ROLLED_BACK and after.route(None).version == "1" and after.reason == "a test"


def test_a_rollout_to_the_primary_itself_is_refused() -> None:
    with pytest.raises(NereidError, match="already the primary"):
        Rollout.start("m", "1", "1", parse_steps("canary=10%/1s"), now=0.0)
