"""`nereid serve`'s flags refused at start with tritonserver's own words (Triton's qa/L0_http and L0_grpc grep for them)."""

from __future__ import annotations

import pytest

from nereid.core.request_parameters import header_pattern
from nereid.core.settings import SchedulerDelay
from nereid.serve_flags import parse_restricted_apis, parse_serve_args


def test_an_api_restricted_twice_is_refused_in_tritonservers_words() -> None:
    with pytest.raises(ValueError, match="restricted api 'health' can not be specified in multiple config groups"):
        parse_restricted_apis("--http-restricted-api", ["model-repository,health:k1=v1", "metadata,health:k2=v2"])
    with pytest.raises(ValueError, match="restricted protocol 'health' can not be specified in multiple config groups"):
        parse_restricted_apis("--grpc-restricted-protocol", ["model-repository,health:k1=v1", "metadata,health:k2=v2"])


def test_an_unknown_restricted_api_is_refused_in_tritonservers_words() -> None:
    with pytest.raises(ValueError, match="unknown restricted api 'model-reposit'"):
        parse_restricted_apis("--http-restricted-api", ["model-reposit,health:k1=v1"])
    with pytest.raises(ValueError, match="unknown restricted protocol 'model-reposit'"):
        parse_restricted_apis("--grpc-restricted-protocol", ["model-reposit,health:k1=v1"])


@pytest.mark.parametrize("size", ["0", "-1024"])
def test_an_http_max_input_size_that_is_not_positive_is_refused(size: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_serve_args(["--model-repository=/models", f"--http-max-input-size={size}"], env={})
    assert "Error: --http-max-input-size must be greater than 0." in capsys.readouterr().err


def test_header_forward_patterns_ignore_case_unless_they_start_with_re2_s_case_sensitive_flag() -> None:
    assert header_pattern("MY_HEADER.*").search("my_header_1")
    assert not header_pattern("(?-i)MY_HEADER.*").search("my_header_1")
    assert header_pattern("(?-i)MY_HEADER.*").search("MY_HEADER_1")
    settings = parse_serve_args(["--model-repository=/models", "--grpc-header-forward-pattern=(?-i)MY_HEADER.*"], env={})
    assert settings.grpc_header_forward_pattern == "(?-i)MY_HEADER.*"


def test_tritonservers_scheduler_delay_variables_are_read_as_it_reads_them() -> None:
    env = {"TRITONSERVER_DELAY_SCHEDULER": "10", "TRITONSERVER_BACKLOG_DELAY_SCHEDULER": "2x"}  # atoi: "2x" is 2
    assert parse_serve_args(["--model-repository=/models"], env=env).scheduler_delay == SchedulerDelay(10, 2)
    assert parse_serve_args(["--model-repository=/models"], env={}).scheduler_delay == SchedulerDelay(0, 0)
