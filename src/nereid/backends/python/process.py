"""The life of an instance's worker process: start (a spare or a fresh one) and initialize, the health probe,
restart after a crash, replacement of a stuck worker, and the end (finalize, or a kill).

At most one worker serves the instance at a time; a restart makes a new `PythonWorkerProcess`, wired to the
instance's BLS bridge and model calls through its `WorkerHooks`. What travels on a running worker's channel is
`worker_process`'s job, not this one's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from nereid.backends.python.arena import Arena
from nereid.backends.python.backend_state import PythonBackendState
from nereid.backends.python.bls_bridge import BlsBridge
from nereid.backends.python.channel import WorkerLink
from nereid.backends.python.execution_env import ExecutionEnv
from nereid.backends.python.model_calls import ModelCalls
from nereid.backends.python.protocol import Init, Shutdown
from nereid.backends.python.worker_launch import LaunchedWorker, WorkerProcess
from nereid.backends.python.worker_process import PythonWorkerProcess, WorkerHooks
from nereid.core.errors import NereidError
from nereid.core.server_handle import ServerHandle

__all__ = ["WorkerSpec", "WorkerSupervisor", "describe_exit", "wait_exit", "EXIT_TIMEOUT_S"]

log = logging.getLogger("nereid.python")

_FINALIZE_TIMEOUT_S = 30.0
EXIT_TIMEOUT_S = 5.0
# How long the model-ready endpoint waits for a model's own is_ready() before it calls the model not ready.
_IS_READY_TIMEOUT_S = 5.0


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


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What the supervisor needs to know of its instance, handed down by the instance."""

    label: str  # "[model 'm' version 1] instance 'm_0'": how every message names the instance
    name: str  # the instance's name (its worker processes are labelled with it)
    model_file: Path
    version_dir: str
    args: dict[str, str]  # the model's initialize(args)
    decoupled: bool
    metrics_owner: str  # who owns the custom metric families its models create
    server: ServerHandle | None  # the in-process Server, for BLS and the model-repository API
    execution_env: ExecutionEnv | None = None  # the model's own Python environment (EXECUTION_ENV_PATH), if any


class WorkerSupervisor:
    """Keeps one instance's worker running: `worker` is the one serving now (None while it restarts).

    `state` is the Server's Python backend's: a new worker is one of its spares when one waits, else one that
    `launch` starts (the state's own launch by default); its custom metrics go to the state's registry. A model with
    an environment of its own takes no spare (they run in the server's environment)."""

    def __init__(
        self,
        spec: WorkerSpec,
        state: PythonBackendState,
        launch: Callable[[str], Awaitable[LaunchedWorker]] | None = None,
    ) -> None:
        self.spec = spec
        self.label = spec.label
        own_env = spec.execution_env
        if launch is None:
            launch = state.launch if own_env is None else partial(state.launch, execution_env=own_env)
        self.launch = launch
        self.spares = state.spares if own_env is None else None
        self.metrics = state.metrics
        self.hooks = WorkerHooks(
            exited=self._exited,
            bls_request=BlsBridge(spec.server, spec.label).on_request,
            call=ModelCalls(spec.server, state.metrics, spec.metrics_owner, spec.label).on_call,
            metrics=state.metrics.apply,
        )
        self.worker: PythonWorkerProcess | None = None
        self._restart_task: asyncio.Task[None] | None = None
        self._restart_error = ""
        self._exits: set[asyncio.Task[None]] = set()  # held, so that the loop does not drop them
        self.closing = False

    async def start(self) -> None:
        model_file = self.spec.model_file
        if not model_file.exists():
            raise NereidError.unavailable(f"{self.label}: unable to find '{model_file}'")
        self.worker = await self._spawn()

    async def _spawn(self) -> PythonWorkerProcess:
        launched = self.spares.take() if self.spares is not None else None
        if launched is None:
            try:
                launched = await self.launch(self.spec.name)
            except OSError as exc:
                raise NereidError.unavailable(f"{self.label}: cannot start a Python backend worker: {exc}") from None
        try:
            return await self._initialize(launched)
        finally:
            if self.spares is not None:
                self.spares.refill_soon()  # after this model is up: a new spare's imports do not slow its start

    async def _initialize(self, launched: LaunchedWorker) -> PythonWorkerProcess:
        loop = asyncio.get_running_loop()
        spec = self.spec
        worker = PythonWorkerProcess(
            spec.label, spec.decoupled, launched.process, Arena(launched.in_fd), Arena(launched.out_fd), self.hooks
        )
        try:
            transport, _ = await loop.create_unix_connection(lambda: WorkerLink(worker), sock=launched.channel)
            worker.transport = transport  # type: ignore[assignment]
            worker.send(Init(spec.args, str(spec.model_file), spec.version_dir))
            ready = await worker.ready
        except BaseException:
            await self._discard(worker)
            raise
        if ready.error is not None:
            await self._discard(worker)
            raise NereidError.unavailable(f"{self.label} failed to initialize: {ready.error[1]}")
        worker.has_is_ready = bool(ready.has_is_ready)
        worker.runs_groups = bool(ready.runs_groups)
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

    def _exited(self, worker: PythonWorkerProcess) -> None:
        task = asyncio.get_running_loop().create_task(self.worker_exited(worker))
        self._exits.add(task)
        task.add_done_callback(self._exits.discard)

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

    def recycle(self, worker: object, reason: str) -> None:
        """Replace `worker` (when it still serves) because it holds a batch nobody waits for any more: the next batch
        goes to a new one."""
        current = self.worker
        if current is None or worker is not current:
            return
        log.warning("%s: %s; replacing its worker (pid %d)", self.label, reason, current.pid)
        self.worker = None
        current.process.kill()
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
        self.metrics.release(self.spec.metrics_owner)

    async def ready(self) -> bool:
        """Whether the worker is up and the model's optional is_ready() says yes (within _IS_READY_TIMEOUT_S; a model
        without is_ready() costs no message)."""
        worker = self.worker
        if worker is None or not worker.alive:
            return False
        if not worker.has_is_ready:
            return True
        return await worker.model_ready(_IS_READY_TIMEOUT_S)
