"""The Python backend's channel: every message kind survives its framing with its fields named, the hot path's frame
builders stay equal to their messages, the blocking endpoint routes answers to the call that waits for them, and a
worker polls for its next request only while requests follow its answers closely."""

from __future__ import annotations

import ast
import inspect
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from nereid.backends.python import protocol
from nereid.backends.python.channel import BlockingChannel, CallError
from nereid.backends.python.protocol import (
    FRAME_BUILDERS,
    MESSAGE_KINDS,
    BlsResponse,
    Call,
    CallReply,
    Execute,
    Init,
    Log,
    Shutdown,
    encode,
    split_frames,
)

META = ("INPUT0", "FP32", (1, 4), 64, 16)
SRC = Path(__file__).resolve().parents[4] / "src" / "nereid"


def _sample(cls: type[Any]) -> Any:
    """A message of `cls` whose every field holds a distinct value."""
    return cls(*[(index, f"field {name}") for index, name in enumerate(cls._fields)])


def test_every_message_kind_has_its_own_byte() -> None:
    kinds = list(MESSAGE_KINDS.values())
    assert len(set(kinds)) == len(kinds) and all(0 < kind < 256 for kind in kinds)
    assert set(MESSAGE_KINDS) == set(protocol.Message.__args__)  # type: ignore[attr-defined]


@pytest.mark.parametrize("cls", list(MESSAGE_KINDS), ids=lambda cls: cls.__name__)
def test_every_message_comes_back_as_its_type_with_its_fields(cls: type[Any]) -> None:
    message = _sample(cls)
    messages, used = split_frames(encode(message))
    assert used == len(encode(message))
    assert messages == [message] and type(messages[0]) is cls
    for name in cls._fields:
        assert getattr(messages[0], name) == getattr(message, name)


def test_init_carries_exactly_what_the_worker_reads() -> None:
    # The server sends (args, model file, version folder) and the worker unpacks three fields: one schema for both.
    init = Init({"model_name": "m"}, "/models/m/1/model.py", "/models/m/1")
    (decoded,), _ = split_frames(encode(init))
    args, model_file, version_dir = decoded
    assert (args, model_file, version_dir) == ({"model_name": "m"}, "/models/m/1/model.py", "/models/m/1")


@pytest.mark.parametrize("cls", list(FRAME_BUILDERS), ids=lambda cls: cls.__name__)
def test_each_frame_builder_takes_its_messages_fields_and_frames_the_same_bytes(cls: type[Any]) -> None:
    builder = FRAME_BUILDERS[cls]
    assert tuple(inspect.signature(builder).parameters) == cls._fields
    message = _sample(cls)
    assert builder(*message) == encode(message)


def test_frames_are_cut_only_when_complete_and_several_at_once() -> None:
    frames = encode(Execute(1, 4096, [("id", 0, 0, 0, {}, None, (META,))], 0)) + encode(Shutdown())
    assert split_frames(frames[:3]) == ([], 0)
    first = len(frames) - len(encode(Shutdown()))
    assert split_frames(frames[:-1]) == ([Execute(1, 4096, [("id", 0, 0, 0, {}, None, (META,))], 0)], first)
    messages, used = split_frames(frames + b"\x07")
    assert messages == [Execute(1, 4096, [("id", 0, 0, 0, {}, None, (META,))], 0), Shutdown()] and used == len(frames)


def test_a_message_marshal_cannot_carry_is_refused_when_it_is_encoded() -> None:
    with pytest.raises(ValueError):
        encode(Log(0, object(), "model.py", 1))  # type: ignore[arg-type]


class _Server:
    """The far end of a BlockingChannel: reads frames and answers with what a test hands it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def read(self) -> Any:
        while True:
            messages, used = split_frames(self.buffer)
            if messages:
                assert len(messages) == 1, "the worker end sent more than the test expects"
                self.buffer = self.buffer[used:]
                return messages[0]
            chunk = self.sock.recv(65536)
            assert chunk, "the channel closed"
            self.buffer += chunk

    def send(self, message: Any) -> None:
        self.sock.sendall(encode(message))


@pytest.fixture
def pair() -> Any:
    worker_end, server_end = socket.socketpair()
    worker_end.settimeout(10)
    server_end.settimeout(10)
    channel = BlockingChannel(worker_end)
    yield channel, _Server(server_end)
    channel.close()
    server_end.close()


def test_a_call_gets_its_reply_while_other_messages_wait_for_recv(pair: Any) -> None:
    channel, server = pair
    answers: list[Any] = []
    thread = threading.Thread(target=lambda: answers.append(channel.call(protocol.CALL_FAMILY, ("f", "d", 0))))
    thread.start()
    call = server.read()
    assert isinstance(call, Call) and call.kind == protocol.CALL_FAMILY and call.payload == ("f", "d", 0)
    server.send(Shutdown())  # not an answer: kept for recv
    server.send(CallReply(call.call_id, None, 42))
    thread.join(10)
    assert answers == [42]
    assert channel.recv() == Shutdown()


def test_a_call_the_server_refuses_raises_its_error(pair: Any) -> None:
    channel, server = pair
    errors: list[CallError] = []

    def call() -> None:
        try:
            channel.call(protocol.CALL_LOAD, ("m", "", {}))
        except CallError as exc:
            errors.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    request = server.read()
    server.send(CallReply(request.call_id, (2, "no model 'm'"), None))
    thread.join(10)
    assert [(e.code, e.message) for e in errors] == [(2, "no model 'm'")]


def test_answers_go_to_the_sink_expecting_them_and_stray_ones_are_dropped(pair: Any) -> None:
    channel, server = pair
    received: list[Any] = []
    channel.expect(5, received.append)
    reply = BlsResponse(5, 4096, None, {"p": 1}, (META,), True, 1)
    server.send(BlsResponse(99, 4096, None, None, (), True, 2))  # nobody expects call 99
    server.send(reply)
    server.send(Shutdown())
    assert channel.recv() == Shutdown()
    assert received == [reply]
    server.sock.close()
    assert channel.recv() is None
    assert received == [reply, None]  # the sink hears that the channel closed


def _runtime_imports(module: str) -> set[str]:
    """The nereid modules a module imports when it is imported (not those under `if TYPE_CHECKING:`, nor the lazy
    ones inside functions)."""
    path = SRC.joinpath(*module.split(".")[1:])
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    found: set[str] = set()
    pending = list(ast.parse(path.read_text()).body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            pending.extend(node.orelse)
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("nereid"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)  # `from package import module`
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("nereid"))
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            pending.extend(ast.iter_child_nodes(node))
    return {name for name in found if _is_module(name)}


def _is_module(name: str) -> bool:
    path = SRC.joinpath(*name.split(".")[1:])
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_the_worker_side_imports_nothing_of_the_server() -> None:
    # A worker starts before it knows its model: what it imports is part of every cold start, and model code must
    # never reach the server's objects.
    seen: set[str] = set()
    pending = ["nereid.backends.python.worker"]
    while pending:
        module = pending.pop()
        if module not in seen:
            seen.add(module)
            pending.extend(_runtime_imports(module))
    server_side = ("nereid.server", "nereid.repository", "nereid.scheduling", "nereid.frontends", "nereid.config")
    server_modules = ("instance", "process", "worker_process", "bls_bridge", "model_calls", "backend")
    assert [m for m in seen if m.startswith(server_side)] == []
    assert [m for m in seen if m.rsplit(".", 1)[-1] in server_modules] == []
    assert "nereid.backends.python.model_worker" in seen and "nereid.core.dtypes" in seen


def _read_after(channel: BlockingChannel, sender: socket.socket, delay_s: float) -> tuple[Any, float]:
    """What channel.recv() returns for a Shutdown sent `delay_s` from now, and the CPU the reading thread spent."""
    timer = threading.Timer(delay_s, lambda: sender.sendall(encode(Shutdown())))
    timer.start()
    cpu = time.thread_time()
    message = channel.recv()
    spent = time.thread_time() - cpu
    timer.join()
    return message, spent


def test_a_channel_asked_to_poll_reads_its_next_message_without_sleeping_and_blocks_after_the_budget() -> None:
    worker_end, server_end = socket.socketpair()  # blocking, as a worker's socket is
    channel = BlockingChannel(worker_end)
    try:
        message, asleep = _read_after(channel, server_end, 0.05)
        assert message == Shutdown() and asleep < 0.02  # blocked in recv: hardly any CPU
        channel.poll_next(2_000_000_000)
        message, polling = _read_after(channel, server_end, 0.2)
        assert message == Shutdown() and polling > 0.05  # polled the socket meanwhile (a busy machine lends it less)
        channel.poll_next(1_000_000)  # a budget that runs out long before the message comes: then it blocks
        message, lapsed = _read_after(channel, server_end, 0.2)
        assert message == Shutdown() and lapsed < 0.05
    finally:
        channel.close()
        server_end.close()


def test_a_worker_polls_after_answering_only_while_requests_follow_its_answers_within_the_budget() -> None:
    from nereid.backends.python.model_worker import ModelWorker

    polls: list[int] = []
    worker = SimpleNamespace(answered_ns=0, wait_ns=0.0, channel=SimpleNamespace(poll_next=polls.append))
    budget = 1_000_000

    def answer_after(wait_ns: int) -> bool:
        """The worker answers a request that came `wait_ns` after its previous answer; whether it then polls."""
        before = len(polls)
        ModelWorker.poll_for_next(worker, budget, worker.answered_ns + wait_ns)  # type: ignore[arg-type]
        return len(polls) > before

    assert answer_after(0)  # the first request: nothing waited yet
    assert all(answer_after(300_000) for _ in range(5))  # a client at concurrency 1 sends its next at once
    pauses = [answer_after(50_000_000) for _ in range(5)]  # a client that pauses between requests
    assert pauses[0] and not pauses[-1]  # one pause is not enough to stop, a few are
    fast_again = [answer_after(200_000) for _ in range(8)]
    assert not fast_again[0] and fast_again[-1]  # back to polling once the waits are short again
    assert set(polls) == {budget}
