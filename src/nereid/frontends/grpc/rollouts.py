"""gRPC rollouts: the service `nereid.rollouts.v1.Rollouts` (docs/rollouts.md), the gRPC twin of the HTTP routes
under /v2/nereid/rollouts. Its messages are `google.protobuf.Struct`, holding the same JSON objects as the HTTP
routes, so a client needs no generated code of Nereid's: any gRPC library with protobuf's well-known types calls it.
Only translation: the rollout logic is the Server's."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf import json_format, struct_pb2

from nereid.core.errors import NereidError
from nereid.frontends.grpc.methods import Method

__all__ = ["ROLLOUT_SERVICE", "rollout_methods"]

ROLLOUT_SERVICE = "nereid.rollouts.v1.Rollouts"
_ACTIONS = ("Pause", "Resume", "Abort", "Promote", "Undo")


def _struct(value: dict[str, Any]) -> struct_pb2.Struct:
    message = struct_pb2.Struct()
    message.update(value)
    return message


def _text(request: struct_pb2.Struct, key: str, required: bool = True) -> str:
    value = json_format.MessageToDict(request).get(key, "")
    if isinstance(value, float) and value.is_integer():
        value = str(int(value))  # a version sent as a number
    if not isinstance(value, str) or (required and not value):
        raise NereidError.invalid(f"rollout request: '{key}' must be a{' non-empty' if required else ''} string")
    return value


def rollout_methods(server: Any, abort: Callable[[Any, NereidError], Awaitable[None]]) -> dict[str, Method]:
    """The service's methods over `server` (the in-process Server's rollout API); `abort` ends a call with an
    error's status."""

    def method(body: Callable[[struct_pb2.Struct], Awaitable[dict[str, Any]]]) -> Method:
        async def handler(request: struct_pb2.Struct, context: Any) -> struct_pb2.Struct:
            try:
                return _struct(await body(request))
            except NereidError as exc:
                await abort(context, exc)
                raise  # abort raised already

        return Method(handler, struct_pb2.Struct.FromString, streaming=False)

    async def start(request: struct_pb2.Struct) -> dict[str, Any]:
        model, version = _text(request, "model"), _text(request, "version")
        return await server.start_rollout(model, version, _text(request, "steps"), _text(request, "sticky_key", False))

    async def status(request: struct_pb2.Struct) -> dict[str, Any]:
        return server.rollout_status(_text(request, "model", False))  # type: ignore[no-any-return]

    async def history(request: struct_pb2.Struct) -> dict[str, Any]:
        return server.rollout_history(_text(request, "model"))  # type: ignore[no-any-return]

    def action(name: str) -> Callable[[struct_pb2.Struct], Awaitable[dict[str, Any]]]:
        async def act(request: struct_pb2.Struct) -> dict[str, Any]:
            return await server.rollout_action(_text(request, "model"), name.lower())  # type: ignore[no-any-return]

        return act

    bodies = {"Start": start, "Status": status, "History": history, **{name: action(name) for name in _ACTIONS}}
    return {f"/{ROLLOUT_SERVICE}/{name}": method(body) for name, body in bodies.items()}
