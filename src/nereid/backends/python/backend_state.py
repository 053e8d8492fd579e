"""What one Server's Python backend keeps for all its instances: the fork server, the spare workers started ahead of
need, and the custom metric families its models create.

Each Server's `PythonBackend` owns one, so two Servers in one process (an embedding program, PyTriton) share none of
it: each has its own workers, fork server and metric families. Nothing here runs a model.
"""

from __future__ import annotations

from nereid.backends.python.custom_metrics import CustomMetrics
from nereid.backends.python.execution_env import ExecutionEnv
from nereid.backends.python.worker_launch import ForkServer, LaunchedWorker, SpareWorkers, launch_worker

__all__ = ["PythonBackendState"]


class PythonBackendState:
    """The fork server, the spare workers and the custom-metric registry of one Server's Python models."""

    __slots__ = ("fork_server", "spares", "metrics")

    def __init__(self) -> None:
        self.fork_server = ForkServer()
        self.spares = SpareWorkers(self.launch)
        self.metrics = CustomMetrics()

    async def launch(self, label: str, execution_env: ExecutionEnv | None = None) -> LaunchedWorker:
        """A new worker process, forked by this state's fork server when it is on and ready (never for a model with
        an environment of its own: the fork server runs in the server's)."""
        return await launch_worker(label, self.fork_server, execution_env)

    def close(self) -> None:
        """The server stops: end the spare workers and the fork server."""
        self.spares.close()
        self.fork_server.enable(False)
