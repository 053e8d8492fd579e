"""The HTTP routes of rollouts, under Nereid's own namespace /v2/nereid/rollouts (docs/rollouts.md): JSON in, the
Server's rollout status out. Only translation: the rollout logic is the Server's."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from nereid.core.errors import NereidError
from nereid.frontends.http.codec import json_object
from nereid.frontends.http.reply import Reply, json_reply
from nereid.frontends.http.request import HttpRequest

__all__ = ["ROLLOUT_ACTIONS", "rollout_routes"]

ROLLOUT_ACTIONS = ("pause", "resume", "abort", "promote", "undo")

Handler = Callable[[HttpRequest], Awaitable[Reply]]


def rollout_routes(server: Any) -> list[tuple[str, dict[str, Handler]]]:
    """The rollout routes and their handlers over `server` (the in-process Server's rollout API)."""

    async def every(request: HttpRequest) -> Reply:
        return json_reply(server.rollout_status())

    async def status(request: HttpRequest) -> Reply:
        return json_reply(server.rollout_status(request.parameters[0]))

    async def start(request: HttpRequest) -> Reply:
        body = json_object(request.body) if request.body else {}
        version, steps, sticky = body.get("version"), body.get("steps"), body.get("sticky_key", "")
        if not isinstance(version, str | int) or not isinstance(steps, str) or not isinstance(sticky, str):
            raise NereidError.invalid(
                'a rollout needs {"version": "<candidate version>", "steps": "kind=percent/duration,...", '
                '"sticky_key": "<parameter name>" (optional)}'
            )
        return json_reply(await server.start_rollout(request.parameters[0], str(version), steps, sticky))

    async def history(request: HttpRequest) -> Reply:
        return json_reply(server.rollout_history(request.parameters[0]))

    def action(name: str) -> Handler:
        async def act(request: HttpRequest) -> Reply:
            return json_reply(await server.rollout_action(request.parameters[0], name))

        return act

    base = "/v2/nereid/rollouts"
    routes: list[tuple[str, dict[str, Handler]]] = [
        (base, {"GET": every}),
        (base + "/{model}", {"GET": status}),
        (base + "/{model}/start", {"POST": start}),
        (base + "/{model}/history", {"GET": history}),
    ]
    routes += [(f"{base}/{{model}}/{name}", {"POST": action(name)}) for name in ROLLOUT_ACTIONS]
    return routes
