"""What the HTTP/1.1 server may ask of the app it serves, beyond the call itself: switches an app declares
(typed protocols checked with isinstance), so that the server never looks members up by name."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["HeaderCaseApp", "TracingApp"]


@runtime_checkable
class HeaderCaseApp(Protocol):
    """An app that reads header names as sent (HttpApp with a header forward pattern), not lower-cased."""

    keeps_header_case: bool


@runtime_checkable
class TracingApp(Protocol):
    """An app that traces requests (HttpApp): while its switch is on, connections stamp each request's times."""

    tracing: Any
