"""One instance of a Python-backend model as the scheduler sees it: it hands each batch to the instance's worker
and returns the batch's responses with their execution times, answering on its own each request whose timeout expires.

This runs on the same event loop as the HTTP and gRPC frontends, so the per-request work here is kept small: a
batch goes out as one Execute message and comes back as one Result. The worker's life (start, restart, stop) is
the supervisor's (`process`), the messages on its channel `worker_process`'s; the instance sees them only through
the `Supervisor` and `BatchWorker` protocols.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Protocol

from nereid.backends.base import ExecutionTimes, InstanceSpec, ModelContext
from nereid.backends.python.backend_state import PythonBackendState
from nereid.backends.python.execution_env import ExecutionEnv
from nereid.backends.python.process import WorkerSpec, WorkerSupervisor
from nereid.backends.python.worker_process import BatchOutcome, ignore_response
from nereid.config.model_config import config_to_json_dict
from nereid.core.errors import NereidError
from nereid.core.types import InferenceRequest, InferenceResponse

__all__ = ["PythonInstance", "BatchWorker", "Supervisor", "GROUP_MOST", "GROUP_HOLD_NS", "WORKER_POLL_NS"]

# An ExecuteGroup carries at most GROUP_MOST requests, and only as many as keep its first response waiting for the
# others' executions no longer than GROUP_HOLD_NS: groups pay off for fast models, whose hand-overs cost as much as
# their executions, and would only delay the answers of slow ones.
GROUP_MOST = 8
GROUP_HOLD_NS = 500_000
# With one request in flight (see HotLoop), the worker polls this long for the next request after answering,
# where a worker that blocks at once would leave its vCPU to halt: on a virtual machine waking it again costs more
# than the request's own work, and at concurrency 1 that wake is on every request's path. The wait spans the
# server's answer, the client's turn and the next hand-over, so it is longer than the loop's own HOT_WAIT_NS.
# Not on a single CPU, where the polling worker would only stand in the way of the server and the client.
_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
WORKER_POLL_NS = 1_000_000 if _CPUS > 1 else 0


class BatchWorker(Protocol):
    """What an instance asks of the worker process that serves it now (`worker_process.PythonWorkerProcess`)."""

    @property
    def alive(self) -> bool: ...

    @property
    def pid(self) -> int: ...

    @property
    def runs_groups(self) -> bool: ...

    def submit(
        self, requests: list[InferenceRequest], group: bool = False, poll_ns: int = 0
    ) -> tuple[int, asyncio.Future[BatchOutcome]]: ...


class Supervisor(Protocol):
    """What an instance asks of the keeper of its worker's life (`process.WorkerSupervisor`)."""

    @property
    def worker(self) -> BatchWorker | None: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def ready(self) -> bool: ...

    async def revive(self) -> BatchWorker: ...

    def recycle(self, worker: object, reason: str) -> None: ...


class PythonInstance:
    """One instance of a Python model: a worker process that the instance restarts when it dies. Its workers come
    from `state`, the Server's Python backend's (or from `supervisor`, when one is given)."""

    # The scheduler may hand over the next batch while this one executes: the worker runs them one after
    # the other, and the round trip through the server no longer leaves it idle between batches.
    pipelined_batches = 2

    def __init__(
        self,
        context: ModelContext,
        spec: InstanceSpec,
        state: PythonBackendState | None = None,
        supervisor: Supervisor | None = None,
        execution_env: ExecutionEnv | None = None,
    ) -> None:
        self.name = spec.name
        self.context = context
        self.spec = spec
        self.label = f"[model '{context.name}' version {context.version}] instance '{spec.name}'"
        self.decoupled = bool(context.config.model_transaction_policy.decoupled)
        if supervisor is None:
            if state is None:
                raise TypeError("PythonInstance needs the Python backend's state or a supervisor")
            supervisor = WorkerSupervisor(self._worker_spec(execution_env), state)
        self.supervisor: Supervisor = supervisor
        self._round_trip_ns = 0.0  # the worker's recent answer time, submit to result (an average)
        self._worker_free_ns = 0  # when the worker's execute() of the batch before returned (its own stamp)
        self._execute_ns = float(GROUP_HOLD_NS)  # how long its execute() takes (an average; groups start small)

    def _worker_spec(self, execution_env: ExecutionEnv | None) -> WorkerSpec:
        context, spec = self.context, self.spec
        args = {
            "model_config": json.dumps(config_to_json_dict(context.config), separators=(",", ":")),
            "model_instance_kind": spec.kind,
            "model_instance_name": spec.name,
            "model_instance_device_id": str(spec.device_id),
            "model_repository": str(context.model_path),
            "model_version": str(context.version),
            "model_name": context.name,
        }
        return WorkerSpec(
            label=self.label,
            name=spec.name,
            model_file=context.model_file("model.py"),
            version_dir=str(context.version_path),
            args=args,
            decoupled=self.decoupled,
            metrics_owner=f"{context.name}/{context.version}/{spec.name}/{id(self)}",
            server=context.server,
            execution_env=execution_env,
        )

    @property
    def group_limit(self) -> int:
        """How many queued requests may go as one ExecuteGroup: none unless the worker's model allows it (it says
        so when it starts), and only as many as hold the first one's response back by GROUP_HOLD_NS at most."""
        worker = self.supervisor.worker
        if worker is None or not worker.runs_groups:
            return 1
        return min(GROUP_MOST, 1 + int(GROUP_HOLD_NS // (self._execute_ns or 1)))

    @property
    def pid(self) -> int | None:
        """The process id of the current worker (None while it restarts)."""
        worker = self.supervisor.worker
        return worker.pid if worker is not None and worker.alive else None

    # -- lifecycle (the supervisor's) ---------------------------------------------------------------------
    async def start(self) -> None:
        await self.supervisor.start()

    async def close(self) -> None:
        await self.supervisor.close()

    async def ready(self) -> bool:
        """Whether the worker is up and the model's optional is_ready() says yes."""
        return await self.supervisor.ready()

    # -- execution -----------------------------------------------------------------------------------------
    async def execute(self, requests: list[InferenceRequest]) -> tuple[list[InferenceResponse], ExecutionTimes]:
        worker = self.supervisor.worker
        if worker is None or not worker.alive:
            worker = await self.supervisor.revive()
        # A lone request whose worker usually answers within the budget keeps the loop polling meanwhile, and the
        # worker polls for the next request after answering (see WORKER_POLL_NS).
        polling = self.context.polling
        loop_hold = polling.hold_for_worker(self._round_trip_ns) if polling is not None else None
        t0 = time.monotonic_ns()
        _, future = worker.submit(requests, poll_ns=0 if loop_hold is None else WORKER_POLL_NS)
        timeouts = False
        if not self.decoupled:  # a decoupled model may stream for as long as it likes
            for request in requests:
                if request.timeout_us:
                    timeouts = True
                    break
        if timeouts:
            error, responses, (start, end) = await self._await_with_timeouts(worker, future, requests, 1)
        else:
            error, responses, (start, end) = await future
        if loop_hold is not None:
            loop_hold.release()
        now = time.monotonic_ns()
        self._round_trip_ns = 0.8 * self._round_trip_ns + 0.2 * (now - t0)
        execution = self._times(t0, start, end, now)
        if error is not None:
            raise error  # (a decoupled model's streams ended with it)
        return [] if responses is None else responses, execution  # (a decoupled model's went out as they came)

    async def execute_group(self, requests: list[InferenceRequest]) -> list[tuple[InferenceResponse, ExecutionTimes]]:
        """Requests of a model without batching that queued behind a running one, handed over as one ExecuteGroup:
        the worker calls execute() once per request, and each request has its own response and times. A
        request's compute output runs until the last execute() of the group has returned (its response waits for
        the group's one Result)."""
        worker = self.supervisor.worker
        if worker is None or not worker.alive:
            worker = await self.supervisor.revive()
        t0 = time.monotonic_ns()
        _, future = worker.submit(requests, group=True)
        if any(request.timeout_us for request in requests):
            outcome = await self._await_with_timeouts(worker, future, requests, len(requests))
        else:
            outcome = await future
        now = time.monotonic_ns()
        if outcome.error is not None:  # (a worker answers each request's own error in its response)
            raise outcome.error
        times = outcome.times
        executions = [self._times(t0, start, end, now) for start, end in zip(times[0::2], times[1::2])]
        return list(zip(outcome.responses or (), executions, strict=True))

    def _times(self, t0: int, t1: int, t2: int, now: int) -> ExecutionTimes:
        """An execute() the worker ran from t1 to t2 (the server's monotonic clock) for a submit at t0 whose answer
        was read at `now`: before it is input, after it output. Submitted while the worker still ran the execute()
        before, it waited in the worker until that one ended: queue time. The worker may start while submit() is
        still returning here, so nothing is measured on both sides."""
        waited = max(0, min(t1, self._worker_free_ns) - t0)
        self._worker_free_ns = t2
        self._execute_ns = 0.8 * self._execute_ns + 0.2 * (t2 - t1)
        return ExecutionTimes(t1 - t0 - waited, t2 - t1, now - t2, waited)

    async def _await_with_timeouts(
        self,
        worker: BatchWorker,
        future: asyncio.Future[BatchOutcome],
        requests: list[InferenceRequest],
        executions: int,
    ) -> BatchOutcome:
        """Wait for the batch, answering each request whose timeout expires first with a timeout error. When every
        request expired, the outcome holds `executions` pairs of stamps (the time given up waiting)."""
        deadlines = {
            index: request.arrival_ns + request.timeout_us * 1000
            for index, request in enumerate(requests)
            if request.timeout_us
        }
        expired: dict[int, InferenceResponse] = {}
        while True:
            now = time.monotonic_ns()
            for index, deadline in list(deadlines.items()):
                if deadline <= now:
                    del deadlines[index]
                    request = requests[index]
                    error = NereidError.unavailable(
                        f"Request timeout expired: {self.label} did not answer within {request.timeout_us} us"
                    )
                    response = InferenceResponse(request.model_name, request.model_version, request.id, error=error)
                    expired[index] = response
                    request.respond(response)
                    request.respond = ignore_response
            if len(expired) == len(requests):
                future.cancel()
                self.supervisor.recycle(worker, "execute() did not finish before the timeouts of all its requests expired")
                return BatchOutcome(None, [expired[i] for i in range(len(requests))], (now, now) * executions)
            if not deadlines:
                outcome = await future
                break
            wait_s = (min(deadlines.values()) - now) / 1e9
            done, _ = await asyncio.wait([future], timeout=wait_s)
            if done:
                outcome = future.result()
                break
        if not expired:
            return outcome
        if outcome.error is not None:  # the others get the batch's error, each in its own response
            error = outcome.error
            responses = [InferenceResponse(r.model_name, r.model_version, r.id, error=error) for r in requests]
        else:
            responses = list(outcome.responses or ())
        for index, response in expired.items():
            responses[index] = response
        return BatchOutcome(None, responses, outcome.times)
