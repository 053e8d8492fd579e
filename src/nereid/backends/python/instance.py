"""One instance of a Python-backend model as the scheduler sees it: it hands each batch to the instance's worker
and turns the outcome into responses, execution times and per-request timeouts.

This runs on the same event loop as the HTTP and gRPC frontends, so the per-request work here is kept small: a
batch goes out as one Execute message and comes back as one Result. The worker's life (start, restart, stop) is
the supervisor's (`process`), the messages on its channel `worker_process`'s.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from nereid.backends.base import ExecutionTimes, InstanceSpec, ModelContext
from nereid.backends.python.error_codes import STATUS_OF_CODE
from nereid.backends.python.process import WorkerSupervisor
from nereid.backends.python.protocol import RESCHEDULED_CODE
from nereid.backends.python.worker_process import BatchOutcome, PythonWorkerProcess, ignore_response
from nereid.config.model_config import config_to_json_dict
from nereid.core.errors import NereidError
from nereid.core.hot_loop import HOT_WAIT_NS
from nereid.core.types import InferenceRequest, InferenceResponse

__all__ = ["PythonInstance", "EACH_MOST", "EACH_HOLD_NS"]

# An ExecuteEach carries at most EACH_MOST requests, and only as many as keep its first response waiting for the
# others' executions no longer than EACH_HOLD_NS: lots pay off for fast models, whose hand-overs cost as much as
# their executions, and would only delay the answers of slow ones.
EACH_MOST = 8
EACH_HOLD_NS = 500_000
# With one request in flight (see HotLoop), the worker polls this long for the next request after answering,
# where a worker that blocks at once would leave its vCPU to halt: on a virtual machine waking it again cost more
# than the request's own work, and at concurrency 1 that wake is on every request's path. The wait spans the
# server's answer, the client's turn and the next hand-over, so it is longer than the loop's own HOT_WAIT_NS.
# Not on a single CPU, where the polling worker would only stand in the way of the server and the client.
_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
WORKER_POLL_NS = 1_000_000 if _CPUS > 1 else 0


class PythonInstance:
    """One instance of a Python model: a worker process that the instance restarts when it dies."""

    # The scheduler may hand over the next batch while this one executes: the worker runs them one after
    # the other, and the round trip through the server no longer leaves it idle between batches.
    pipelined_batches = 2

    def __init__(self, context: ModelContext, spec: InstanceSpec) -> None:
        self.name = spec.name
        self.context = context
        self.spec = spec
        self.label = f"[model '{context.name}' version {context.version}] instance '{spec.name}'"
        self.metrics_owner = f"{context.name}/{context.version}/{spec.name}/{id(self)}"
        self.decoupled = bool(context.config.model_transaction_policy.decoupled)
        self.model_file = context.model_file("model.py")
        self.args = {
            "model_config": json.dumps(config_to_json_dict(context.config), separators=(",", ":")),
            "model_instance_kind": spec.kind,
            "model_instance_name": spec.name,
            "model_instance_device_id": str(spec.device_id),
            "model_repository": str(context.model_path),
            "model_version": str(context.version),
            "model_name": context.name,
        }
        self.supervisor = WorkerSupervisor(self)
        self._round_trip_ns = 0.0  # the worker's recent answer time, submit to result (an average)
        self._worker_free_ns = 0  # when the worker's execute() of the batch before returned (its own stamp)
        self._execute_ns = float(EACH_HOLD_NS)  # how long its execute() takes (an average; lots start small)

    @property
    def each_limit(self) -> int:
        """How many queued requests may go as one ExecuteEach: none unless the worker's model allows it (it says
        so when it starts), and only as many as hold the first one's response back by EACH_HOLD_NS at most."""
        worker = self.supervisor.worker
        if worker is None or not worker.runs_each:
            return 1
        return min(EACH_MOST, 1 + int(EACH_HOLD_NS // (self._execute_ns or 1)))

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
        server = self.context.server
        # A lone request whose worker usually answers within the budget keeps the loop polling meanwhile, and the
        # worker polls for the next request after answering (see WORKER_POLL_NS).
        hot = None
        if server is not None and server.alone and self._round_trip_ns < HOT_WAIT_NS:
            hot = server.hot_loop if server.hot_loop.hold(HOT_WAIT_NS) else None
        t0 = time.monotonic_ns()
        seq, future = worker.submit(requests, poll_ns=0 if hot is None else WORKER_POLL_NS)
        timeouts = False
        if not self.decoupled:  # a decoupled model may stream for as long as it likes
            for request in requests:
                if request.timeout_us:
                    timeouts = True
                    break
        if timeouts:
            batch_error, decoded, times = await self._await_with_timeouts(worker, future, requests, 1)
        else:
            batch_error, decoded, times = await future
        if hot is not None:
            hot.release()
        now = time.monotonic_ns()
        self._round_trip_ns = 0.8 * self._round_trip_ns + 0.2 * (now - t0)
        execution = self._times(t0, times[0], times[1], now)
        if batch_error is not None:
            error = NereidError(STATUS_OF_CODE[batch_error[0]], batch_error[1])
            if self.decoupled:
                worker.end_streams(seq, len(requests), error)
            raise error
        if self.decoupled:
            if decoded is not None:  # an iterative_sequence model tells which requests it rescheduled
                for index, (request, (error, _, _)) in enumerate(zip(requests, decoded, strict=True)):
                    if error is not None and error[0] == RESCHEDULED_CODE:
                        request.rescheduled = True
                        worker.streams.pop((seq, index), None)  # its next execution streams under a new key
            return [], execution  # responses went out as they came
        return self._responses(requests, decoded), execution

    async def execute_each(self, requests: list[InferenceRequest]) -> list[tuple[InferenceResponse, ExecutionTimes]]:
        """Requests of a model without batching that queued behind a running one, handed over as one ExecuteEach:
        the worker calls execute() once per request, and each request has its own response and times. A
        request's compute output runs until the last execute() of the lot has returned (its response waits for
        the lot's one Result)."""
        worker = self.supervisor.worker
        if worker is None or not worker.alive:
            worker = await self.supervisor.revive()
        t0 = time.monotonic_ns()
        _, future = worker.submit(requests, each=True)
        if any(request.timeout_us for request in requests):
            batch_error, decoded, times = await self._await_with_timeouts(worker, future, requests, len(requests))
        else:
            batch_error, decoded, times = await future
        now = time.monotonic_ns()
        if batch_error is not None:  # (a worker answers each request's own error in its response)
            raise NereidError(STATUS_OF_CODE[batch_error[0]], batch_error[1])
        executions = [self._times(t0, times[2 * i], times[2 * i + 1], now) for i in range(len(requests))]
        return list(zip(self._responses(requests, decoded), executions, strict=True))

    def _times(self, t0: int, t1: int, t2: int, now: int) -> ExecutionTimes:
        """An execute() the worker ran from t1 to t2 (the server's monotonic clock) for a submit at t0 whose answer
        was read at `now`: before it is input, after it output. Submitted while the worker still ran the execute()
        before, it waited in the worker until that one ended: queue time. The worker may start while submit() is
        still returning here, so nothing is measured on both sides."""
        waited = max(0, min(t1, self._worker_free_ns) - t0)
        self._worker_free_ns = t2
        self._execute_ns = 0.8 * self._execute_ns + 0.2 * (t2 - t1)
        return ExecutionTimes(t1 - t0 - waited, t2 - t1, now - t2, waited)

    @staticmethod
    def _responses(requests: list[InferenceRequest], decoded: list[tuple[Any, Any, Any]]) -> list[InferenceResponse]:
        """Each request's response from what its worker answered: an error, or outputs and parameters."""
        responses = []
        for request, (error, parameters, tensors) in zip(requests, decoded, strict=True):
            if error is not None:
                if isinstance(error, NereidError):
                    responses.append(
                        InferenceResponse(request.model_name, request.model_version, request.id, error=error)
                    )
                    continue
                if error[0] == RESCHEDULED_CODE:  # runs again; the sequence batcher never sends this response
                    request.rescheduled = True
                    responses.append(InferenceResponse(request.model_name, request.model_version, request.id))
                    continue
                responses.append(
                    InferenceResponse(
                        request.model_name,
                        request.model_version,
                        request.id,
                        error=NereidError(STATUS_OF_CODE[error[0]], error[1]),
                    )
                )
            elif parameters:
                responses.append(
                    InferenceResponse(request.model_name, request.model_version, request.id, tensors, parameters)
                )
            else:
                responses.append(InferenceResponse(request.model_name, request.model_version, request.id, tensors))
        return responses

    async def _await_with_timeouts(
        self,
        worker: PythonWorkerProcess,
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
        expired: dict[int, NereidError] = {}
        while True:
            now = time.monotonic_ns()
            for index, deadline in list(deadlines.items()):
                if deadline <= now:
                    del deadlines[index]
                    request = requests[index]
                    error = NereidError.unavailable(
                        f"Request timeout expired: {self.label} did not answer within {request.timeout_us} us"
                    )
                    expired[index] = error
                    request.respond(
                        InferenceResponse(request.model_name, request.model_version, request.id, error=error)
                    )
                    request.respond = ignore_response
            if len(expired) == len(requests):
                future.cancel()
                self.supervisor.recycle(worker, "execute() did not finish before the timeouts of all its requests expired")
                return None, [(expired[i], None, None) for i in range(len(requests))], (now, now) * executions
            if not deadlines:
                result = await future
                break
            wait_s = (min(deadlines.values()) - now) / 1e9
            done, _ = await asyncio.wait([future], timeout=wait_s)
            if done:
                result = future.result()
                break
        batch_error, decoded, times = result
        if expired:
            if batch_error is not None:
                decoded = [(batch_error, None, None)] * len(requests)
                batch_error = None
            decoded = [(expired[i], None, None) if i in expired else entry for i, entry in enumerate(decoded)]
        return batch_error, decoded, times
