"""The monitor samples about --monitoring-samples-per-second requests a second whatever the traffic: from its first
second on (a busy server's first second must not sample every request and fill the queue), and again soon after
the traffic falls."""

from __future__ import annotations

import pytest

from nereid.monitoring import monitor as monitor_module
from nereid.monitoring.monitor import Monitor, MonitorConfig


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(monitor_module.time, "monotonic", fake)
    return fake


def _offer(monitor: Monitor, clock: _Clock, per_second: int, seconds: float) -> int:
    """Requests at an even pace; how many were sampled."""
    sampled = 0
    for _ in range(int(per_second * seconds)):
        clock.now += 1 / per_second
        sampled += monitor.wants()
    return sampled


def test_a_busy_servers_first_second_samples_about_the_rate_not_every_request(clock: _Clock) -> None:
    monitor = Monitor(MonitorConfig(samples_per_second=10))
    assert _offer(monitor, clock, 20_000, 1.0) <= 12  # the second request already sets the stride
    assert 8 <= _offer(monitor, clock, 20_000, 2.0) / 2 <= 12
    assert monitor.stride == 2_000


def test_slow_traffic_is_sampled_whole(clock: _Clock) -> None:
    monitor = Monitor(MonitorConfig(samples_per_second=10))
    assert _offer(monitor, clock, 4, 5.0) == 20  # four requests a second: each one


def test_after_the_traffic_falls_the_stride_comes_down_within_a_refresh(clock: _Clock) -> None:
    monitor = Monitor(MonitorConfig(samples_per_second=10))
    _offer(monitor, clock, 20_000, 1.0)
    offered = monitor.follow_falling_rate(1.0, 0)
    sampled = _offer(monitor, clock, 40, 1.0)  # 40 a second now: the next look would be 2,000 requests away
    assert sampled <= 1  # at most the look the faster traffic had half counted
    monitor.follow_falling_rate(1.0, offered)  # what the thread does each second
    assert monitor.stride == 4
    assert 8 <= _offer(monitor, clock, 40, 2.0) / 2 <= 12
