"""A backend named "fake" whose models say in their parameters what they do (no framework), the model folders
for it, and a Server run over a repository of them: for tests of the scheduling and the Server's entry points."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest

from nereid.backends import base as backends_base
from nereid.backends.base import ExecutionTimes, InstanceSpec, ModelContext
from nereid.core.errors import NereidError
from nereid.core.settings import ServerSettings
from nereid.core.types import InferenceRequest, InferenceResponse, OutputTensor
from nereid.server import Server

T = TypeVar("T")


def use_fake_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """Models with `backend: "fake"` are served by this module's BACKEND for the rest of the test."""
    monkeypatch.setitem(backends_base.BACKEND_MODULES, "fake", (__name__, None))


class FakeInstance:
    """`add` answers OUT = IN + k; `repeat` (decoupled) sends `count` responses OUT = IN + i, then a bare
    final flag; `silent` answers without its output; `fail` answers an error."""

    def __init__(self, context: ModelContext, spec: InstanceSpec) -> None:
        self.name = spec.name
        params = {k: v.string_value for k, v in context.config.parameters.items()}
        self.kind = params.get("kind", "add")
        self.k = float(params.get("k", "0"))
        self.count = int(params.get("count", "3"))

    async def execute(self, requests: list[InferenceRequest]) -> tuple[list[InferenceResponse], ExecutionTimes]:
        responses = []
        for request in requests:
            data = request.inputs[0].data
            if self.kind == "repeat":
                for i in range(self.count):
                    out = (data + i).astype(np.float32)
                    request.respond(
                        InferenceResponse(
                            request.model_name, request.model_version, request.id, [OutputTensor("OUT", "FP32", out.shape, out)], final=False
                        )
                    )
                    await asyncio.sleep(0)
                request.respond(InferenceResponse(request.model_name, request.model_version, request.id, complete_only=True))
                continue
            if self.kind == "echo":  # the input array itself, not a copy
                responses.append(
                    InferenceResponse(request.model_name, request.model_version, request.id, [OutputTensor("OUT", "FP32", data.shape, data)])
                )
                continue
            if self.kind == "silent":  # a response without the output its config declares
                responses.append(InferenceResponse(request.model_name, request.model_version, request.id, []))
                continue
            if self.kind == "fail":
                responses.append(
                    InferenceResponse(request.model_name, request.model_version, request.id, error=NereidError.internal("it broke"))
                )
                continue
            out = (data + self.k).astype(np.float32)
            responses.append(
                InferenceResponse(request.model_name, request.model_version, request.id, [OutputTensor("OUT", "FP32", out.shape, out)])
            )
        return responses, ExecutionTimes(1, 2, 3)

    async def close(self) -> None:
        pass


class FakeBackend:
    name = "fake"

    def auto_complete(self, context: ModelContext) -> None:
        pass

    async def create_instance(self, context: ModelContext, spec: InstanceSpec) -> FakeInstance:
        return FakeInstance(context, spec)


BACKEND = FakeBackend()


def write_model(root: Path, name: str, kind: str, k: float = 0, decoupled: bool = False, max_batch_size: int = 8, count: int = 3) -> None:
    folder = root / name
    (folder / "1").mkdir(parents=True)
    policy = "model_transaction_policy { decoupled: true }" if decoupled else ""
    (folder / "config.pbtxt").write_text(
        f'''name: "{name}"
backend: "fake"
max_batch_size: {max_batch_size}
{policy}
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]
parameters {{ key: "kind" value {{ string_value: "{kind}" }} }}
parameters {{ key: "k" value {{ string_value: "{k}" }} }}
parameters {{ key: "count" value {{ string_value: "{count}" }} }}
'''
    )


def run_server(body: Callable[[Server], Awaitable[T]], root: Path, mode: str = "none") -> T:
    async def main() -> T:
        server = Server(ServerSettings(model_repositories=[root], exit_on_error=False, model_control_mode=mode))
        await server.start()
        try:
            return await body(server)
        finally:
            await server.stop()

    return asyncio.run(main())


async def cyclic_garbage(call: Callable[[], Awaitable[object]], times: int = 5) -> list[str]:
    """The types of what `times` awaited calls leave to the cycle collector; [] when reference counting frees all."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(times):
            await call()
        gc.collect()
        return [type(o).__qualname__ for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
