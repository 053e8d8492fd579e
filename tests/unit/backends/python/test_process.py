"""`WorkerSupervisor` over launched workers that are threads speaking the channel's protocol (its `launch` seam,
no spare pool): a start initializes the worker with the instance's args, a failed start says why, a worker that
dies fails what it had and is restarted, a stuck one is replaced, the health probe asks the model, and a close asks
for finalize() and waits for the exit. The worker's calls reach the instance's model calls through the hooks."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from nereid.backends.python.arena import create_arena_fd
from nereid.backends.python.backend_state import PythonBackendState
from nereid.backends.python.channel import BlockingChannel
from nereid.backends.python.process import WorkerSpec, WorkerSupervisor, describe_exit
from nereid.backends.python.protocol import (
    CALL_FAMILY,
    Done,
    Execute,
    Init,
    IsReady,
    Message,
    Ready,
    ReadyState,
    Shutdown,
)
from nereid.backends.python.worker_launch import LaunchedWorker
from nereid.core.errors import NereidError, Status
from tests.unit.backends.python.fakes import FakeProcess, request

LABEL = "[model 'm' version 1] instance 'm_0'"


class ScriptedWorker:
    """A worker process played by a thread on the far end of the channel: it answers Init with Ready (an error when
    `init_error`), IsReady with `model_ready`, Shutdown with Done (then exits with 0), and leaves Execute unanswered.
    `after_init` runs on its channel once it is ready (a model's calls into the server). Killing its process
    closes its end of the channel, as a death does."""

    def __init__(
        self,
        init_error: str | None = None,
        has_is_ready: bool = False,
        model_ready: bool = True,
        after_init: Callable[[BlockingChannel], None] | None = None,
    ) -> None:
        self.init_error = init_error
        self.has_is_ready = has_is_ready
        self.model_ready = model_ready
        self.after_init = after_init
        self.received: list[Message] = []
        self.process = FakeProcess()
        self.thread: threading.Thread | None = None

    def launch(self) -> LaunchedWorker:
        server_end, worker_end = socket.socketpair()
        self.process.on_kill = lambda: worker_end.shutdown(socket.SHUT_RDWR)
        self.thread = threading.Thread(target=self._serve, args=(worker_end,), daemon=True)
        self.thread.start()
        return LaunchedWorker(self.process, server_end, create_arena_fd("test-in"), create_arena_fd("test-out"))  # type: ignore[arg-type]

    def _serve(self, sock: socket.socket) -> None:
        channel = BlockingChannel(sock)
        try:
            while (message := channel.recv()) is not None:
                self.received.append(message)
                if isinstance(message, Init):
                    error = None if self.init_error is None else (1, self.init_error)
                    channel.send(Ready(error, self.process.pid, self.has_is_ready, False))
                    if self.after_init is not None:
                        self.after_init(channel)
                elif isinstance(message, IsReady):
                    channel.send(ReadyState(message.call_id, self.model_ready))
                elif isinstance(message, Shutdown):
                    channel.send(Done(None))
                    break
        except OSError:
            pass  # killed
        finally:
            channel.close()
            self.process.exit(0)


class Launcher:
    """The supervisor's `launch`: hands out the scripted workers in turn (a new one like the last when they run
    out), or fails as an OS would."""

    def __init__(self, *workers: ScriptedWorker, error: OSError | None = None) -> None:
        self.workers = list(workers)
        self.launched: list[ScriptedWorker] = []
        self.labels: list[str] = []
        self.error = error

    async def __call__(self, label: str) -> LaunchedWorker:
        self.labels.append(label)
        if self.error is not None:
            raise self.error
        worker = self.workers.pop(0) if self.workers else ScriptedWorker()
        self.launched.append(worker)
        return worker.launch()


def _spec(tmp_path: Path, model_file: Path | None = None) -> WorkerSpec:
    if model_file is None:
        model_file = tmp_path / "model.py"
        model_file.write_text("")
    return WorkerSpec(
        label=LABEL,
        name="m_0",
        model_file=model_file,
        version_dir=str(tmp_path),
        args={"model_name": "m", "model_instance_name": "m_0"},
        decoupled=False,
        metrics_owner="m/1/m_0/test",
        server=None,
    )


def _supervisor(tmp_path: Path, launcher: Launcher) -> WorkerSupervisor:
    return WorkerSupervisor(_spec(tmp_path), PythonBackendState(), launch=launcher)


def _run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 20))


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.005)


def test_a_start_initializes_a_launched_worker_with_the_instances_args(tmp_path: Path) -> None:
    async def main() -> None:
        scripted = ScriptedWorker()
        launcher = Launcher(scripted)
        supervisor = _supervisor(tmp_path, launcher)
        await supervisor.start()
        worker = supervisor.worker
        assert worker is not None and worker.alive and not worker.has_is_ready and not worker.runs_groups
        assert launcher.labels == ["m_0"]
        (init,) = scripted.received
        assert init == Init(supervisor.spec.args, str(tmp_path / "model.py"), str(tmp_path))
        assert await supervisor.ready()  # a model without is_ready(): no question asked
        assert len(scripted.received) == 1
        await supervisor.close()

    _run(main())


def test_a_model_file_that_is_missing_refuses_the_start(tmp_path: Path) -> None:
    async def main() -> None:
        launcher = Launcher()
        supervisor = WorkerSupervisor(_spec(tmp_path, tmp_path / "absent.py"), PythonBackendState(), launch=launcher)
        with pytest.raises(NereidError) as raised:
            await supervisor.start()
        assert raised.value.status is Status.UNAVAILABLE
        assert raised.value.message == f"{LABEL}: unable to find '{tmp_path / 'absent.py'}'"
        assert launcher.labels == []

    _run(main())


def test_a_worker_that_cannot_start_is_unavailable(tmp_path: Path) -> None:
    async def main() -> None:
        supervisor = _supervisor(tmp_path, Launcher(error=OSError("no more processes")))
        with pytest.raises(NereidError) as raised:
            await supervisor.start()
        assert raised.value.status is Status.UNAVAILABLE
        assert raised.value.message == f"{LABEL}: cannot start a Python backend worker: no more processes"

    _run(main())


def test_a_worker_whose_initialize_failed_is_ended_and_its_error_told(tmp_path: Path) -> None:
    async def main() -> None:
        scripted = ScriptedWorker(init_error="ValueError: no weights")
        supervisor = _supervisor(tmp_path, Launcher(scripted))
        with pytest.raises(NereidError) as raised:
            await supervisor.start()
        assert raised.value.status is Status.UNAVAILABLE
        assert raised.value.message == f"{LABEL} failed to initialize: ValueError: no weights"
        assert scripted.process.killed == 1 and supervisor.worker is None

    _run(main())


def test_a_worker_that_dies_fails_its_batch_and_a_new_one_takes_its_place(tmp_path: Path) -> None:
    async def main() -> None:
        first = ScriptedWorker()
        launcher = Launcher(first)
        supervisor = _supervisor(tmp_path, launcher)
        await supervisor.start()
        worker = supervisor.worker
        assert worker is not None
        _, batch = worker.submit([request("a")])
        await _until(lambda: any(isinstance(m, Execute) for m in first.received))
        first.process.kill()  # it dies in execute()
        with pytest.raises(NereidError) as raised:
            await batch
        assert raised.value.status is Status.INTERNAL
        assert raised.value.message == (
            f"{LABEL}: the Python backend worker (pid 0) was killed by SIGKILL; the instance is restarting"
        )
        await _until(lambda: supervisor.worker is not None and supervisor.worker is not worker)
        assert len(launcher.launched) == 2 and worker.gone.result() == -9
        revived = await supervisor.revive()
        assert revived is supervisor.worker and revived.alive
        await supervisor.close()

    _run(main())


def test_a_worker_holding_an_abandoned_batch_is_replaced(tmp_path: Path) -> None:
    async def main() -> None:
        first = ScriptedWorker()
        launcher = Launcher(first)
        supervisor = _supervisor(tmp_path, launcher)
        await supervisor.start()
        worker = supervisor.worker
        supervisor.recycle(object(), "not the worker that serves")  # (a worker replaced already, say)
        assert supervisor.worker is worker and first.process.killed == 0
        supervisor.recycle(worker, "execute() did not finish before the timeouts of all its requests expired")
        assert supervisor.worker is None and first.process.killed == 1
        revived = await supervisor.revive()
        assert revived is not worker and len(launcher.launched) == 2
        await supervisor.close()
        with pytest.raises(NereidError, match="is unloading"):
            await supervisor.revive()

    _run(main())


def test_the_health_probe_asks_a_model_that_has_is_ready(tmp_path: Path) -> None:
    async def main() -> None:
        scripted = ScriptedWorker(has_is_ready=True, model_ready=False)
        supervisor = _supervisor(tmp_path, Launcher(scripted))
        await supervisor.start()
        assert await supervisor.ready() is False
        scripted.model_ready = True
        assert await supervisor.ready() is True
        assert [type(m) for m in scripted.received] == [Init, IsReady, IsReady]
        await supervisor.close()
        assert await supervisor.ready() is False  # no worker any more

    _run(main())


def test_a_close_asks_for_finalize_waits_for_the_exit_and_lets_the_models_metrics_go(tmp_path: Path) -> None:
    async def main() -> None:
        def create_family(channel: BlockingChannel) -> None:
            channel.call(CALL_FAMILY, ("test_close_family", "made by the model", 0))

        scripted = ScriptedWorker(after_init=create_family)
        supervisor = _supervisor(tmp_path, Launcher(scripted))
        await supervisor.start()
        worker = supervisor.worker
        assert worker is not None
        await _until(lambda: any(m.name == "test_close_family" for m in supervisor.metrics.collect()))
        await supervisor.close()
        assert isinstance(scripted.received[-1], Shutdown) and scripted.process.killed == 0
        assert worker.gone.done() and not worker.alive and supervisor.worker is None
        assert not any(m.name == "test_close_family" for m in supervisor.metrics.collect())  # its only owner unloaded

    _run(main())


def test_a_close_while_a_batch_still_runs_kills_the_worker_without_finalize(tmp_path: Path) -> None:
    async def main() -> None:
        scripted = ScriptedWorker()
        supervisor = _supervisor(tmp_path, Launcher(scripted))
        await supervisor.start()
        worker = supervisor.worker
        assert worker is not None
        _, batch = worker.submit([request("a")])
        await supervisor.close()
        assert scripted.process.killed >= 1 and not any(isinstance(m, Shutdown) for m in scripted.received)
        with pytest.raises(NereidError):
            await batch

    _run(main())


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (None, "stopped answering"),
        (-9, "was killed by SIGKILL"),
        (-200, "was killed by signal 200"),
        (3, "exited with code 3"),
    ],
)
def test_an_exit_is_told_in_words(code: int | None, words: str) -> None:
    assert describe_exit(code) == words


def test_fake_processes_never_name_a_real_one() -> None:
    with pytest.raises(OSError):
        os.pidfd_open(FakeProcess().pid)  # so wait_exit waits through the fake's wait()
