"""The Python backend: Triton `model.py` files, each instance in its own worker process.

`auto_complete` runs the model's static auto_complete_config (in a short-lived worker, so model code never runs in
the server process); `create_instance` starts a worker (or takes a spare one) and waits until the model's initialize() has returned.
Each Server has a backend of its own (`new_backend`), with its own spare workers, fork server and custom metric families.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

from google.protobuf import json_format
from prometheus_client.core import Metric

from nereid.backends.base import InstanceSpec, ModelContext
from nereid.backends.python.auto_complete import may_auto_complete, run_auto_complete
from nereid.backends.python.backend_state import PythonBackendState
from nereid.backends.python.execution_env import execution_env_of
from nereid.backends.python.instance import PythonInstance
from nereid.backends.python.worker_launch import FORK_SERVER_START_TIMEOUT_S
from nereid.config.model_config import config_to_json_dict, parse_json
from nereid.core.errors import NereidError
from nereid.core.settings import parse_boolean

__all__ = ["PythonBackend", "new_backend"]

# --backend-config=python,spare-workers=N: workers started ahead of need (see worker_launch). By default 2 when
# models load on demand (where a cold start is a request's wait) and none otherwise (every load is explicit).
SPARE_WORKERS_KEY = "spare-workers"
_SPARES_ON_DEMAND = 2


# --backend-config=python,fork-server=true|false: fork workers from a process past their imports (fork_server.py), so
# a worker starts in milliseconds. On by default when models load on demand, off otherwise, as the spares.
FORK_SERVER_KEY = "fork-server"


def _python_config(context: ModelContext) -> dict[str, str]:
    config: dict[str, str] = context.extra.get("backend_config", {}).get("python", {})
    return config


def fork_server_wanted(context: ModelContext) -> bool:
    value = _python_config(context).get(FORK_SERVER_KEY)
    if value is None:
        return bool(context.extra.get("load_on_demand"))
    try:
        return parse_boolean(value)
    except ValueError:
        raise NereidError.invalid(f"backend config 'python,{FORK_SERVER_KEY}': expected true or false, got '{value}'") from None


def spare_workers(context: ModelContext) -> int:
    value = _python_config(context).get(SPARE_WORKERS_KEY)
    if value is None:
        return _SPARES_ON_DEMAND if context.extra.get("load_on_demand") else 0
    try:
        count = int(value)
    except ValueError:
        count = -1
    if count < 0:
        raise NereidError.invalid(
            f"backend config 'python,{SPARE_WORKERS_KEY}': expected a whole number of workers (0 or more), got '{value}'"
        )
    return count


class PythonBackend:
    """The Python backend of one Server: `state` holds what its models share (spares, fork server, custom metrics)."""

    name = "python"

    def __init__(self) -> None:
        self.state = PythonBackendState()

    def auto_complete(self, context: ModelContext) -> None:
        model_file = context.model_file("model.py")
        if not model_file.is_file() or not may_auto_complete(context.version_path, model_file):
            return
        completed = run_auto_complete(context, json.dumps(config_to_json_dict(context.config)))
        try:
            config = parse_json(completed)
        except json_format.ParseError as exc:
            raise NereidError.invalid(
                f"model '{context.name}': auto_complete_config returned an invalid configuration: {exc}"
            ) from None
        context.config.CopyFrom(config)

    async def create_instance(self, context: ModelContext, spec: InstanceSpec) -> PythonInstance:
        state = self.state
        state.spares.resize(spare_workers(context))
        state.fork_server.enable(fork_server_wanted(context))
        await state.fork_server.wait_ready(FORK_SERVER_START_TIMEOUT_S)
        execution_env = await asyncio.to_thread(execution_env_of, context)  # a first unpacking takes a while
        instance = PythonInstance(context, spec, state, execution_env=execution_env)
        await instance.start()
        return instance

    def metric_families(self) -> Iterator[Metric]:
        """The custom metric families this Server's Python models created (pb_utils.MetricFamily), for the metrics
        endpoint."""
        return self.state.metrics.collect()

    async def close(self) -> None:
        """The server stops: end the spare workers and the fork server."""
        self.state.close()


def new_backend() -> PythonBackend:
    """A Python backend for one Server (each Server keeps its own workers and custom metric families)."""
    return PythonBackend()
