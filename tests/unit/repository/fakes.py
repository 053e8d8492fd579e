"""Fakes for the repository's unit tests: loaded versions without a backend, a model lifecycle that Residency drives
through its `ResidencyCalls`, a backend whose instances log when they are created and closed, and small config and
folder builders."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nereid.backends.base import ExecutionTimes, InstanceSpec, ModelContext
from nereid.config.model_config import ModelConfig, mc
from nereid.core.errors import NereidError
from nereid.core.settings import MemoryBudget, ServerSettings
from nereid.core.types import InferenceRequest, InferenceResponse
from nereid.repository.model_version import ModelState
from nereid.repository.records import ModelRecord
from nereid.repository.residency import FOOTPRINT_KEY, GROUP_KEY, PIN_KEY, Residency, ResidencyCalls
from nereid.repository.routing import VersionRoutes

MiB = 1 << 20


def model_config(
    name: str, *, footprint: str = "", pinned: bool = False, group: str = "", steps: Iterable[str] = ()
) -> ModelConfig:
    """A fake-backend config with the residency keys set as config.pbtxt would set them; `steps` makes it an
    ensemble of those models."""
    config = mc.ModelConfig(name=name)
    if steps:
        config.platform = "ensemble"
        for step in steps:
            config.ensemble_scheduling.step.add(model_name=step, model_version=-1)
    else:
        config.backend = "fake"
    for key, value in ((FOOTPRINT_KEY, footprint), (GROUP_KEY, group), (PIN_KEY, "true" if pinned else "")):
        if value:
            config.parameters[key].string_value = value
    return config


@dataclass
class FakeStats:
    pending: int = 0  # requests queued in the scheduler


@dataclass
class FakeInstance:
    pid: int | None = None  # a worker process, as the Python backend's instances have


class FakeVersion:
    """What the repository reads of a loaded version: its state, config, use counters and instances."""

    def __init__(self, name: str, version: int = 1, config: ModelConfig | None = None, ready: bool = True) -> None:
        self.name = name
        self.version = version
        self.version_str = str(version)
        self.config = config if config is not None else model_config(name)
        self.decoupled = self.config.model_transaction_policy.decoupled
        self.state = ModelState.READY if ready else ModelState.LOADING
        self.reason = ""
        self.inflight = 0
        self.stats = FakeStats()
        self.requests = 0
        self.last_used = 0.0
        self.instances: list[FakeInstance] = []

    async def unload(self, timeout: float | None = None, reason: str = "unloaded") -> None:
        self.state = ModelState.UNAVAILABLE
        self.reason = reason


def settings(**overrides: Any) -> ServerSettings:
    return ServerSettings(**overrides)


def budget(host_bytes: int) -> MemoryBudget:
    return MemoryBudget(host_bytes=host_bytes)


class FakeProbe:
    """LoadProbe without reading the process's memory: `delta` is what the next probes report (None: the load
    overlapped another, so the delta cannot be told apart)."""

    delta: tuple[int, dict[int, int]] | None = None

    def __init__(self, nvml: object) -> None:
        pass

    def finish(self) -> tuple[int, dict[int, int]] | None:
        return FakeProbe.delta


@dataclass
class FakeLifecycle:
    """The model lifecycle that owns a Residency, reduced to what Residency asks of it: loads on demand that admit,
    create fake versions and report back, and evictions that check idleness in the step that takes the routes away
    (as the manager's do). `configs` is the repository; `ensembles` maps a model to the ensembles that use it."""

    settings: ServerSettings
    configs: dict[str, ModelConfig] = field(default_factory=dict)
    ensembles: dict[str, list[str]] = field(default_factory=dict)
    records: dict[str, ModelRecord] = field(default_factory=dict)
    on_demand_loads: list[str] = field(default_factory=list)
    evicted: list[tuple[str, str]] = field(default_factory=list)
    # When given, a load on demand waits until this event is set (a slow load); `errors` fails the models it names.
    gate: asyncio.Event | None = None
    errors: dict[str, NereidError] = field(default_factory=dict)
    # Runs at the end of a load on demand, once the model serves but before its waiters hear of it.
    after_load_on_demand: Callable[[str], Awaitable[None]] | None = None

    def __post_init__(self) -> None:
        self.routes = VersionRoutes(self.records)
        self.residency = Residency(self.settings, self.calls())

    def calls(self) -> ResidencyCalls:
        return ResidencyCalls(
            records=self.records,
            routes=self.routes,
            in_repository=self.configs.__contains__,
            load_on_demand=self.load_on_demand,
            evict=self.evict,
            ensembles_by_model=lambda: self.ensembles,
        )

    async def load(self, name: str, cause: str = "explicit", pids: Iterable[int] = ()) -> FakeVersion:
        """What the manager's load tells the residency: admit, create the version, report success."""
        config = self.configs[name]
        record = self.records.setdefault(name, ModelRecord(name))
        admission = None
        if config.platform != "ensemble":
            admission = await self.residency.admit(name, config, Path("/nonexistent") / name, 1, cause)
        mv = FakeVersion(name, config=config)
        mv.instances = [FakeInstance(pid) for pid in pids]
        record.serving = {1: mv}
        record.retired = {}
        self.residency.load_succeeded(admission, name, [mv], cause)
        self.routes.rebuild(record)
        return mv

    async def load_on_demand(self, name: str) -> None:
        self.on_demand_loads.append(name)
        if self.gate is not None:
            await self.gate.wait()
        if name in self.errors:
            raise self.errors[name]
        if not self.routes.has_ready(name):
            await self.load(name, "on_demand")
        if self.after_load_on_demand is not None:
            await self.after_load_on_demand(name)

    async def evict(self, name: str, reason: str, still_idle: Callable[[], bool]) -> bool:
        record = self.records.get(name)
        if record is None or not record.serving or not still_idle():
            return False
        old = record.serving
        record.serving = {}
        record.retired.update(old)
        self.routes.rebuild(record)
        self.residency.before_unload(name, old.values())
        for mv in old.values():
            await mv.unload(None, reason)
        self.residency.unloaded(name, old.values())
        self.evicted.append((name, reason))
        return True

    def version(self, name: str) -> FakeVersion:
        mv = self.records[name].serving[1]
        assert isinstance(mv, FakeVersion)
        return mv

    def resident(self) -> list[str]:
        return sorted(name for name, record in self.records.items() if record.serving)


# -- a backend whose instances log their creation and closing -------------------------------------------------
EVENTS: list[str] = []  # "create NAME TAG" / "close NAME TAG", in order


class LoggingInstance:
    def __init__(self, context: ModelContext, spec: InstanceSpec) -> None:
        self.name = spec.name
        self.tag = f"{context.name} {_parameter(context.config, 'tag')}"
        EVENTS.append(f"create {self.tag}")

    async def execute(self, requests: list[InferenceRequest]) -> tuple[list[InferenceResponse], ExecutionTimes]:
        raise NotImplementedError("the repository's tests run no request")

    async def close(self) -> None:
        EVENTS.append(f"close {self.tag}")


class LoggingBackend:
    """`fail: "true"` in a config's parameters makes each instance fail to start."""

    name = "fake"

    def auto_complete(self, context: ModelContext) -> None:
        pass

    async def create_instance(self, context: ModelContext, spec: InstanceSpec) -> LoggingInstance:
        if _parameter(context.config, "fail") == "true":
            raise NereidError.internal(f"instance of '{context.name}' failed to start")
        return LoggingInstance(context, spec)


BACKEND = LoggingBackend()  # what get_backend reads of a backend module


def _parameter(config: ModelConfig, key: str) -> str:
    entry = config.parameters.get(key)
    return entry.string_value if entry is not None else ""


_TENSORS = (
    'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
)


def model_pbtxt(
    name: str, *, tag: str = "", fail: bool = False, footprint: str = "", decoupled: bool = False, max_batch_size: int = 8
) -> str:
    """config.pbtxt of a fake-backend model that maps IN to OUT ([4] FP32)."""
    text = f'name: "{name}"\nbackend: "fake"\nmax_batch_size: {max_batch_size}\n{_TENSORS}'
    text += f'parameters {{ key: "tag" value {{ string_value: "{tag}" }} }}\n'
    if fail:
        text += 'parameters { key: "fail" value { string_value: "true" } }\n'
    if footprint:
        text += f'parameters {{ key: "{FOOTPRINT_KEY}" value {{ string_value: "{footprint}" }} }}\n'
    if decoupled:
        text += "model_transaction_policy { decoupled: true }\n"
    return text


def ensemble_pbtxt(name: str, steps: Iterable[str], max_batch_size: int = 8) -> str:
    """config.pbtxt of an ensemble that chains `steps`: IN -> step 1 -> t1 -> step 2 -> ... -> OUT."""
    steps = list(steps)
    wires = ["IN", *(f"t{i}" for i in range(1, len(steps))), "OUT"]
    text = f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {max_batch_size}\n{_TENSORS}'
    text += "ensemble_scheduling { step [ "
    text += ", ".join(
        f'{{ model_name: "{step}" model_version: -1 input_map {{ key: "IN" value: "{wires[i]}" }} '
        f'output_map {{ key: "OUT" value: "{wires[i + 1]}" }} }}'
        for i, step in enumerate(steps)
    )
    return text + " ] }\n"


def write_model(root: Path, name: str, *, steps: Iterable[str] = (), **model: Any) -> Path:
    """A model folder with version 1: an ensemble of `steps`, or a fake-backend model (`model_pbtxt`'s options)."""
    folder = root / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    steps = list(steps)
    (folder / "config.pbtxt").write_text(ensemble_pbtxt(name, steps) if steps else model_pbtxt(name, **model))
    return folder
