"""`Request` and `Response`: what an inference callable receives and may return, as in PyTriton.

A Request is a mapping of input names to numpy arrays (views of the received tensors, not copies) with the
request's parameters and the outputs the client asked for. Plain data holders: no server logic here.
"""

from __future__ import annotations

import contextlib
from collections.abc import ItemsView, Iterator, KeysView, ValuesView
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Request", "Requests", "Response", "Responses"]


class _NamedArrays:
    """The mapping of names to arrays that a Request and a Response both are, over their `data` dict."""

    data: dict[str, np.ndarray]

    def __getitem__(self, name: str) -> np.ndarray:
        return self.data[name]

    def __setitem__(self, name: str, array: np.ndarray) -> None:
        self.data[name] = array

    def __delitem__(self, name: str) -> None:
        del self.data[name]

    def __len__(self) -> int:
        return len(self.data)

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __contains__(self, name: object) -> bool:
        return name in self.data

    def items(self) -> ItemsView[str, np.ndarray]:
        return self.data.items()

    def keys(self) -> KeysView[str]:
        return self.data.keys()

    def values(self) -> ValuesView[np.ndarray]:
        return self.data.values()


@dataclass
class Request(_NamedArrays):
    """One inference request: `request["INPUT"]` is an array; `parameters` holds the request's parameters
    (and the HTTP headers or gRPC metadata the server forwards); `requested_output_names` the outputs asked for."""

    data: dict[str, np.ndarray]
    parameters: dict[str, str | int | bool] | None = None
    span: Any = None
    requested_output_names: list[str] | None = None

    def traced_span(self, span_name: str) -> contextlib.nullcontext[None]:
        """PyTriton's OpenTelemetry span helper; Nereid has no per-request spans here, so it is a no-op context."""
        return contextlib.nullcontext()


Requests = list[Request]


@dataclass
class Response(_NamedArrays):
    """One response: a mapping of output names to numpy arrays."""

    data: dict[str, np.ndarray]


Responses = list[Response]
