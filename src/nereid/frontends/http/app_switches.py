"""What the HTTP/1.1 server may ask of the app it serves, beyond the call itself: switches an app declares
(typed protocols checked with isinstance), so that the server never looks members up by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

__all__ = ["DirectInferApp", "HeaderCaseApp", "TracingApp"]


@runtime_checkable
class HeaderCaseApp(Protocol):
    """An app that reads header names as sent (HttpApp with a header forward pattern), not lower-cased."""

    keeps_header_case: bool


@runtime_checkable
class TracingApp(Protocol):
    """An app that traces requests (HttpApp): while its switch is on, connections stamp each request's times."""

    tracing: Any


@runtime_checkable
class DirectInferApp(Protocol):
    """An app that answers /infer without a task (HttpApp): `start_infer(path, headers, body, answer)` returns a
    handle whose `cancelled` the server sets when the client goes away, or None, with nothing answered, for the
    ASGI call; `answer(status, headers, body)` comes once, maybe before start_infer returns."""

    def start_infer(
        self, path: str, headers: list[tuple[bytes, bytes]], body: bytes, answer: Callable[[int, list[tuple[bytes, bytes]], bytes], None]
    ) -> Any: ...
