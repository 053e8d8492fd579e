"""Whether the machine has a core to spare for polling, probed now and then with the polling off.

The event loop (`HotLoop`) and a Python model's worker poll instead of sleeping through the short waits of a lone
request, because waking a halted vCPU costs more than the request's own work. That pays only while cores would
otherwise sit idle. On a machine whose cores are busy with other work (other processes, other models' threads)
nothing halts, waking is cheap, and a poller only takes the time slices of the threads it waits for and loses
the scheduler's preference for threads that wake: there lone requests are served faster without polling
(benchmarks/results/perf_analyzer.md has the figures beside a busy process).

Polling cannot be judged while it runs, since the poller's own spinning is what keeps the cores busy. So polling
is allowed for `ALLOWED_NS` at a time, then switched off for `PROBE_NS` while the machine's idle time is read
from /proc/stat: with at least `MIN_SPARE_CPUS` idle, polling goes on; otherwise it stays off for `REFUSED_NS`
and is probed again. Where /proc/stat cannot be read, polling is always allowed.

A container's CPU quota is left out on purpose: under a CPU quota on an idle host the cores still halt, so polling
still serves lone requests faster (1.17x-1.32x under a 1.5-CPU cgroup quota), even where the cgroup is throttled in
half of its periods.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

__all__ = ["SpareCpu", "read_proc_stat"]

ALLOWED_NS = 10_000_000_000
PROBE_NS = 100_000_000
REFUSED_NS = 2_000_000_000
# Idle CPUs over a probe that make polling worth it: a poller needs about one core, half of one is the least
# that tells a machine with room from one whose cores are all taken.
MIN_SPARE_CPUS = 0.5


def read_proc_stat() -> tuple[int, int] | None:
    """The whole machine's (idle, all) CPU time so far, in clock ticks; None where unknown."""
    try:
        with open("/proc/stat", "rb") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != b"cpu":
        return None
    ticks = [int(field) for field in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return ticks[3] + ticks[4], sum(ticks)


class SpareCpu:
    """Asked on each occasion to poll; says whether polling may run now (see the module's docstring)."""

    def __init__(self, read: Callable[[], tuple[int, int] | None] = read_proc_stat) -> None:
        self._read = read
        self._cpus = os.cpu_count() or 1  # /proc/stat's first line adds up every CPU of the machine
        self._allowed = True
        self._probe_start: tuple[int, int] | None = None  # the counters as the probe in progress began
        self._phase_ends_ns = time.monotonic_ns() + ALLOWED_NS
        self.spare_cpus: float | None = None  # what the last probe found

    def allows(self, now_ns: int) -> bool:
        if now_ns >= self._phase_ends_ns:
            self._next_phase(now_ns)
        return self._allowed and self._probe_start is None

    def _next_phase(self, now_ns: int) -> None:
        counters = self._read()
        if counters is None:  # nothing to measure with: the polling stays as it was
            self._phase_ends_ns = now_ns + ALLOWED_NS
            return
        start, self._probe_start = self._probe_start, None
        if start is None:  # polling off from here while the machine's idle time is read
            self._probe_start = counters
            self._phase_ends_ns = now_ns + PROBE_NS
            return
        idle, total = counters[0] - start[0], counters[1] - start[1]
        if total > 0:
            self.spare_cpus = self._cpus * idle / total
            self._allowed = self.spare_cpus >= MIN_SPARE_CPUS
        self._phase_ends_ns = now_ns + (ALLOWED_NS if self._allowed else REFUSED_NS)
