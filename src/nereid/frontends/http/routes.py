"""The HTTP port's route table: each v2 path pattern with the handler of each method it serves, matched in one walk
over the path's segments that yields the handler and the path's parameters, or Triton's 404 or 405 answer.

Routing only: it knows nothing of what a handler does. A pattern is literal segments and `{name}` parameters
(`{name:int}` takes digits only); a literal segment wins over a parameter at the same place, as the more specific
route does in Triton."""

from __future__ import annotations

from typing import Generic, TypeVar

from nereid.frontends.http.reply import NOT_FOUND, Reply

__all__ = ["Route", "RouteTable"]

H = TypeVar("H")

# Paths remembered with their match: the hot path (the same few /infer paths) then costs one dictionary lookup.
# Bounded, so that a client sending ever new paths only ever pays the walk.
_MAX_REMEMBERED = 1024


class Route(Generic[H]):
    """One path pattern: its handler per method, and the answer to any other method."""

    __slots__ = ("handlers", "not_allowed")

    def __init__(self, handlers: dict[str, H], not_allowed: Reply) -> None:
        self.handlers = handlers
        self.not_allowed = not_allowed


class _Node(Generic[H]):
    __slots__ = ("children", "parameter", "digits_only", "route")

    def __init__(self) -> None:
        self.children: dict[str, _Node[H]] = {}
        self.parameter: _Node[H] | None = None  # the segment is a parameter here
        self.digits_only = False
        self.route: Route[H] | None = None


class RouteTable(Generic[H]):
    def __init__(self) -> None:
        self._root: _Node[H] = _Node()
        self._remembered: dict[str, tuple[Route[H], tuple[str, ...]]] = {}

    def add(self, pattern: str, handlers: dict[str, H], not_allowed: Reply) -> None:
        """Serve `pattern` (e.g. "/v2/models/{model}/versions/{version:int}/infer") with `handlers` by method;
        `not_allowed` answers the other methods."""
        node = self._root
        for segment in pattern.strip("/").split("/"):
            if segment.startswith("{"):
                digits_only = segment.endswith(":int}")
                if node.parameter is None:
                    node.parameter = _Node()
                    node.digits_only = digits_only
                elif node.digits_only != digits_only:
                    raise ValueError(f"route {pattern!r}: two kinds of parameter at one place")
                node = node.parameter
            else:
                node = node.children.setdefault(segment, _Node())
        if node.route is not None:
            raise ValueError(f"route {pattern!r} is defined twice")
        node.route = Route(handlers, not_allowed)

    def resolve(self, method: str, path: str) -> tuple[H, tuple[str, ...]] | Reply:
        """The handler for `method` on `path` and the path's parameters in pattern order, or the Reply that
        answers instead (404 when no route takes the path, the route's 405 when it does not serve the method)."""
        found = self._remembered.get(path)
        if found is None:
            parameters: list[str] = []
            route = _match(self._root, path[1:].split("/"), 0, parameters)
            if route is None:
                return NOT_FOUND
            found = (route, tuple(parameters))
            if len(self._remembered) < _MAX_REMEMBERED:
                self._remembered[path] = found
        handler = found[0].handlers.get(method)
        if handler is None:
            return found[0].not_allowed
        return handler, found[1]


def _match(node: _Node[H], parts: list[str], index: int, parameters: list[str]) -> Route[H] | None:
    if index == len(parts):
        return node.route
    part = parts[index]
    child = node.children.get(part)
    if child is not None:
        route = _match(child, parts, index + 1, parameters)
        if route is not None:
            return route
    parameter = node.parameter
    if parameter is not None and part and (not node.digits_only or part.isdigit()):
        parameters.append(part)
        route = _match(parameter, parts, index + 1, parameters)
        if route is not None:
            return route
        parameters.pop()
    return None
