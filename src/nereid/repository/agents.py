"""Repository agents (config.pbtxt `model_repository_agents`): checks a model's files pass before it loads.

    model_repository_agents { agents [ { name: "checksum", parameters { key: "MD5:1/model.onnx" value: "<hex>" } } ] }

An agent is asked once per load, before the model's versions are loaded, with the model's folder and the parameters
its config gives it; raising refuses the load with the agent's words. Nereid has Triton's `checksum` agent (MD5, and
SHA-256 as Nereid's addition). A user's own agent is a Python file `<--repoagent-directory>/<name>/agent.py` whose
`create_agent()` returns an object with the `RepositoryAgent` method, the place and role Triton gives an agent's
shared library.
"""

from __future__ import annotations

import hashlib
import importlib.util
import threading
from pathlib import Path
from typing import Protocol

from nereid.config.model_config import ModelConfig
from nereid.core.errors import NereidError

__all__ = ["ChecksumAgent", "RepositoryAgent", "RepositoryAgents"]


class RepositoryAgent(Protocol):
    def before_load(self, model: str, location: Path, parameters: dict[str, str]) -> None:
        """Check the model's folder `location` before it loads; raise (a NereidError, or any exception) to refuse."""


class ChecksumAgent:
    """Triton's checksum agent: each parameter `ALGORITHM:relative/path` names a file of the model's folder and its
    expected digest in hex. MD5 as Triton's; SHA256 is Nereid's addition."""

    _ALGORITHMS = {"md5": "MD5", "sha256": "SHA256"}

    def before_load(self, model: str, location: Path, parameters: dict[str, str]) -> None:
        for key, expected in parameters.items():
            algorithm, separator, relative = key.partition(":")
            if not separator:
                raise NereidError.invalid(f"failed to parse key: {key}")
            name = self._ALGORITHMS.get(algorithm.lower())
            if name is None:
                raise NereidError.unsupported(f"Unsupported checksum algorithm: {algorithm}")
            path = (location / relative).resolve()
            if not path.is_relative_to(location.resolve()):
                raise NereidError.invalid(f"the file {relative} is outside the model's folder")
            try:
                with path.open("rb") as f:
                    digest = hashlib.file_digest(f, name.lower()).hexdigest()
            except OSError as exc:
                raise NereidError.invalid(f"failed to open text file for read {relative}: {exc.strerror}") from None
            if digest != expected.strip().lower():
                raise NereidError.invalid(f"Mismatched {name} hash for file {relative}, expect: {expected}, got: {digest}")


class RepositoryAgents:
    """The agents a server knows: the built-in ones, and those found in its agent directory (each loaded once)."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory
        self._agents: dict[str, RepositoryAgent] = {"checksum": ChecksumAgent()}
        self._lock = threading.Lock()  # loads prepare in threads of their own

    def check(self, model: str, location: Path, config: ModelConfig) -> None:
        """Run the config's agents in order; the first refusal fails the load, naming the model and the agent."""
        for entry in config.model_repository_agents.agents:
            agent = self._agent(model, entry.name)
            try:
                agent.before_load(model, location, dict(entry.parameters))
            except NereidError as exc:
                raise NereidError(exc.status, f"model '{model}': repository agent '{entry.name}': {exc.message}") from None
            except Exception as exc:
                raise NereidError.invalid(
                    f"model '{model}': repository agent '{entry.name}' failed: {type(exc).__name__}: {exc}"
                ) from None

    def _agent(self, model: str, name: str) -> RepositoryAgent:
        with self._lock:
            agent = self._agents.get(name)
            if agent is None:
                agent = self._agents[name] = self._load(model, name)
            return agent

    def _load(self, model: str, name: str) -> RepositoryAgent:
        path = self.directory / name / "agent.py" if self.directory is not None and name.isidentifier() else None
        if path is None or not path.is_file():
            where = f"'{self.directory / name / 'agent.py'}'" if self.directory is not None else "no --repoagent-directory"
            raise NereidError.invalid(
                f"model '{model}': unable to find repository agent '{name}' ({where}; built in: checksum)"
            )
        spec = importlib.util.spec_from_file_location(f"nereid_repoagent_{name}", path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        try:
            spec.loader.exec_module(module)  # type: ignore[union-attr]
            agent = module.create_agent()
        except Exception as exc:
            raise NereidError.invalid(
                f"model '{model}': repository agent '{name}' ({path}) failed to start: {type(exc).__name__}: {exc}"
            ) from None
        return agent  # type: ignore[no-any-return]
