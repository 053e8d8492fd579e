"""What a model version has cost so far in CPU time, for the rollouts' cost objective (docs/rollouts.md): read from
/proc where its instances run in processes of their own, from its executions' compute time where they run on the
server's threads (whose CPU time cannot be split per model)."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["process_cpu_ns", "version_cost"]

_NS_PER_TICK = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def process_cpu_ns(pid: int) -> int:
    """The user and system CPU time of a process so far; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
    except OSError:
        return 0
    return (int(fields[11]) + int(fields[12])) * _NS_PER_TICK  # utime and stime, after the command's name


def version_cost(mv: Any) -> tuple[int, int]:
    """(CPU ns, requests answered) of a ModelVersion so far: both only grow while its instances live."""
    stats = mv.stats
    answered = stats.success.count + stats.fail.count
    pids = [pid for pid in (getattr(instance, "pid", None) for instance in mv.instances) if isinstance(pid, int)]
    if pids:
        return sum(process_cpu_ns(pid) for pid in pids), answered
    batches = stats.batches.values()
    return sum(b.compute_input.ns + b.compute_infer.ns + b.compute_output.ns for b in batches), answered
