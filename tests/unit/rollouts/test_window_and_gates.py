"""A version's figures over a step's window, and the evidence gate that judges them."""

from __future__ import annotations

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from nereid.core.errors import NereidError
from nereid.rollouts.gates import Objectives, judge
from nereid.rollouts.window import VersionWindow, WindowFigures


def _figures(requests: int = 1000, errors: int = 0, p99_ms: float = 10.0, divergence: float = 0.0) -> WindowFigures:
    return WindowFigures(requests, errors, p99_ms, p99_ms / 2, 1.0, requests if divergence else 0, divergence)


def test_the_window_reads_the_p99_within_two_percent_and_counts_errors() -> None:
    window = VersionWindow()
    for i in range(1, 1001):
        window.record(i * 100_000, failed=i % 10 == 0)  # 0.1 ms .. 100 ms
    figures = window.figures()
    assert figures.requests == 1000 and figures.errors == 100
    assert figures.p99_ms == pytest.approx(99.0, rel=0.02)
    assert figures.mean_ms == pytest.approx(50.05, rel=0.001)


def test_the_cpu_per_request_counts_from_the_windows_first_reading_of_the_versions_counters() -> None:
    window = VersionWindow()
    window.observe_cost(5_000_000_000, 900)  # what the version had used before the window: not its cost
    assert window.figures().cpu_ms_per_request == 0.0
    window.observe_cost(5_000_000_000 + 40 * 2_000_000, 900 + 40)
    assert window.figures().cpu_ms_per_request == pytest.approx(2.0)


def test_an_empty_window_reads_zero() -> None:
    assert VersionWindow().figures() == WindowFigures(0, 0, 0.0, 0.0, 0.0, 0, 0.0)


def test_the_default_gate_passes_a_candidate_like_the_primary() -> None:
    assert judge(_figures(errors=5), _figures(errors=4), Objectives()).passed


def test_the_default_gate_fails_an_error_rate_a_point_above_the_primarys() -> None:
    verdict = judge(_figures(errors=30), _figures(errors=10), Objectives())
    assert not verdict.passed and "error rate 3.00%" in verdict.reason


def test_the_default_gate_fails_a_p99_past_one_and_a_half_times_plus_five_ms() -> None:
    assert judge(_figures(p99_ms=19.9), _figures(p99_ms=10.0), Objectives()).passed
    verdict = judge(_figures(p99_ms=20.5), _figures(p99_ms=10.0), Objectives())
    assert not verdict.passed and "p99 20.5 ms" in verdict.reason


def test_divergence_is_reported_not_gated_unless_an_objective_says_so() -> None:
    different = _figures(divergence=0.4)
    assert judge(different, _figures(), Objectives()).passed
    verdict = judge(different, _figures(), Objectives(max_divergence=0.05))
    assert not verdict.passed and "divergence" in verdict.reason


def test_objectives_come_from_config_parameters_and_replace_the_defaults() -> None:
    config = mc.ModelConfig()
    config.parameters["rollout_max_p99_ms"].string_value = "50"
    config.parameters["rollout_max_error_rate"].string_value = "0.2"
    objectives = Objectives.from_parameters(config.parameters, "m")
    assert objectives == Objectives(max_p99_ms=50.0, max_error_rate=0.2)
    # 3x the primary's p99 but within the declared 50 ms; 10% errors within the declared 20%
    assert judge(_figures(p99_ms=30, errors=100), _figures(p99_ms=10), objectives).passed


def test_a_malformed_objective_names_the_model_and_the_key() -> None:
    config = mc.ModelConfig()
    config.parameters["rollout_max_p99_ms"].string_value = "fast"
    with pytest.raises(NereidError) as raised:
        Objectives.from_parameters(config.parameters, "m")
    assert raised.value.message == "[model 'm'] parameter 'rollout_max_p99_ms': expected a number, got 'fast'"
