"""The server-wide request memory budget (--request-memory-limit): reservations against the limit, the share kept
for small requests, the refusal's words, and the flag's forms and errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from nereid.core.errors import Status, grpc_code_name, http_status
from nereid.core.request_memory import (
    SMALL_REQUEST_BYTES,
    RequestMemoryBudget,
    default_request_memory_limit,
    format_size,
    usable_memory,
)
from nereid.core.settings import TransportLimits
from nereid.serve_flags import parse_request_memory_limit, parse_serve_args

MiB = 1 << 20
GiB = 1 << 30


def test_reservations_add_up_to_the_limit_and_releases_give_them_back() -> None:
    budget = RequestMemoryBudget(512 * MiB)
    assert budget.try_reserve(200 * MiB) and budget.try_reserve(200 * MiB)
    assert budget.held == 400 * MiB
    assert not budget.try_reserve(200 * MiB)  # would pass the limit: nothing is reserved
    assert budget.held == 400 * MiB and budget.refused == 1
    budget.release(200 * MiB)
    assert budget.try_reserve(200 * MiB)
    budget.release(400 * MiB)
    assert budget.held == 0


def test_small_requests_still_fit_when_large_ones_have_filled_their_share() -> None:
    budget = RequestMemoryBudget(512 * MiB)
    assert budget.try_reserve(448 * MiB)  # large requests may fill all but an eighth
    assert not budget.try_reserve(2 * MiB)  # a large one is refused past that...
    for _ in range(64):
        assert budget.try_reserve(SMALL_REQUEST_BYTES)  # ...while small ones use the eighth kept for them
    assert not budget.try_reserve(1)
    assert budget.held == 512 * MiB


def test_a_request_larger_than_the_limit_is_refused_even_on_an_idle_server() -> None:
    budget = RequestMemoryBudget(512 * MiB)
    assert not budget.try_reserve(GiB)
    error = budget.error(GiB)
    assert error.status is Status.RESOURCE_EXHAUSTED
    assert error.message.startswith("request memory limit of 512 MiB reached: this request needs 1 GiB")
    assert "--request-memory-limit" in error.message


def test_the_refusal_names_the_limit_and_what_is_held() -> None:
    budget = RequestMemoryBudget(512 * MiB)
    assert budget.try_reserve(300 * MiB)
    assert not budget.try_reserve(200 * MiB)
    message = budget.error(200 * MiB).message
    assert message == (
        "request memory limit of 512 MiB reached: requests in progress hold 300 MiB and this request needs 200 MiB "
        "more; retry later, or raise --request-memory-limit"
    )


def test_the_refusal_is_503_over_http_and_resource_exhausted_over_grpc() -> None:
    assert http_status(Status.RESOURCE_EXHAUSTED) == 503
    assert grpc_code_name(Status.RESOURCE_EXHAUSTED) == "RESOURCE_EXHAUSTED"


def test_a_limit_of_zero_means_no_limit() -> None:
    budget = RequestMemoryBudget(0)
    assert budget.try_reserve(1 << 40) and budget.try_reserve(1 << 40)


def test_sizes_are_written_as_an_operator_reads_them() -> None:
    assert [format_size(n) for n in (300, 2048, 512 * MiB, 1536 * MiB, 3 * GiB)] == [
        "300 bytes", "2 KiB", "512 MiB", "1.5 GiB", "3 GiB",
    ]  # fmt: skip


# -- the flag -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("536870912", 512 * MiB),
        ("512MiB", 512 * MiB),
        ("512 MiB", 512 * MiB),
        ("512Mi", 512 * MiB),
        ("1GiB", GiB),
        ("1.5GiB", 1536 * MiB),
        ("2048KiB", 2 * MiB),
        ("512M", 512_000_000),  # the plain suffixes are decimal, as for --model-memory-budget
        ("2G", 2_000_000_000),
        ("25%", 4 * GiB),
        ("12.5%", 2 * GiB),
        ("0", 0),
    ],
)
def test_the_flag_takes_bytes_binary_and_decimal_units_and_a_share_of_memory(text: str, expected: int) -> None:
    assert parse_request_memory_limit(text, total=16 * GiB) == expected


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("lots", "'lots' is not a size"),
        ("-5MiB", "'-5MiB' is not a size"),
        ("512XB", "'512XB' is not a size"),
        ("150%", "'150%' is not a percentage in (0, 100]"),
        ("0%", "'0%' is not a percentage in (0, 100]"),
        ("1000", "below the 1 MiB"),
        ("", "'' is not a size"),
    ],
)
def test_bad_values_get_an_error_naming_the_flag(text: str, words: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        parse_request_memory_limit(text, total=16 * GiB)
    assert str(excinfo.value).startswith("--request-memory-limit: ") and words in str(excinfo.value)


def test_serve_takes_the_flag_into_its_settings(tmp_path: Path) -> None:
    settings = parse_serve_args(["--model-repository", str(tmp_path), "--request-memory-limit=512MiB"])
    assert settings.limits.request_memory_limit == 512 * MiB


def test_serve_defaults_to_a_quarter_of_the_memory_the_server_may_use(tmp_path: Path) -> None:
    settings = parse_serve_args(["--model-repository", str(tmp_path)])
    assert settings.limits.request_memory_limit == usable_memory() // 4 == default_request_memory_limit()
    assert TransportLimits().request_memory_limit == settings.limits.request_memory_limit
    assert 0 < usable_memory()


def test_serve_refuses_a_bad_value_with_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as excinfo:
        parse_serve_args(["--model-repository", str(tmp_path), "--request-memory-limit=plenty"])
    assert excinfo.value.code == 2
    assert "--request-memory-limit: 'plenty' is not a size" in capsys.readouterr().err
