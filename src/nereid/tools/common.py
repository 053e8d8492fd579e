"""What the client tools (`nereid perf`, `nereid analyze`) share: the host:port parser, the flag parser's error
wording, the command-line entry point's error handling and exit codes, and the lazy exports of their packages. Like the tools, it never imports
the server."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

__all__ = ["AddressError", "ToolParser", "lazy_exports", "progress_printer", "run_tool", "split_host_port"]

_Parsed = TypeVar("_Parsed")


class AddressError(ValueError):
    """A server address that is not host:port; the message names the flag and what came."""


def split_host_port(url: str, default_port: int, flag: str = "--url") -> tuple[str, int]:
    """`host[:port]` into its parts: an `http://` or `grpc://` prefix and a trailing path are tolerated, an IPv6
    host is written `[::1]:8000` (a bare `::1` is a host without a port), a missing port is `default_port`."""
    text = url.strip()
    for scheme in ("http://", "grpc://"):
        if text.startswith(scheme):
            text = text[len(scheme) :]
    text = text.split("/", 1)[0]
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""
    if not host:
        raise AddressError(f"{flag}: expected host:port, got '{url}'")
    try:
        port = int(port_text) if port_text else default_port
    except ValueError:
        raise AddressError(f"{flag}: expected host:port with a numeric port, got '{url}'") from None
    if not 0 < port < 65536:
        raise AddressError(f"{flag}: port out of range in '{url}'")
    return host, port


class ToolParser(argparse.ArgumentParser):
    """An argument parser that raises the tool's own error (`error_type`) instead of exiting, so the entry point
    reports a bad flag as one line with exit code 2; an unknown flag points to the tool's --help."""

    def __init__(self, *, error_type: type[Exception], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.error_type = error_type

    def error(self, message: str) -> None:  # type: ignore[override]
        if message.startswith("unrecognized arguments"):
            message = f"unknown flag(s): {message.split(':', 1)[1].strip()}. Run `{self.prog} --help` for the flags"
        raise self.error_type(message) from None


def progress_printer(quiet: bool) -> Callable[[str], None]:
    """A progress callback that writes each line to stderr, or nothing when `quiet`."""

    def progress(line: str) -> None:
        if not quiet:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    return progress


def run_tool(
    argv: list[str] | None,
    *,
    prog: str,
    print_help: Callable[[], None],
    parse: Callable[[list[str]], _Parsed],
    run: Callable[[_Parsed], int],
    error: type[Exception],
    verbose: Callable[[_Parsed], bool],
    debug_env: str,
) -> int:
    """A tool's command line: 0 ok, 1 a failed run, 2 bad flags, 130 interrupted. Expected failures (`error`) are
    one line; an unexpected exception is one line too unless `verbose(parsed)` or the `debug_env` variable asks
    for the traceback."""
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print_help()
        return 0
    try:
        parsed = parse(args)
    except error as exc:
        sys.stderr.write(f"{prog}: error: {exc}\n")
        return 2
    try:
        return run(parsed)
    except error as exc:
        sys.stderr.write(f"{prog}: error: {exc}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        return 130
    except Exception as exc:  # a bug here: still one line unless asked for more
        if verbose(parsed) or os.environ.get(debug_env):
            traceback.print_exc()
        sys.stderr.write(f"{prog}: error: internal error: {type(exc).__name__}: {exc} (run with -v for the traceback)\n")
        return 1


def lazy_exports(package: str, exports: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module `__getattr__` that imports `package.<exports[name]>` only when `name` is first used and keeps it
    in `namespace`, so a worker process that needs one submodule does not pay for the others."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
        namespace[name] = value
        return value

    return __getattr__
