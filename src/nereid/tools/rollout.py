"""`nereid rollout`: start and drive a model's rollout on a running server over its HTTP API, for scripts and
pipelines. Like the other tools it speaks the protocol and never imports the server.

    nereid rollout start MODEL VERSION --steps shadow=100%/60s,canary=10%/120s,canary=50%/120s [--sticky-key NAME]
    nereid rollout status MODEL [--json]
    nereid rollout pause|resume|abort|promote|undo MODEL
    nereid rollout history MODEL
Each takes --url HOST:PORT (the HTTP port, default localhost:8000)."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from nereid.tools.common import ToolParser, run_tool, split_host_port

__all__ = ["main"]

_ACTIONS = ("pause", "resume", "abort", "promote", "undo")


class RolloutToolError(Exception):
    """A failed call (the server's error message) or a bad flag."""


@dataclass(frozen=True, slots=True)
class _Command:
    verb: str
    model: str
    version: str
    steps: str
    sticky_key: str
    base: str
    as_json: bool


def _parser() -> ToolParser:
    parser = ToolParser(prog="nereid rollout", error_type=RolloutToolError, description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("verb", choices=["start", "status", "history", *_ACTIONS])
    parser.add_argument("model")
    parser.add_argument("version", nargs="?", default="", help="the candidate version (start only)")
    parser.add_argument("--steps", default="", help="kind=percent/duration[:min_requests],... (start only)")
    parser.add_argument("--sticky-key", default="", help="the request parameter whose value keeps a user on one version")
    parser.add_argument("--url", default="localhost:8000", help="the server's HTTP address (default localhost:8000)")
    parser.add_argument("--json", action="store_true", help="status: print the one JSON object")
    return parser


def _parse(argv: list[str]) -> _Command:
    args = _parser().parse_args(argv)
    if args.verb == "start" and (not args.version or not args.steps):
        raise RolloutToolError("start needs MODEL VERSION and --steps, e.g. --steps shadow=100%/60s,canary=10%/120s")
    host, port = split_host_port(args.url, 8000)
    return _Command(args.verb, args.model, args.version, args.steps, args.sticky_key, f"http://{host}:{port}", args.json)


def _call(command: _Command, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(command.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("error", exc.reason)
        except ValueError:
            message = exc.reason
        raise RolloutToolError(f"{exc.code}: {message}") from None
    except urllib.error.URLError as exc:
        raise RolloutToolError(f"cannot reach {command.base}: {exc.reason}") from None


def _run(command: _Command) -> int:
    path = f"/v2/nereid/rollouts/{command.model}"
    if command.verb == "start":
        body = {"version": command.version, "steps": command.steps, "sticky_key": command.sticky_key}
        status = _call(command, "POST", path + "/start", body)
    elif command.verb in _ACTIONS:
        status = _call(command, "POST", f"{path}/{command.verb}", {})
    elif command.verb == "history":
        for event in _call(command, "GET", path + "/history")["history"]:
            detail = f": {event['detail']}" if event.get("detail") else ""
            sys.stdout.write(f"{event['at']:.3f} {event['event']}{detail}\n")
        return 0
    else:
        status = _call(command, "GET", path)
    if command.as_json:
        sys.stdout.write(json.dumps(status) + "\n")
    else:
        sys.stdout.write(_describe(status))
    return 0


def _describe(status: dict[str, Any]) -> str:
    lines = [f"model {status['model']}: version {status['candidate']} against {status['primary']}, {status['state']}, "
             f"step {status['step']} of {status['steps']}"]  # fmt: skip
    if status.get("reason"):
        lines.append(f"reason: {status['reason']}")
    for version, figures in status.get("versions", {}).items():
        lines.append(f"  version {version}: {figures['requests']} requests, {figures['errors']} errors, "
                     f"p99 {figures['p99_ms']} ms")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return run_tool(argv, prog="nereid rollout", print_help=_parser().print_help, parse=_parse, run=_run,
                    error=RolloutToolError, verbose=lambda command: False, debug_env="NEREID_DEBUG")  # fmt: skip
