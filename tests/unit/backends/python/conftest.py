"""The worker side's fixture: a ModelWorker in this process with the server's end of its channel."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from functools import partial

import pytest

from nereid.backends.python import pb_runtime, pb_utils
from nereid.backends.python.bls_client import exec_async, exec_blocking
from nereid.backends.python.model_worker import ModelWorker
from nereid.backends.python.worker_runtime import ModelWorkerHooks, Runtime
from tests.unit.backends.python.worker_fakes import ServerEnd


@pytest.fixture()
def served_worker(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ServerEnd, ModelWorker]]:
    """A ModelWorker wired as the worker's entry point wires it (pb_utils talks to its Runtime, BLS goes through
    bls_client), whose server end is a ServerEnd; the model module and sys.path it adds are taken back afterwards."""
    server = ServerEnd()
    runtime = Runtime(server.channel, "")
    worker = ModelWorker(server.channel, runtime, server.inputs, server.outputs)
    runtime.attach(
        ModelWorkerHooks(
            "m_0", bls=partial(exec_blocking, worker), bls_async=partial(exec_async, worker), send_response=worker.send_response
        )
    )
    monkeypatch.setattr(pb_runtime, "current", runtime)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb_utils)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "model", raising=False)
    try:
        yield server, worker
    finally:
        sys.modules.pop("model", None)
        if worker.loop is not None:
            worker.loop.close()
        server.close()
