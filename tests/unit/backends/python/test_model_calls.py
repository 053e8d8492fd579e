"""`ModelCalls` between a fake worker and a fake server: every call a model makes gets exactly one CallReply, with its
value or the server's error as the (code, text) pb_utils raises, and the repository calls run as the worker's tasks
through the server's model-repository API."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from nereid.backends.python.custom_metrics import CustomMetrics
from nereid.backends.python.error_codes import CODE_OF_STATUS
from nereid.backends.python.model_calls import ModelCalls
from nereid.backends.python.protocol import (
    CALL_CANCELLED,
    CALL_FAMILY,
    CALL_LOAD,
    CALL_METRIC_VALUE,
    CALL_MODEL_READY,
    CALL_UNLOAD,
    Call,
    CallReply,
    Message,
)
from nereid.core.errors import NereidError, Status
from nereid.core.types import InferenceRequest
from tests.unit.backends.python.fakes import request

LABEL = "[model 'm' version 1] instance 'm_0'"


class FakeWorker:
    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.in_flight: dict[tuple[int, int], InferenceRequest] = {}

    def send(self, message: Message) -> None:
        self.sent.append(message)

    def request_of(self, seq: int, index: int) -> InferenceRequest | None:
        return self.in_flight.get((seq, index))

    def start_task(self, coroutine: Coroutine[Any, Any, None]) -> None:
        self.tasks.append(asyncio.get_running_loop().create_task(coroutine))


class FakeServer:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def load_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        self.calls.append(("load", (name, parameters)))
        if name == "broken":
            raise NereidError.invalid("failed to load 'broken'")

    async def unload_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        self.calls.append(("unload", (name, parameters)))

    def model_ready(self, name: str, version: str = "") -> bool:
        if name == "unknown":
            raise NereidError.not_found(f"unknown model '{name}'")
        return name == "ready"


def _answers(calls: ModelCalls, worker: FakeWorker, *messages: Call) -> list[Message]:
    async def main() -> list[Message]:
        for message in messages:
            calls.on_call(worker, message)  # type: ignore[arg-type]
        if worker.tasks:
            await asyncio.gather(*worker.tasks)
        return worker.sent

    result: list[Message] = asyncio.run(asyncio.wait_for(main(), 10))
    return result


def test_cancellation_is_read_off_the_request_in_flight() -> None:
    worker = FakeWorker()
    gone, staying = request("gone"), request("staying")
    gone.cancelled = True
    worker.in_flight = {(1, 0): gone, (1, 1): staying}
    calls = ModelCalls(None, CustomMetrics(), "m/1/m_0/test", LABEL)
    replies = _answers(
        calls, worker, Call(1, CALL_CANCELLED, (1, 0)), Call(2, CALL_CANCELLED, (1, 1)), Call(3, CALL_CANCELLED, (9, 0))
    )
    assert replies == [CallReply(1, None, True), CallReply(2, None, False), CallReply(3, None, False)]


def test_a_metric_family_belongs_to_the_instance_and_its_errors_come_back_as_pb_utils_codes() -> None:
    worker = FakeWorker()
    registry = CustomMetrics()
    calls = ModelCalls(None, registry, "m/1/m_0/test-calls", LABEL)
    replies = _answers(
        calls,
        worker,
        Call(1, CALL_FAMILY, ("test_calls_family", "made by the model", 0)),
        Call(2, CALL_METRIC_VALUE, ("test_calls_family", ())),
        Call(3, CALL_METRIC_VALUE, ("no_such_family", ())),
        Call(4, "no_such_call", None),
    )
    assert replies[:2] == [CallReply(1, None, None), CallReply(2, None, 0.0)]
    assert replies[2] == CallReply(
        3, (CODE_OF_STATUS[Status.NOT_FOUND], "metric family 'no_such_family' does not exist"), None
    )
    assert replies[3] == CallReply(4, (CODE_OF_STATUS[Status.UNSUPPORTED], "unknown call 'no_such_call'"), None)
    assert [m.name for m in registry.collect()] == ["test_calls_family"]
    registry.release("m/1/m_0/test-calls")
    assert not any(m.name == "test_calls_family" for m in registry.collect())


def test_the_repository_calls_go_to_the_servers_api() -> None:
    worker = FakeWorker()
    server = FakeServer()
    calls = ModelCalls(server, CustomMetrics(), "m/1/m_0/test", LABEL)  # type: ignore[arg-type]
    replies = _answers(
        calls,
        worker,
        Call(1, CALL_LOAD, ("other", '{"max_batch_size": 4}', {"file:1/model.py": b"x"})),
        Call(2, CALL_LOAD, ("broken", "", {})),
        Call(3, CALL_UNLOAD, ("other", True)),
        Call(4, CALL_MODEL_READY, ("ready", "")),
        Call(5, CALL_MODEL_READY, ("unknown", "")),
    )
    assert server.calls == [
        ("load", ("other", {"file:1/model.py": b"x", "config": '{"max_batch_size": 4}'})),
        ("load", ("broken", {})),
        ("unload", ("other", {"unload_dependents": True})),
    ]
    assert sorted(replies, key=lambda r: r.call_id) == [  # type: ignore[union-attr]
        CallReply(1, None, None),
        CallReply(2, (CODE_OF_STATUS[Status.INVALID_ARG], "failed to load 'broken'"), None),
        CallReply(3, None, None),
        CallReply(4, None, True),
        CallReply(5, None, False),
    ]


def test_without_a_server_the_repository_calls_are_unavailable() -> None:
    calls = ModelCalls(None, CustomMetrics(), "m/1/m_0/test", LABEL)
    replies = _answers(calls, FakeWorker(), Call(1, CALL_UNLOAD, ("other", False)))
    assert replies == [
        CallReply(1, (CODE_OF_STATUS[Status.UNAVAILABLE], "the model-repository API needs the in-process server"), None)
    ]
