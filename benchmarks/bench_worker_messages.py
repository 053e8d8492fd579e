"""The Python backend's worker messages: encode + decode round trips per second, typed messages against plain tuples.

The channel's messages are NamedTuples (`nereid.backends.python.protocol`); they travel as marshal-encoded plain
tuples behind a (length, kind) header. Before they were typed, a message was a plain tuple whose first item was its
kind, behind a 4-byte length. This times both forms on the hot path's messages (a batch's Execute and Result, a
decoupled model's Response, a BLS request and its response), each built, framed, cut out of the byte stream and
turned back into a message, the way the server and the worker do it (the typed form with protocol's frame
builders, which frame the fields without making the NamedTuple, and decoded into the NamedTuple). Pure CPU, one process, a few seconds:

    .venv/bin/python benchmarks/bench_worker_messages.py [--seconds 1.0] [--batch 1]
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
sys.path.insert(0, str(ROOT / "src"))

from nereid.backends.python.protocol import (  # noqa: E402
    bls_request_frame,
    bls_response_frame,
    execute_frame,
    response_frame,
    result_frame,
    split_frames,
)

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
        return split_frames(execute_frame(7, 1 << 20, requests))[0][0]

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

    return {
        "Execute": (execute_tuple, execute_typed),
        "Result": (result_tuple, result_typed),
        "Response": (response_tuple, response_typed),
        "BlsRequest": (bls_tuple, bls_typed),
        "BlsResponse": (bls_reply_tuple, bls_reply_typed),
    }


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
    args = parser.parse_args()
    print(f"Worker messages: encode + decode round trips per second (batch {args.batch}, fastest samples)\n")
    print("| message | plain tuples | typed messages | typed / tuples |")
    print("|---|---|---|---|")
    for name, (plain, typed) in _cases(args.batch).items():
        plain_rate, typed_rate = _rates(plain, typed, args.seconds)
        print(f"| {name} | {plain_rate:,.0f} | {typed_rate:,.0f} | {typed_rate / plain_rate:.2f} |")


if __name__ == "__main__":
    main()
