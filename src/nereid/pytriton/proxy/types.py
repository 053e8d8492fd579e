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


@dataclass
class Request:
    """One inference request: `request["INPUT"]` is an array; `parameters` holds the request's parameters
    (and the HTTP headers or gRPC metadata the server forwards); `requested_output_names` the outputs asked for."""

    data: dict[str, np.ndarray]
    parameters: dict[str, str | int | bool] | None = None
    span: Any = None
    requested_output_names: list[str] | None = None

    def __getitem__(self, input_name: str) -> np.ndarray:
        return self.data[input_name]

    def __setitem__(self, input_name: str, input_data: np.ndarray) -> None:
        self.data[input_name] = input_data

    def __delitem__(self, input_name: str) -> None:
        del self.data[input_name]

    def __len__(self) -> int:
        return len(self.data)

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __contains__(self, input_name: object) -> bool:
        return input_name in self.data

    def items(self) -> ItemsView[str, np.ndarray]:
        return self.data.items()

    def keys(self) -> KeysView[str]:
        return self.data.keys()

    def values(self) -> ValuesView[np.ndarray]:
        return self.data.values()

    def traced_span(self, span_name: str) -> contextlib.nullcontext[None]:
        """PyTriton's OpenTelemetry span helper; Nereid has no per-request spans here, so it is a no-op context."""
        return contextlib.nullcontext()


Requests = list[Request]


@dataclass
class Response:
    """One response: a mapping of output names to numpy arrays."""

    data: dict[str, np.ndarray]

    def __getitem__(self, output_name: str) -> np.ndarray:
        return self.data[output_name]

    def __setitem__(self, output_name: str, output_data: np.ndarray) -> None:
        self.data[output_name] = output_data

    def __delitem__(self, output_name: str) -> None:
        del self.data[output_name]

    def __len__(self) -> int:
        return len(self.data)

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def items(self) -> ItemsView[str, np.ndarray]:
        return self.data.items()

    def keys(self) -> KeysView[str]:
        return self.data.keys()

    def values(self) -> ValuesView[np.ndarray]:
        return self.data.values()


Responses = list[Response]
