"""TritonConfig's fields as tritonserver flags, parsed by Nereid's own `serve` flag parser, so a field means here
what its flag means to `nereid serve`; a field Nereid cannot honour is refused with PyTriton's validation error."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import pathlib
from typing import Any

from nereid.core.settings import ServerSettings
from nereid.pytriton.exceptions import PyTritonValidationError
from nereid.serve_flags import parse_serve_args

__all__ = ["server_settings"]

_LIST_FIELDS = ("metrics_config", "trace_config", "cache_config")
_NOT_FLAGS = ("model_repository",)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, pathlib.Path):
        return value.as_posix()
    return str(value)


def server_settings(
    config: Any, model_store: pathlib.Path, restricted: tuple[list[str], str, str] | None
) -> ServerSettings:
    """ServerSettings for a Triton object: its config's fields, explicit model control over `model_store` (and the
    config's own model_repository, whose models load at start as PyTriton's '*' does), and the access-token
    restriction of its security config on both protocols."""
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    argv = ["--model-control-mode=explicit"]
    repositories = [model_store]
    if fields.get("model_repository") is not None:
        repositories.insert(0, pathlib.Path(fields["model_repository"]))
        argv.append("--load-model=*")
    argv += [f"--model-repository={path.as_posix()}" for path in repositories]
    for name, value in fields.items():
        if value is None or name in _NOT_FLAGS:
            continue
        if restricted is not None and name in ("http_restricted_api", "grpc_restricted_protocol"):
            continue  # the security config's token restriction replaces these, as in PyTriton
        if name in _LIST_FIELDS:
            argv += [f"{_flag(name)}={_value(item)}" for item in value]
        else:
            argv.append(f"{_flag(name)}={_value(value)}")
    if restricted is not None:
        endpoints, header, token = restricted
        item = f"{','.join(endpoints)}:{header}={token}"
        argv += [f"--http-restricted-api={item}", f"--grpc-restricted-protocol={item}"]
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            settings = parse_serve_args(argv)
    except SystemExit:
        message = stderr.getvalue().strip().removeprefix("nereid serve: error: ")
        raise PyTritonValidationError(f"TritonConfig is not supported by Nereid: {message}") from None
    return settings
