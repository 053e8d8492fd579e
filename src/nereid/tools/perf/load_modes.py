"""Load modes: how a level (a concurrency or a request rate) is shared among worker processes, the send
schedule of request-rate mode (constant or Poisson gaps), and sequences (ids, lengths, start/end flags)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["LevelPlan", "SequencePlan", "SequenceSource", "send_times", "sequence_parameters", "split_level"]


@dataclass(slots=True)
class LevelPlan:
    """One worker's share of a load level."""

    concurrency: int = 0  # closed loop: this many requests in flight, each sent when the previous one returns
    rate: float = 0.0  # open loop: requests per second
    distribution: str = "constant"
    phase: float = 0.0  # fraction of an interval to offset the first send (spreads workers' constant schedules)
    seed: int = 0


def split_level(mode: str, level: float, workers: int, distribution: str, seed: int) -> list[LevelPlan]:
    """Share `level` among `workers`: concurrency as evenly as whole numbers allow, rate in equal parts."""
    if mode == "concurrency":
        total = int(level)
        return [
            LevelPlan(concurrency=total // workers + (1 if i < total % workers else 0), seed=seed + i)
            for i in range(workers)
        ]
    return [
        LevelPlan(rate=level / workers, distribution=distribution, phase=i / workers, seed=seed + i) for i in range(workers)
    ]


def send_times(plan: LevelPlan, start_ns: int) -> Iterator[int]:
    """Scheduled send times (monotonic ns) for an open-loop plan: evenly spaced, or exponential gaps (Poisson)."""
    interval = 1e9 / plan.rate
    rng = random.Random(plan.seed)
    t = start_ns + plan.phase * interval
    if plan.distribution == "poisson":
        while True:
            t += rng.expovariate(1.0) * interval
            yield int(t)
    k = 0
    while True:
        yield int(t + k * interval)
        k += 1


@dataclass(slots=True)
class SequencePlan:
    id_start: int
    id_end: int | None  # excluded; None: unbounded
    length: int
    variation: float  # percent
    use_data_lengths: bool  # the length of a sequence is its data stream's length
    streams: int  # how many data streams there are
    stream_lengths: list[int]


class SequenceSource:
    """A worker's sequences: unique ids (worker `index` of `count` takes every count-th id), a length within
    +/- variation% of the base, and the data stream to play back (round-robin)."""

    def __init__(self, plan: SequencePlan, index: int, count: int, seed: int) -> None:
        self.plan = plan
        self.index = index
        self.count = count
        self._k = 0
        self._rng = random.Random(seed)

    def next_sequence(self) -> tuple[int, int, int]:
        """(sequence id, length, data stream index)."""
        plan = self.plan
        n = self._k * self.count + self.index
        self._k += 1
        if plan.id_end is not None:
            n %= plan.id_end - plan.id_start
        stream = n % plan.streams
        if plan.use_data_lengths:
            length = plan.stream_lengths[stream]
        else:
            spread = plan.length * plan.variation / 100.0
            low = max(1, int(round(plan.length - spread)))
            high = max(low, int(round(plan.length + spread)))
            length = self._rng.randint(low, high)
        return plan.id_start + n, length, stream


def sequence_parameters(sequence_id: int, step: int, length: int) -> dict[str, object]:
    parameters: dict[str, object] = {"sequence_id": sequence_id}
    if step == 0:
        parameters["sequence_start"] = True
    if step == length - 1:
        parameters["sequence_end"] = True
    return parameters

