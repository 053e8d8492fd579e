"""The Python backend's worker messages: round trips per second, typed messages against plain tuples.

The channel's messages are NamedTuples (`nereid.backends.python.protocol`); they travel as marshal-encoded plain
tuples behind a (length, kind) header. Before they were typed, a message was a plain tuple whose first item was its
kind, behind a 4-byte length. This times both forms on the hot path's messages (a batch's Execute and Result, a
decoupled model's Response, a BLS request and its response), each built, framed, cut out of the byte stream and
turned back into a message, the way the server and the worker do it (the typed form with protocol's frame
builders, which frame the fields without making the NamedTuple, and decoded into the NamedTuple).

The last row never crosses the boundary: the server's side of a Result, its requests' answers made into the batch's
outcome. Plain, as before that was typed: a (batch error, [(error, parameters, outputs)], times) tuple, then each
request's response built from it; typed: each response built where the Result is read, in a `BatchOutcome`.

Pure CPU, one process, a few seconds. `--src` times another source tree's protocol (the code before a change):

    .venv/bin/python benchmarks/bench_worker_messages.py [--seconds 1.0] [--batch 1] [--src /tmp/before/src]
"""

from __future__ import annotations

import argparse
import marshal
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The source tree to time: --src, read before anything of nereid is imported.
_SRC = sys.argv[sys.argv.index("--src") + 1] if "--src" in sys.argv[:-1] else str(ROOT / "src")
sys.path.insert(0, _SRC)

import numpy as np  # noqa: E402

from nereid.backends.python.protocol import (  # noqa: E402
    bls_request_frame,
    bls_response_frame,
    execute_frame,
    response_frame,
    result_frame,
    split_frames,
)
from nereid.core.types import InferenceRequest, InferenceResponse, OutputTensor  # noqa: E402

# The untyped form: (kind, *fields) behind a 4-byte length.
_LENGTH = struct.Struct("<I")


def _tuple_encode(message: tuple[Any, ...]) -> bytes:
    data = marshal.dumps(message)
    return _LENGTH.pack(len(data)) + data


def _tuple_decode(frame: bytes) -> tuple[Any, ...]:
    """As the server's reader cut frames before: every complete frame in the bytes read, in a loop."""
    messages = []
    offset = 0
    total = len(frame)
    while total - offset >= 4:
        (size,) = _LENGTH.unpack_from(frame, offset)
        end = offset + 4 + size
        if end > total:
            break
        messages.append(marshal.loads(frame[offset + 4 : end]))
        offset = end
    message: tuple[Any, ...] = messages[0]
    return message


def _cases(batch: int) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    """Per message: (build+encode+decode as a plain tuple, the same as a typed message)."""
    meta_in = (("INPUT0", "FP32", (1, 4), 64, 16), ("INPUT1", "FP32", (1, 4), 128, 16))
    meta_out = (("OUTPUT0", "FP32", (1, 4), 64, 16), ("OUTPUT1", "FP32", (1, 4), 128, 16))
    requests = [(f"r{i}", 0, 0, 0, {}, None, meta_in) for i in range(batch)]
    responses = [(None, None, meta_out) for _ in range(batch)]
    times = (123456789, 123456999)

    def execute_tuple() -> Any:
        return _tuple_decode(_tuple_encode((2, 7, 1 << 20, requests)))

    def execute_typed() -> Any:
        return split_frames(execute_frame(7, 1 << 20, requests, 0))[0][0]

    def result_tuple() -> Any:
        return _tuple_decode(_tuple_encode((21, 7, 9, 1 << 20, None, responses, times, ())))

    def result_typed() -> Any:
        return split_frames(result_frame(7, 9, 1 << 20, None, responses, times, ()))[0][0]

    def response_tuple() -> Any:
        return _tuple_decode(_tuple_encode((27, 7, 0, 9, 1 << 20, None, None, meta_out, 0)))

    def response_typed() -> Any:
        return split_frames(response_frame(7, 0, 9, 1 << 20, None, None, meta_out, 0))[0][0]

    def bls_tuple() -> Any:
        payload = (9, 1 << 20, "model", "", "id", 0, 0, 0, {}, ("OUTPUT0",), meta_in, False)
        return _tuple_decode(_tuple_encode((23, 3, "bls", payload)))

    def bls_typed() -> Any:
        frame = bls_request_frame(3, 9, 1 << 20, "model", "", "id", 0, 0, 0, {}, ("OUTPUT0",), meta_in, False)
        return split_frames(frame)[0][0]

    def bls_reply_tuple() -> Any:
        return _tuple_decode(_tuple_encode((4, 3, None, (1 << 20, None, None, meta_out, True, 5))))

    def bls_reply_typed() -> Any:
        return split_frames(bls_response_frame(3, 1 << 20, None, None, meta_out, True, 5))[0][0]

    cases = {
        "Execute": (execute_tuple, execute_typed),
        "Result": (result_tuple, result_typed),
        "Response": (response_tuple, response_typed),
        "BlsRequest": (bls_tuple, bls_typed),
        "BlsResponse": (bls_reply_tuple, bls_reply_typed),
    }
    outcome = _outcome_case(batch)
    if outcome is not None:
        cases["Result -> BatchOutcome (server side)"] = outcome
    return cases


def _outcome_case(batch: int) -> tuple[Callable[[], Any], Callable[[], Any]] | None:
    """A Result's answers made into the batch's outcome and each request's response, as a plain tuple (the form
    before the outcome was typed) and as a BatchOutcome; None where the source tree has no BatchOutcome class."""
    from nereid.backends.python import worker_process

    outcome_type: Any = getattr(worker_process, "BatchOutcome", None)
    if not hasattr(outcome_type, "_fields"):
        return None
    array = np.ones((1, 4), dtype=np.float32)
    requests = [InferenceRequest("m", "1", [], id=f"r{i}") for i in range(batch)]
    answers = [(None, None, (("OUTPUT0", "FP32", (1, 4), 64, 16),)) for _ in range(batch)]
    times = (123456789, 123456999)

    def outputs(metas: Any) -> list[OutputTensor]:  # the arena copy, the same in both forms
        return [OutputTensor(name, datatype, shape, array) for name, datatype, shape, _, _ in metas]

    def plain() -> Any:
        decoded = []
        for error, parameters, metas in answers:
            if error is not None:
                decoded.append((error, parameters, None))
                continue
            decoded.append((None, parameters, outputs(metas)))
        outcome = (None, decoded, times)
        batch_error, entries, stamps = outcome
        assert batch_error is None
        responses = []
        for request, (error, parameters, tensors) in zip(requests, entries, strict=True):
            name, version, rid = request.model_name, request.model_version, request.id
            if error is not None:
                continue
            if parameters:
                responses.append(InferenceResponse(name, version, rid, tensors, parameters))
            else:
                responses.append(InferenceResponse(name, version, rid, tensors))
        return responses, stamps[0], stamps[1]

    def typed() -> Any:
        responses = []
        for request, (error, parameters, metas) in zip(requests, answers):
            name, version, rid = request.model_name, request.model_version, request.id
            if error is not None:
                continue
            if parameters:
                responses.append(InferenceResponse(name, version, rid, outputs(metas), parameters))
            else:
                responses.append(InferenceResponse(name, version, rid, outputs(metas)))
        outcome = tuple.__new__(outcome_type, (None, responses, times))  # as worker_process makes it
        assert outcome.error is None
        start, end = outcome.times
        return outcome.responses, start, end

    return plain, typed


def _rates(plain: Callable[[], Any], typed: Callable[[], Any], seconds: float) -> tuple[float, float]:
    """Round trips per second of each form, from the fastest of many short samples (500 calls each), the two forms
    taking turns: on a shared machine the fastest sample is the one least disturbed by other work."""
    best = [float("inf"), float("inf")]
    deadline = time.perf_counter() + seconds * 2
    while time.perf_counter() < deadline:
        for side, run in enumerate((plain, typed)):
            start = time.perf_counter()
            for _ in range(500):
                run()
            best[side] = min(best[side], (time.perf_counter() - start) / 500)
    return 1 / best[0], 1 / best[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="seconds per form and message")
    parser.add_argument("--batch", type=int, default=1, help="requests per Execute (responses per Result)")
    parser.add_argument("--src", default=_SRC, help="the source tree to time (default: this checkout's src)")
    args = parser.parse_args()
    print(f"Worker messages: round trips per second (batch {args.batch}, fastest samples, {args.src})\n")
    print("| message | plain tuples | typed messages | typed / tuples |")
    print("|---|---|---|---|")
    for name, (plain, typed) in _cases(args.batch).items():
        plain_rate, typed_rate = _rates(plain, typed, args.seconds)
        print(f"| {name} | {plain_rate:,.0f} | {typed_rate:,.0f} | {typed_rate / plain_rate:.2f} |")


if __name__ == "__main__":
    main()
