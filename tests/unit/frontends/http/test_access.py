"""Forwarded headers (--http-header-forward-pattern): case-insensitive, and never a name reserved for Triton."""

from __future__ import annotations

import pytest

from nereid.core.errors import NereidError
from nereid.frontends.http.access import HeaderForwarder


def test_matching_headers_become_parameters_whatever_their_case() -> None:
    parameters: dict[str, object] = {}
    HeaderForwarder("MY_HEADER.*").forward([(b"my_header_1", b"v1"), (b"other", b"x")], parameters)
    assert parameters == {"my_header_1": "v1"}


@pytest.mark.parametrize("name", [b"sequence_id", b"priority", b"headers", b"triton_injected_via_header"])
def test_a_forwarded_header_that_takes_a_name_reserved_for_triton_is_refused(name: bytes) -> None:
    with pytest.raises(NereidError, match="is a parameter name reserved for Triton usage"):
        HeaderForwarder(".*").forward([(name, b"dummy-value")], {})
    HeaderForwarder("^x-").forward([(name, b"dummy-value")], {})  # not forwarded: nothing to refuse
