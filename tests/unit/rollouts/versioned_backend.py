"""A fake backend whose answer says which version gave it (OUT = IN + version), and a repository of one model with
two versions over it: for tests of version choice (rollouts) and of what the monitor sees."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nereid.backends import base as backends_base
from nereid.backends.base import ExecutionTimes, InstanceSpec, ModelContext
from nereid.core.errors import NereidError
from nereid.core.types import InferenceRequest, InferenceResponse, OutputTensor

__all__ = ["BACKEND", "versioned_repository"]


class _VersionedInstance:
    """OUT = IN + the version number; the parameter `fail_every_<version>` = n fails every n-th request."""

    def __init__(self, context: ModelContext) -> None:
        params = {k: v.string_value for k, v in context.config.parameters.items()}
        self.version = context.version
        self.fail_every = int(params.get(f"fail_every_{context.version}", "0"))
        self.seen = 0

    async def execute(self, requests: list[InferenceRequest]) -> tuple[list[InferenceResponse], ExecutionTimes]:
        responses = []
        for request in requests:
            self.seen += 1
            if self.fail_every and self.seen % self.fail_every == 0:
                error = NereidError.internal(f"version {self.version} broke")
                responses.append(InferenceResponse(request.model_name, request.model_version, request.id, error=error))
                continue
            out = (request.inputs[0].data + self.version).astype(np.float32)
            responses.append(
                InferenceResponse(request.model_name, request.model_version, request.id, [OutputTensor("OUT", "FP32", out.shape, out)])
            )
        return responses, ExecutionTimes(1, 2, 3)

    async def close(self) -> None:
        pass


class _VersionedBackend:
    name = "versioned"

    def auto_complete(self, context: ModelContext) -> None:
        pass

    async def create_instance(self, context: ModelContext, spec: InstanceSpec) -> _VersionedInstance:
        return _VersionedInstance(context)


BACKEND = _VersionedBackend()


def versioned_repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **parameters: object) -> Path:
    """Model `m`, versions 1 and 2 (both served), FP32 [1] in and out; `parameters` go into its config."""
    monkeypatch.setitem(backends_base.BACKEND_MODULES, "versioned", (__name__, None))
    root = tmp_path / "models"
    for version in (1, 2):
        (root / "m" / str(version)).mkdir(parents=True)
    extra = "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in parameters.items())
    (root / "m" / "config.pbtxt").write_text(
        f"""name: "m"
backend: "versioned"
max_batch_size: 8
version_policy {{ all {{}} }}
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
{extra}"""
    )
    return root
