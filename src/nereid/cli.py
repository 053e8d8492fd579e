"""`nereid serve | sagemaker-serve | perf | analyze | rollout | ray`: the entry point, handing each subcommand its flags."""

from __future__ import annotations

import os
import sys

from nereid import cloud_env
from nereid.serve_flags import parse_serve_args

__all__ = ["main"]


def _serve(argv: list[str], env: dict[str, str] | None = None) -> int:
    settings = parse_serve_args(argv, env)
    from nereid.logs import configure_logging
    from nereid.serve import run_server

    configure_logging(settings)
    return run_server(settings)


def _sagemaker_serve(argv: list[str]) -> int:
    """What Triton's SageMaker container runs as `serve`: the SAGEMAKER_* variables become serve flags."""
    try:
        serve_argv, env = cloud_env.sagemaker_serve_argv(os.environ, argv)
    except ValueError as exc:
        sys.stderr.write(f"nereid sagemaker-serve: error: {exc}\n")
        return 1
    return _serve(serve_argv, env)


_USAGE = "usage: nereid {serve,sagemaker-serve,perf,analyze,rollout,ray} [flags]\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(_USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "serve":
        return _serve(rest)
    if command == "sagemaker-serve":
        return _sagemaker_serve(rest)
    if command == "perf":
        from nereid.tools.perf.cli import main as perf_main

        return perf_main(rest)
    if command == "analyze":
        from nereid.tools.analyze.cli import main as analyze_main

        return analyze_main(rest)
    if command == "rollout":
        from nereid.tools.rollout import main as rollout_main

        return rollout_main(rest)
    if command == "ray":  # `nereid ray serve`: needs the ray extra, imported only here
        from nereid.ray.cli import main as ray_main

        return ray_main(rest)
    sys.stderr.write(f"nereid: unknown command '{command}'\n{_USAGE}")
    return 2
