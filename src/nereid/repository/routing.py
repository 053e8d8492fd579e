"""Routing a request's model name and version to a ready version: the table the hot path reads.

It is rebuilt from a model's record on every change and never loads, unloads or waits."""

from __future__ import annotations

from nereid.core.errors import NereidError
from nereid.repository.model_version import ModelState, ModelVersion
from nereid.repository.records import ModelRecord

__all__ = ["VersionRoutes", "check_version_string"]


def check_version_string(version: str) -> None:
    """A requested version is empty (the latest) or a decimal number; anything else is an invalid argument."""
    if version and not version.isdigit():
        raise NereidError.invalid(
            f"failed to get model version from specified version string '{version}': version should be an "
            f"integral value > 0"
        )


class VersionRoutes:
    def __init__(self, records: dict[str, ModelRecord]) -> None:
        self._records = records
        # name -> (version string -> ready version, default version)
        self._routes: dict[str, tuple[dict[str, ModelVersion], ModelVersion | None]] = {}
        # name -> the version requests naming none get while it is ready, instead of the newest (a rollout's choice)
        self._preferred: dict[str, str] = {}

    def resolve(self, name: str, version: str) -> ModelVersion:
        route = self._routes.get(name)
        if route is None:
            check_version_string(version)
            raise NereidError.not_found(f"Request for unknown model: '{name}' is not found")
        by_version, latest = route
        if not version:
            if latest is None:
                raise NereidError.not_found(f"Request for unknown model: '{name}' has no available versions")
            return latest
        found = by_version.get(version)
        if found is None:
            check_version_string(version)
            record = self._records.get(name)
            if record is not None and (int(version) in record.serving or int(version) in record.retired):
                # A version Nereid knows (failed, loading or unloaded) is there but not serving, as Triton says.
                raise NereidError.unavailable(
                    f"Request for unknown model: '{name}' version {version} is not at ready state"
                )
            raise NereidError.not_found(f"Request for unknown model: '{name}' version {version} is not found")
        return found

    def is_ready(self, name: str, version: str) -> bool:
        """Whether that version of the model takes requests now (two dict reads: rollouts ask it per request)."""
        route = self._routes.get(name)
        return route is not None and version in route[0]

    def has_ready(self, name: str) -> bool:
        route = self._routes.get(name)
        return route is not None and route[1] is not None

    def versions(self, name: str) -> list[str]:
        route = self._routes.get(name)
        return list(route[0]) if route else []

    def ready_versions(self) -> list[ModelVersion]:
        return [mv for by_version, _ in self._routes.values() for mv in by_version.values()]

    def prefer(self, name: str, version: str) -> None:
        """Requests naming no version of `name` get `version` while it is ready, rather than the newest ("": the
        newest again, Triton's rule)."""
        if version:
            self._preferred[name] = version
        else:
            self._preferred.pop(name, None)
        record = self._records.get(name)
        if record is not None:
            self.rebuild(record)

    def rebuild(self, record: ModelRecord) -> None:
        serving = {str(v): mv for v, mv in record.serving.items() if mv.state is ModelState.READY}
        if serving or record.name in self._routes or record.retired or record.reason:
            default = serving.get(self._preferred.get(record.name, ""))
            if default is None and serving:
                default = serving[str(max(int(v) for v in serving))]
            self._routes[record.name] = (serving, default)

    def forget(self, name: str) -> None:
        self._routes.pop(name, None)
