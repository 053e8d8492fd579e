"""The version a request naming no version gets during a rollout: shares, sticky keys and shadow copies."""

from __future__ import annotations

import os
import subprocess
import sys

from nereid.rollouts.split import Route, VersionSplit, bucket_of


def test_requests_without_a_key_meet_the_candidate_in_close_to_its_share() -> None:
    split = VersionSplit("1", "2", canary_percent=10)
    routes = [split.route() for _ in range(1000)]
    to_candidate = sum(route.version == "2" for route in routes)
    assert 95 <= to_candidate <= 105
    # and any short run already holds close to its share: no long streak on one version
    first_hundred = sum(route.version == "2" for route in routes[:100])
    assert 8 <= first_hundred <= 12


def test_a_sticky_key_always_meets_the_same_version() -> None:
    split = VersionSplit("1", "2", canary_percent=50)
    for user in (f"user-{i}" for i in range(200)):
        first = split.route(user)
        assert all(split.route(user) == first for _ in range(5))
    shares = sum(split.route(f"user-{i}").version == "2" for i in range(2000))
    assert 900 <= shares <= 1100


def test_a_key_keeps_its_version_as_the_canary_widens() -> None:
    narrow, wide = VersionSplit("1", "2", canary_percent=10), VersionSplit("1", "2", canary_percent=50)
    for user in (f"u{i}" for i in range(500)):
        if narrow.route(user).version == "2":
            assert wide.route(user).version == "2"


def test_a_keys_bucket_is_the_same_in_another_process() -> None:
    # str hashes are salted per process (PYTHONHASHSEED): a replica or a restart must still agree
    code = "from nereid.rollouts.split import bucket_of; print(bucket_of('user-42'))"
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "7"}
    )
    assert int(other.stdout) == bucket_of("user-42")


def test_a_shadow_step_answers_with_the_primary_and_copies_its_share() -> None:
    split = VersionSplit("1", "2", shadow_percent=100)
    assert all(split.route() == Route("1", "2") for _ in range(50))
    half = VersionSplit("1", "2", shadow_percent=50)
    copies = sum(half.route().shadow == "2" for _ in range(1000))
    assert 480 <= copies <= 520
