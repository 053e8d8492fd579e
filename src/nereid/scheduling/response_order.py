"""Responses in the order their requests were issued (the sequence batcher's `oldest.preserve_ordering`): a
request's responses wait while an earlier request has not sent its final one. It only holds and releases
responses; it never decides what executes."""

from __future__ import annotations

from collections.abc import Callable

from nereid.core.types import InferenceRequest, InferenceResponse

__all__ = ["ResponseOrder"]

Respond = Callable[[InferenceResponse], None]


class ResponseOrder:
    """Tickets in issue order; the head ticket's responses pass straight through, the others are held."""

    __slots__ = ("_next", "_head", "_held")

    def __init__(self) -> None:
        self._next = 0
        self._head = 0
        # ticket -> (the request's own respond, its held responses)
        self._held: dict[int, tuple[Respond, list[InferenceResponse]]] = {}

    def take_ticket(self, request: InferenceRequest) -> None:
        """Route the request's responses through the order, from now on."""
        ticket = self._next
        self._next += 1
        respond = request.respond

        def ordered(response: InferenceResponse) -> None:
            if ticket != self._head:
                self._held.setdefault(ticket, (respond, []))[1].append(response)
                return
            respond(response)
            if response.final:
                self._advance()

        request.respond = ordered

    def _advance(self) -> None:
        """The head finished: release what the next tickets hold, up to the first one still unfinished."""
        while True:
            self._head += 1
            entry = self._held.pop(self._head, None)
            if entry is None:
                return
            respond, responses = entry
            finished = False
            for response in responses:
                respond(response)
                finished = finished or response.final
            if not finished:
                return
