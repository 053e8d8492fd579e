"""The requests of a batch that a model which is not decoupled answers through its response sender after
execute() returned None for them: which those are, and the wait for their final flags (Triton completes such a request
when its sender sends the final flag, from any thread)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from nereid.backends.python import pb_utils

__all__ = ["LateResponses", "answered_later"]

_RESCHEDULE = pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE


def answered_later(requests: list[pb_utils.InferenceRequest], result: Any) -> list[pb_utils.InferenceRequest]:
    """The requests execute() returned None for (all of them when it returned None) that took their response
    sender and have not sent their response yet: they answer after execute() returned."""
    if result is not None and len(result) != len(requests):
        return []  # the worker refuses a wrong count when it encodes the result
    return [
        request
        for index, request in enumerate(requests)
        if request._sender is not None
        and request._sent is None
        and not request._final
        and request._release_flags != _RESCHEDULE
        and (result is None or result[index] is None)
    ]


class LateResponses:
    """The requests of a batch (of a model that is not decoupled) that took their response sender and got None from
    execute(): Triton completes such a request when its sender sends the final flag, from any thread, after execute()
    returned. `done` is called once every one has had its final flag, or had its sender dropped unused (garbage
    collected: Triton frees the request's response factory then, and Nereid fails the request rather than let it
    wait forever)."""

    __slots__ = ("lock", "left", "done", "label")

    def __init__(self, requests: list[pb_utils.InferenceRequest], done: Callable[[], object], label: str) -> None:
        self.lock = threading.RLock()  # re-entrant: a sender's __del__ may run in a thread that holds it
        self.left = len(requests)
        self.done = done
        self.label = label
        with self.lock:
            for request in requests:
                request._pending = self
            for request in requests:
                ref = request._sender
                if ref is None or ref() is None:
                    self.dropped(request)

    def finished(self, request: pb_utils.InferenceRequest) -> None:
        with self.lock:
            if request._pending is not self:
                return
            request._pending = None
            self.left -= 1
            if self.left == 0:
                self.done()

    def dropped(self, request: pb_utils.InferenceRequest) -> None:
        """The request's sender is gone before the final flag: its response (if it sent one) or an error."""
        with self.lock:
            if request._pending is not self:
                return
            if request._sent is None:
                request._sent = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(
                        f"{self.label}: the response sender of request {request._index} was deleted before it sent a "
                        f"response with the final flag (pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL), and "
                        f"execute() returned no response for it",
                        pb_utils.TritonError.INTERNAL,
                    )
                )
            request._final = True
            self.finished(request)
