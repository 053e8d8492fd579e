"""The parent's side of the load-generator processes: spawn them (without re-running the caller's script),
send start / drain / stop / exit, and turn a dead or failing worker into a one-line `PerfError`."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from nereid.tools.perf.config import PerfError
from nereid.tools.perf.load_modes import LevelPlan
from nereid.tools.perf.worker import Records, WorkerPlan, worker_main

__all__ = ["WorkerPool"]


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Spawned workers need nothing from the parent's `__main__` (their entry point and plan live in this package),
    so keep spawn from re-running the caller's script: `run_perf` then works from scripts without a main guard."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved: dict[str, Any] = {name: main.__dict__[name] for name in ("__file__", "__spec__") if name in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


class WorkerPool:
    """The parent's handle on its worker processes."""

    def __init__(self, plans: list[WorkerPlan], startup_timeout_s: float = 60.0) -> None:
        context = multiprocessing.get_context("spawn")
        self.processes: list[Any] = []
        self.conns: list[multiprocessing.connection.Connection] = []
        for plan in plans:
            parent, child = context.Pipe()
            process = context.Process(target=worker_main, args=(plan, child), name=f"nereid-perf-worker-{plan.index}", daemon=True)
            with _main_module_hidden():
                process.start()
            child.close()
            self.processes.append(process)
            self.conns.append(parent)
        try:
            for i in range(len(self.conns)):
                self._expect(i, "ready", startup_timeout_s)
        except BaseException:
            self.close()
            raise

    def __len__(self) -> int:
        return len(self.conns)

    def _expect(self, i: int, kind: str, timeout_s: float) -> tuple[Any, ...]:
        conn = self.conns[i]
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PerfError(f"load worker {i} did not answer within {timeout_s:g} s")
            try:
                ready = conn.poll(min(left, 0.5))
            except (EOFError, OSError):
                ready = True
            if ready:
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    raise PerfError(f"load worker {i} exited unexpectedly (exit code {self.processes[i].exitcode})") from None
                if message[0] == "error":
                    detail = f"\n{message[2]}" if os.environ.get("NEREID_PERF_DEBUG") else ""
                    raise PerfError(f"load worker {i} failed: {message[1]}{detail}")
                if message[0] != kind:
                    raise PerfError(f"load worker {i} answered '{message[0]}', expected '{kind}'")
                return message
            if not self.processes[i].is_alive():
                raise PerfError(f"load worker {i} exited unexpectedly (exit code {self.processes[i].exitcode})")

    def _send_all(self, message: tuple[Any, ...]) -> None:
        for i, conn in enumerate(self.conns):
            try:
                conn.send(message)
            except (OSError, ValueError):
                raise PerfError(f"load worker {i} exited unexpectedly (exit code {self.processes[i].exitcode})") from None

    def start(self, levels: list[LevelPlan]) -> None:
        for conn, level in zip(self.conns, levels):
            conn.send(("start", level))
        for i in range(len(self.conns)):
            self._expect(i, "started", 30.0)

    def drain(self) -> list[Records]:
        self._send_all(("drain",))
        return [self._expect(i, "records", 30.0)[1] for i in range(len(self.conns))]

    def stop(self, timeout_s: float) -> list[Records]:
        self._send_all(("stop", timeout_s))
        return [self._expect(i, "stopped", timeout_s + 30.0)[1] for i in range(len(self.conns))]

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(("exit",))
            except (OSError, ValueError):
                pass
        for process in self.processes:
            process.join(timeout=5.0)
            if process.is_alive():
                process.terminate()
                process.join(timeout=2.0)
        for conn in self.conns:
            conn.close()
        self.processes.clear()
        self.conns.clear()
