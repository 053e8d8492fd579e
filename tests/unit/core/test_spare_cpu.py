"""SpareCpu: polling runs while the machine has idle cores, and stops while other work takes them all."""

from __future__ import annotations

import asyncio
import os
import time

from nereid.core import spare_cpu
from nereid.core.hot_loop import HotLoop
from nereid.core.spare_cpu import SpareCpu


class _Machine:
    """/proc/stat's (idle, all) ticks of a machine whose idle share the test sets."""

    def __init__(self) -> None:
        self.idle = self.total = 0
        self.idle_share = 1.0

    def run(self, ticks: int) -> None:
        self.total += ticks
        self.idle += round(ticks * self.idle_share)

    def read(self) -> tuple[int, int]:
        return self.idle, self.total


def test_polling_stops_while_every_core_is_busy_and_resumes_once_one_is_idle() -> None:
    machine = _Machine()
    cpus = os.cpu_count() or 1
    start = time.monotonic_ns()
    spare = SpareCpu(machine.read)
    seen = [spare.allows(start)]  # allowed at first: nothing measured yet

    now = start + spare_cpu.ALLOWED_NS + 1_000_000_000
    seen.append(spare.allows(now))  # a probe: polling off while the machine is watched
    machine.idle_share = 0.1 / cpus  # a tenth of one core idle: others keep the cores busy
    machine.run(1000)
    now += spare_cpu.PROBE_NS
    seen.append(spare.allows(now))  # refused
    assert spare.spare_cpus is not None and abs(spare.spare_cpus - 0.1) < 0.01
    seen.append(spare.allows(now + spare_cpu.REFUSED_NS - 1))  # still refused, not probed again yet

    now += spare_cpu.REFUSED_NS
    seen.append(spare.allows(now))  # probing again
    machine.idle_share = 1.5 / cpus if cpus > 1 else 0.9  # the busy work went away
    machine.run(1000)
    now += spare_cpu.PROBE_NS
    seen.append(spare.allows(now))
    assert seen == [True, False, False, False, False, True]


def test_without_proc_stat_polling_stays_allowed() -> None:
    spare = SpareCpu(lambda: None)
    later = time.monotonic_ns() + 10 * spare_cpu.ALLOWED_NS
    assert spare.allows(later) and spare.allows(later + spare_cpu.PROBE_NS)


def test_a_loop_whose_machine_has_no_core_to_spare_sleeps_through_a_hold() -> None:
    class _Refusing(SpareCpu):
        def allows(self, now_ns: int) -> bool:
            return False

    async def run() -> tuple[float, bool]:
        hot = HotLoop()
        hot.spare_cpu = _Refusing()
        held = hot.hold(10_000_000_000)
        start = time.process_time()
        await asyncio.sleep(0.2)
        return time.process_time() - start, held

    used, held = asyncio.run(run())
    assert used < 0.05, used  # asleep, where an allowed hold polls for most of the 0.2 s
    assert not held  # and a Python worker is not asked to poll either
