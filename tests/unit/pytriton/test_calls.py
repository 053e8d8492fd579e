"""Where a bound function's batches run: on the event loop once measured far shorter than the hand-off to the
instance thread, on that thread otherwise."""

from __future__ import annotations

from nereid.pytriton._calls import LOOP_BATCH_NS, CallPlacement


def _measured_on_thread(placement: CallPlacement, per_request_ns: list[int], requests: int = 1) -> None:
    for ns in per_request_ns:
        placement.observe(ns * requests, requests, on_loop=False)


def test_an_unmeasured_callable_runs_on_its_thread() -> None:
    assert not CallPlacement().on_loop(1)


def test_the_fastest_of_eight_thread_runs_decides_and_bigger_batches_stay_on_the_thread() -> None:
    placement = CallPlacement()
    _measured_on_thread(placement, [400_000] * 7)
    assert not placement.on_loop(1)  # seven runs are not enough
    _measured_on_thread(placement, [20_000])  # one quick run among slow ones (the others waited for the GIL)
    assert placement.on_loop(1)
    largest = LOOP_BATCH_NS // 20_000
    assert placement.on_loop(largest - 1)
    assert not placement.on_loop(largest + 1)


def test_a_callable_that_slows_down_on_the_loop_goes_back_to_its_thread_and_can_return() -> None:
    placement = CallPlacement()
    _measured_on_thread(placement, [10_000] * 8)
    assert placement.on_loop(4)
    for _ in range(20):
        placement.observe(5_000_000, 1, on_loop=True)
    assert not placement.on_loop(1)
    _measured_on_thread(placement, [10_000] * 8)
    assert placement.on_loop(1)


def test_a_callable_that_needs_its_thread_is_measured_there_again() -> None:
    placement = CallPlacement()
    _measured_on_thread(placement, [10_000] * 8)
    placement.leave_loop()
    assert not placement.on_loop(1)
