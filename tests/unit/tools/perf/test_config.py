"""`nereid perf` settings: perf_analyzer's range syntax, shapes, and the checks that name the bad flag."""

from __future__ import annotations

import pytest

from nereid.tools.perf import PerfConfig, PerfError, parse_concurrency_range, parse_perf_args, parse_request_rate_range
from nereid.tools.perf.config import parse_sequence_id_range, parse_shape


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4", (4, 4, 1)), ("1:8", (1, 8, 1)), ("2:16:2", (2, 16, 2)), ("1:0:4", (1, 0, 4)), (" 3 ", (3, 3, 1))],
)
def test_concurrency_range_accepts_start_end_step(text: str, expected: tuple[int, int, int]) -> None:
    assert parse_concurrency_range(text) == expected


@pytest.mark.parametrize("text", ["", "a", "1:x", "0", "4:2", "1:4:0", "1:4:1:3", "1::2", "-1:4", "1.5"])
def test_malformed_concurrency_range_names_the_flag(text: str) -> None:
    with pytest.raises(PerfError, match="--concurrency-range"):
        parse_concurrency_range(text)


def test_request_rate_range_takes_decimals() -> None:
    assert parse_request_rate_range("10.5:20:2.5") == (10.5, 20.0, 2.5)
    assert PerfConfig("m", request_rate_range=(10.5, 20.0, 2.5)).levels() == [10.5, 13.0, 15.5, 18.0]
    for bad in ("abc", "0", "5:1", "nan", "inf:inf", "1:2:-1"):
        with pytest.raises(PerfError, match="--request-rate-range"):
            parse_request_rate_range(bad)


def test_levels_follow_the_range() -> None:
    assert PerfConfig("m").levels() == [1.0]
    assert PerfConfig("m", concurrency_range=(1, 7, 3)).levels() == [1.0, 4.0, 7.0]
    assert PerfConfig("m", concurrency_range=(2, 0, 2), latency_threshold_ms=5).levels()[:3] == [2.0, 4.0, 6.0]


def test_shape_and_sequence_id_range_parsing() -> None:
    assert parse_shape("INPUT0:3,224,224") == ("INPUT0", [3, 224, 224])
    assert parse_shape("ns:name:2") == ("ns:name", [2])
    assert parse_sequence_id_range("5") == (5, None)
    assert parse_sequence_id_range("5:10") == (5, 10)
    for bad in ("NOSHAPE", ":1,2", "X:a,b", "X:-1"):
        with pytest.raises(PerfError, match="--shape"):
            parse_shape(bad)
    for bad in ("0", "5:5", "a:b", "1:2:3"):
        with pytest.raises(PerfError, match="--sequence-id-range"):
            parse_sequence_id_range(bad)


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"concurrency_range": (1, 2, 1), "request_rate_range": (1.0, 1.0, 1.0)}, "cannot be used together"),
        ({"batch_size": 0}, "-b"),
        ({"measurement_interval_ms": 0}, "--measurement-interval"),
        ({"max_trials": 2}, "--max-trials"),
        ({"percentile": 100}, "--percentile"),
        ({"streaming": True}, "--streaming needs -i grpc"),
        ({"concurrency_range": (1, 0, 1)}, "--latency-threshold"),
        ({"shared_memory": "cuda"}, "--shared-memory"),
        ({"protocol": "tcp"}, "-i"),
    ],
)
def test_validate_names_the_offending_flag(kwargs: dict[str, object], flag: str) -> None:
    with pytest.raises(PerfError, match=flag):
        PerfConfig("m", **kwargs).validate()  # type: ignore[arg-type]


def test_cli_flags_use_perf_analyzer_names() -> None:
    config, outputs = parse_perf_args(
        [
            "-m", "simple", "-x", "2", "-u", "h:9", "-i", "grpc", "-b", "4", "--concurrency-range", "1:4:2",
            "--measurement-interval", "250", "--stability-percentage", "5", "--max-trials", "6", "--percentile", "95",
            "--input-data", "zero", "--shape", "IN:3,4", "--streaming", "--async", "--sequence-length", "7",
            "--shared-memory", "system", "-f", "out.csv", "--json", "-H", "X-A: b",
        ]
    )  # fmt: skip
    assert (config.model_name, config.model_version, config.url, config.protocol) == ("simple", "2", "h:9", "grpc")
    assert (config.batch_size, config.concurrency_range, config.measurement_interval_ms) == (4, (1, 4, 2), 250)
    assert (config.stability_percentage, config.max_trials, config.percentile) == (5.0, 6, 95)
    assert config.input_data == ["zero"] and config.shapes == {"IN": [3, 4]}
    assert config.streaming and config.async_mode and config.sequence_length == 7 and config.sequence_length_given
    assert config.shared_memory == "system" and config.headers == {"X-A": "b"}
    assert outputs.csv_path == "out.csv" and outputs.json_path == "-"


def test_cli_rejects_unknown_flags_with_one_line() -> None:
    with pytest.raises(PerfError, match="unknown flag"):
        parse_perf_args(["-m", "x", "--nope"])
    with pytest.raises(PerfError, match="required: -m"):
        parse_perf_args([])
