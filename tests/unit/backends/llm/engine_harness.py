"""What the engine tests share besides conftest.py's fixtures: a collector of each job's events, and greedy jobs."""

from __future__ import annotations

import threading
import time
from typing import Any

from nereid.backends.llm.engine import GenerationJob, JobEvent
from nereid.backends.llm.sampling import parse_sampling_params


class Collector:
    """The engine's `deliver` callback: each watched job's events, when it finished, and which jobs started first."""

    def __init__(self) -> None:
        self.events: dict[int, list[JobEvent]] = {}
        self.done: dict[int, threading.Event] = {}
        self.started: list[GenerationJob] = []  # in the order their first token came
        self.lock = threading.Lock()

    def watch(self, job: GenerationJob) -> None:
        self.events[id(job)] = []
        self.done[id(job)] = threading.Event()

    def deliver(self, events: list[JobEvent]) -> None:
        with self.lock:
            for event in events:
                if not self.events[id(event.job)]:
                    self.started.append(event.job)
                self.events[id(event.job)].append(event)
                if event.finished:
                    self.done[id(event.job)].set()

    def wait(self, job: GenerationJob, timeout: float = 120) -> list[JobEvent]:
        assert self.done[id(job)].wait(timeout), "the job did not finish in time"
        return self.events[id(job)]


def greedy_job(ids: list[int], stream: bool = True, cancelled: Any = None, priority: int = 0, user: str = "", **params: Any) -> GenerationJob:
    """A greedy job of 12 tokens (ignoring EOS) unless `params` say otherwise."""
    values = {"temperature": 0, "ignore_eos": True, "max_tokens": 12}
    values.update(params)
    return GenerationJob(
        prompt_ids=list(ids),
        params=parse_sampling_params(values),
        stream=stream,
        cancelled=cancelled or (lambda: False),
        arrival_ns=time.monotonic_ns(),
        priority=priority,
        user=user,
    )
