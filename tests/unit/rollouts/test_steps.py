"""The step grammar of `nereid rollout start --steps`."""

from __future__ import annotations

import pytest

from nereid.core.errors import NereidError
from nereid.rollouts.steps import DEFAULT_MIN_REQUESTS, Step, format_steps, parse_steps


def test_the_issue_grammar_parses_into_steps_with_seconds() -> None:
    steps = parse_steps("shadow=100%/60s,canary=10%/120s,canary=50%/2m")
    assert steps == [
        Step("shadow", 100.0, 60.0),
        Step("canary", 10.0, 120.0),
        Step("canary", 50.0, 120.0),
    ]
    assert all(step.min_requests == DEFAULT_MIN_REQUESTS for step in steps)


def test_a_step_may_name_its_minimum_of_requests_and_a_unit_less_duration_is_seconds() -> None:
    assert parse_steps("canary=5%/30:20") == [Step("canary", 5.0, 30.0, 20)]
    assert parse_steps("shadow=100%/500ms") == [Step("shadow", 100.0, 0.5)]


def test_steps_print_back_in_the_grammar() -> None:
    text = "shadow=100%/60s,canary=10%/120s:20"
    assert format_steps(parse_steps(text)) == text


@pytest.mark.parametrize("text", ["", "blue=10%/60s", "canary=10/60s", "canary=0%/60s", "canary=150%/60s", "canary=10%"])
def test_a_malformed_step_is_refused_naming_the_grammar(text: str) -> None:
    with pytest.raises(NereidError) as raised:
        parse_steps(text)
    assert "rollout step" in raised.value.message or "at least one step" in raised.value.message
