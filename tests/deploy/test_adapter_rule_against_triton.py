"""The chart's prometheus-adapter rule on real Triton and on Nereid, same model, same load: both give the queue time
per request in microseconds, of the same size, so an HPA tuned on Triton scales Nereid alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy.adapter_rule import SLEEP_SECS, adapter_rule, measure_under_load, write_slow_model
from tests.servers import start_nereid, start_real_triton

pytestmark = pytest.mark.differential


def test_adapter_rule_reads_the_same_queue_time_on_triton_and_on_nereid(helm: str, tmp_path: Path) -> None:
    write_slow_model(tmp_path / "repo")
    _, query = adapter_rule(helm)
    values = {}
    for name, start in (("triton", start_real_triton), ("nereid", start_nereid)):
        server = start(tmp_path / "repo")
        try:
            measured = measure_under_load(server, query)
        finally:
            server.stop()
        assert measured.idle_value == 0.0, name
        assert measured.value * (1 + measured.served) / measured.served == pytest.approx(measured.stats_queue_us_per_request, rel=0.15), name
        values[name] = measured.value
    # Three requests ahead of each one on a 20 ms instance: about 60 ms on both, within a loose factor for a busy machine.
    expected_us = 3 * SLEEP_SECS * 1e6
    for name, value in values.items():
        assert expected_us / 4 < value < expected_us * 8, (name, values)
    assert 1 / 3 < values["nereid"] / values["triton"] < 3, values


def test_adapter_rule_value_matches_triton_within_a_quarter(helm: str, tmp_path: Path) -> None:
    write_slow_model(tmp_path / "repo")
    _, query = adapter_rule(helm)
    values = {}
    for name, start in (("triton", start_real_triton), ("nereid", start_nereid)):
        server = start(tmp_path / "repo")
        try:
            values[name] = measure_under_load(server, query).value
        finally:
            server.stop()
    assert 0.8 < values["nereid"] / values["triton"] < 1.25, values
