"""ResponseRecorder: how each response of a decoupled request is charged to its index in response_stats."""

from __future__ import annotations

from nereid.core.errors import NereidError, Status
from nereid.core.statistics import ModelStatistics, ResponseRecorder
from nereid.core.types import InferenceResponse


def _counts(stats: ModelStatistics) -> dict[str, dict[str, int]]:
    return {key: {name: value["count"] for name, value in entry.items() if value["count"]}
            for key, entry in stats.as_dict()["response_stats"].items()}  # fmt: skip


def test_each_response_is_charged_to_its_index_by_its_kind() -> None:
    stats = ModelStatistics("m", "1")
    delivered: list[InferenceResponse] = []
    recorder = ResponseRecorder(delivered.append, stats, start_ns=0)
    recorder(InferenceResponse("m", "1", final=False))
    recorder(InferenceResponse("m", "1", error=NereidError.invalid("bad"), final=False))
    recorder(InferenceResponse("m", "1", error=NereidError(Status.CANCELLED, "gone"), final=False))
    recorder(InferenceResponse("m", "1", final=True, complete_only=True))
    assert len(delivered) == 4  # every response still reaches the request's own callback
    assert _counts(stats) == {
        "0": {"compute_infer": 1, "compute_output": 1, "success": 1},
        "1": {"compute_infer": 1, "compute_output": 1, "fail": 1},
        "2": {"cancel": 1},
        "3": {"empty_response": 1},
    }
    first = stats.responses[0]
    assert first.success.ns == first.compute_infer.ns + first.compute_output.ns > 0


def test_a_response_is_timed_from_the_end_of_the_one_before() -> None:
    stats = ModelStatistics("m", "1")
    recorder = ResponseRecorder(lambda response: None, stats, start_ns=0)
    recorder(InferenceResponse("m", "1", final=False))
    after_first = recorder.last_ns
    recorder(InferenceResponse("m", "1", final=True))
    second = stats.responses[1]
    assert 0 < second.success.ns <= recorder.last_ns - after_first
    assert stats.as_dict()["memory_usage"] == []
