"""The life of an instance's worker process: start (a spare or a fresh one) and initialize, the health probe,
restart after a crash, replacement of a stuck worker, and the end (finalize, or a kill).

At most one worker serves the instance at a time; a restart makes a new `PythonWorkerProcess`. What travels on a
running worker's channel is `worker_process`'s job, not this one's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import TYPE_CHECKING

from nereid.backends.python.arena import Arena
from nereid.backends.python.channel import WorkerLink
from nereid.backends.python.custom_metrics import REGISTRY
from nereid.backends.python.protocol import Init, IsReady, Shutdown
from nereid.backends.python.worker_launch import LaunchedWorker, SpareWorkers, WorkerProcess, launch_worker
from nereid.backends.python.worker_process import PythonWorkerProcess
from nereid.core.errors import NereidError

if TYPE_CHECKING:
    from nereid.backends.python.instance import PythonInstance

__all__ = ["WorkerSupervisor", "SPARES", "describe_exit", "wait_exit", "EXIT_TIMEOUT_S"]

log = logging.getLogger("nereid.python")

_FINALIZE_TIMEOUT_S = 30.0
EXIT_TIMEOUT_S = 5.0
# How long the model-ready endpoint waits for a model's own is_ready() before it calls the model not ready.
_IS_READY_TIMEOUT_S = 5.0
# Spare workers, started ahead of need, for every Python model of this server (sized by the backend).
SPARES = SpareWorkers()


def describe_exit(code: int | None) -> str:
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


async def wait_exit(process: WorkerProcess, timeout: float) -> int:
    """The exit status of a worker that is exiting; killed if it is still there after `timeout` seconds."""
    code = process.poll()
    if code is not None:
        return code
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):
        fd = -1
    if fd >= 0:
        exited = loop.create_future()

        def readable() -> None:
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(fd, readable)
        try:
            async with asyncio.timeout(timeout):  # `exited` is ours alone: cancelling it at the timeout is harmless
                await exited
        except TimeoutError:
            pass
        finally:
            loop.remove_reader(fd)
            os.close(fd)
    else:
        try:
            await asyncio.wait_for(asyncio.to_thread(process.wait), timeout)
        except TimeoutError:
            pass
    code = process.poll()
    if code is None:
        process.kill()
        code = await asyncio.to_thread(process.wait)
    return code


class WorkerSupervisor:
    """Keeps one instance's worker running: `worker` is the one serving now (None while it restarts)."""

    def __init__(self, owner: PythonInstance) -> None:
        self.owner = owner
        self.label = owner.label
        self.worker: PythonWorkerProcess | None = None
        self._restart_task: asyncio.Task[None] | None = None
        self._restart_error = ""
        self.closing = False

    async def start(self) -> None:
        model_file = self.owner.model_file
        if not model_file.exists():
            raise NereidError.unavailable(f"{self.label}: unable to find '{model_file}'")
        self.worker = await self._spawn()

    async def _spawn(self) -> PythonWorkerProcess:
        launched = SPARES.take()
        if launched is None:
            try:
                launched = await launch_worker(self.owner.name)
            except OSError as exc:
                raise NereidError.unavailable(f"{self.label}: cannot start a Python backend worker: {exc}") from None
        try:
            return await self._initialize(launched)
        finally:
            SPARES.refill_soon()  # after this model is up: a new spare's imports do not slow its start

    async def _initialize(self, launched: LaunchedWorker) -> PythonWorkerProcess:
        loop = asyncio.get_running_loop()
        owner = self.owner
        worker = PythonWorkerProcess(owner, launched.process, Arena(launched.in_fd), Arena(launched.out_fd))
        try:
            transport, _ = await loop.create_unix_connection(lambda: WorkerLink(worker), sock=launched.channel)
            worker.transport = transport  # type: ignore[assignment]
            worker.send(Init(owner.args, str(owner.model_file), str(owner.context.version_path)))
            ready = await worker.ready
        except BaseException:
            await self._discard(worker)
            raise
        if ready.error is not None:
            await self._discard(worker)
            raise NereidError.unavailable(f"{self.label} failed to initialize: {ready.error[1]}")
        worker.has_is_ready = bool(ready.has_is_ready)
        worker.runs_each = bool(ready.runs_each)
        return worker

    async def _discard(self, worker: PythonWorkerProcess) -> None:
        """End a worker for good: kill it, fail whatever it still had, free its channel and arenas."""
        worker.alive = False
        if worker.process.poll() is None:
            worker.process.kill()
        code = await wait_exit(worker.process, EXIT_TIMEOUT_S)
        worker.fail(NereidError.unavailable(f"{self.label} was unloaded while this request was still executing"))
        worker.release()
        if not worker.gone.done():
            worker.gone.set_result(code)

    async def worker_exited(self, worker: PythonWorkerProcess) -> None:
        """The channel to a worker closed: collect its exit status, fail what it had, restart it."""
        code = await wait_exit(worker.process, EXIT_TIMEOUT_S)
        how = describe_exit(code)
        unexpected = not self.closing and worker.done.done() is False
        error = NereidError.internal(
            f"{self.label}: the Python backend worker (pid {worker.pid}) {how}"
            + ("; the instance is restarting" if unexpected else "")
        )
        worker.fail(error)
        worker.release()
        if not worker.gone.done():
            worker.gone.set_result(code)
        if worker is not self.worker or self.closing:
            return
        log.error("%s: the Python backend worker (pid %d) %s; restarting it", self.label, worker.pid, how)
        self.worker = None
        if self._restart_task is None or self._restart_task.done():
            self._restart_task = asyncio.get_running_loop().create_task(self._restart())

    async def _restart(self) -> None:
        try:
            self.worker = await self._spawn()
            self._restart_error = ""
            log.info("%s: the Python backend worker restarted (pid %d)", self.label, self.worker.pid)
        except NereidError as exc:
            self._restart_error = exc.message
            log.error("%s: cannot restart the Python backend worker: %s", self.label, exc.message)
        except Exception as exc:
            self._restart_error = f"{type(exc).__name__}: {exc}"
            log.exception("%s: cannot restart the Python backend worker", self.label)

    async def revive(self) -> PythonWorkerProcess:
        """The worker, once a restart (started now if none runs) has brought one up."""
        if self.closing:
            raise NereidError.unavailable(f"{self.label} is unloading")
        task = self._restart_task
        if task is None or task.done():
            task = self._restart_task = asyncio.get_running_loop().create_task(self._restart())
        await asyncio.shield(task)
        worker = self.worker
        if worker is None or not worker.alive:
            raise NereidError.unavailable(f"{self.label}: its worker could not be restarted: {self._restart_error}")
        return worker

    def recycle(self, worker: PythonWorkerProcess, reason: str) -> None:
        """Replace a worker that holds a batch nobody waits for any more: the next batch goes to a new one."""
        if worker is not self.worker:
            return
        log.warning("%s: %s; replacing its worker (pid %d)", self.label, reason, worker.pid)
        self.worker = None
        worker.process.kill()
        if not self.closing and (self._restart_task is None or self._restart_task.done()):
            self._restart_task = asyncio.get_running_loop().create_task(self._restart())

    async def close(self) -> None:
        self.closing = True
        task = self._restart_task
        if task is not None and not task.done():
            await asyncio.shield(task)
        worker = self.worker
        self.worker = None
        if worker is not None:
            if worker.alive and worker.pending:
                # A batch outlived the drain (a hung execute): the worker cannot read Shutdown until it returns.
                log.warning("%s: execute() still running at unload; ending the worker without finalize()", self.label)
                worker.process.kill()
            elif worker.alive:
                worker.send(Shutdown())
                # The worker exits as soon as finalize() has answered, so the exit (its pidfd) is awaited first:
                # the answer has usually been read by then, which saves the event-loop turns of waiting for it and
                # then for the channel's end (an eviction waits for this while the loads behind it queue). Its
                # last messages (finalize()'s log lines, then Done) may still be unread: they are read before the
                # channel closes (the channel's end settles `done` too).
                await wait_exit(worker.process, _FINALIZE_TIMEOUT_S + EXIT_TIMEOUT_S)
                try:
                    if not worker.done.done():
                        await asyncio.wait_for(asyncio.shield(worker.done), EXIT_TIMEOUT_S)
                    error = worker.done.result()
                    if error is not None:
                        log.error("%s", error[1])
                except (TimeoutError, NereidError):
                    pass
            if worker.alive or not worker.gone.done():
                await self._discard(worker)
        REGISTRY.release(self.owner.metrics_owner)

    async def ready(self) -> bool:
        """Whether the worker is up and the model's optional is_ready() says yes (within _IS_READY_TIMEOUT_S; a model
        without is_ready() costs no message)."""
        worker = self.worker
        if worker is None or not worker.alive:
            return False
        if not worker.has_is_ready:
            return True
        worker.next_probe += 1
        probe_id = worker.next_probe
        probe: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        worker.probes[probe_id] = probe
        worker.send(IsReady(probe_id))
        try:
            return await asyncio.wait_for(probe, _IS_READY_TIMEOUT_S)
        except TimeoutError:
            worker.probes.pop(probe_id, None)
            return False
