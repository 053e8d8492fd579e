"""The server log's line format: Triton's, with the message quoted and escaped so that no text a model or a client
sends can start a line of its own."""

from __future__ import annotations

import logging

from nereid.logs import _TritonFormatter


def _record(message: str) -> logging.LogRecord:
    return logging.LogRecord("nereid.test", logging.WARNING, "/x/rate_limiter.py", 96, message, None, None)


def test_a_message_is_quoted_and_its_tabs_new_lines_and_quotes_escaped() -> None:
    line = _TritonFormatter(iso8601=False).format(_record('Resource: R1\t Count: 3\nI0101 forged "line"'))
    assert "\n" not in line
    assert line.startswith("W") and line.endswith(' rate_limiter.py:96] "Resource: R1\\t Count: 3\\nI0101 forged \\"line\\""')


def test_iso8601_lines_end_the_same_way() -> None:
    line = _TritonFormatter(iso8601=True).format(_record("loading: simple:1"))
    assert line.endswith(' W ' + line.split(" ")[2] + ' rate_limiter.py:96] "loading: simple:1"')
