"""The trace settings the trace endpoints read and change: global values plus per-model overrides, as Triton
keeps them. `core/tracing.py` traces requests by them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nereid.core.errors import NereidError

__all__ = ["TraceSettings"]

_DEFAULTS: dict[str, Any] = {
    "trace_level": ["OFF"],
    "trace_rate": "1000",
    "trace_count": "-1",
    "log_frequency": "0",
    "trace_file": "",
    "trace_mode": "triton",
}
_LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
# The smallest value each integer setting accepts (trace_count -1 means "no limit").
_INTEGER_MINIMUM = {"trace_rate": 0, "trace_count": -1, "log_frequency": 0}


def _checked(key: str, value: Any) -> Any:
    """The stored form of one new value: a list of level names for trace_level, a decimal string otherwise."""
    if key == "trace_level":
        levels = [value] if isinstance(value, str) else value
        if not isinstance(levels, list) or not all(isinstance(v, str) for v in levels):
            raise NereidError.invalid("trace setting 'trace_level' must be a list of strings")
        unknown = [v for v in levels if v not in _LEVELS]
        if unknown:
            raise NereidError.invalid(f"unknown trace level {unknown[0]!r}; expected one of {list(_LEVELS)}")
        return list(levels) or ["OFF"]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise NereidError.invalid(f"trace setting '{key}' must be a string, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise NereidError.invalid(f"Unable to parse '{key}', got: {value}") from None
    minimum = _INTEGER_MINIMUM[key]
    if number < minimum:
        raise NereidError.invalid(f"Unable to parse '{key}'. Expecting value >= {minimum}, got: {number}")
    return str(number)


class TraceSettings:
    def __init__(self, initial: dict[str, Any] | None = None) -> None:
        """`initial`: the values of --trace-config at start-up (the only way to choose the trace file)."""
        self._global: dict[str, Any] = {k: (list(v) if isinstance(v, list) else v) for k, v in _DEFAULTS.items()}
        self._models: dict[str, dict[str, Any]] = {}
        self.on_change: Callable[[], None] | None = None
        initial = dict(initial or {})
        # The opentelemetry mode's own settings (url, resource, bsp_*), as (key, value) items: start-up only.
        self.opentelemetry: list[tuple[str, str]] = list(initial.pop("opentelemetry", []))
        for key, value in initial.items():
            self._global[key] = str(value) if key in ("trace_file", "trace_mode") else _checked(key, value)

    def any_tracing(self) -> bool:
        """Whether any model can be traced: a level other than OFF somewhere, and a file to write to."""
        levels = [self._global["trace_level"], *(m["trace_level"] for m in self._models.values() if "trace_level" in m)]
        return self.has_destination() and any(level != ["OFF"] for level in levels)

    def has_destination(self) -> bool:
        """Whether traces have somewhere to go: a trace file, or the opentelemetry mode's exporter."""
        return bool(self._global["trace_file"]) or self._global["trace_mode"] == "opentelemetry"

    def get(self, model: str = "") -> dict[str, Any]:
        """The settings in effect for a model (its overrides over the global values), or the global ones."""
        merged = dict(self._global)
        merged.update(self._models.get(model, {}))
        return merged

    def update(self, changes: dict[str, Any], model: str = "") -> dict[str, Any]:
        """Apply `changes`; a None value clears a model's override, or resets a global value to its default.

        Keys Triton does not let a client change (trace_mode) or does not know are ignored, as Triton ignores
        them; the trace file can only be chosen at start-up.
        """
        updates: dict[str, Any] = {}
        clears: list[str] = []
        for key, value in changes.items():
            if isinstance(value, list) and len(value) == 1 and key != "trace_level":
                value = value[0]  # gRPC carries every value as a list of strings
            if key == "trace_file":
                if value is None or value == [] or value == self._global["trace_file"]:
                    continue
                raise NereidError.unsupported("trace file location can not be updated through network protocol")
            if key not in _INTEGER_MINIMUM and key != "trace_level":
                continue
            if value is None or value == []:
                clears.append(key)
            else:
                updates[key] = _checked(key, value)
        if any(level != "OFF" for level in updates.get("trace_level", ())) and not self.has_destination():
            # Triton's trace mode writes to a file; with no file given at start-up it refuses to turn tracing on.
            raise NereidError.invalid("Attempting to set invalid trace setting :trace file name is not given")
        target = self._models.setdefault(model, {}) if model else self._global
        for key in clears:
            if model:
                target.pop(key, None)
            else:
                default = _DEFAULTS[key]
                target[key] = list(default) if isinstance(default, list) else default
        target.update(updates)
        if model and not target:
            self._models.pop(model, None)
        if self.on_change is not None:
            self.on_change()
        return self.get(model)
