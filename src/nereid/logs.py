"""Logging in Triton's format and levels, and the settings the logging endpoints read and change."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

from nereid.core.settings import ServerSettings

__all__ = ["configure_logging", "log_settings", "update_log_settings"]

_LEVEL_LETTERS = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E", logging.CRITICAL: "E"}


class _TritonFormatter(logging.Formatter):
    """`I1129 18:24:28.015121 2359 module.py:12] "message"` (default) or ISO8601 with the same tail. As in Triton,
    the message is quoted and escaped (a tab reads `\\t`, a new line `\\n`), so each record is one line that no
    model or client text can forge another record into."""

    def __init__(self, iso8601: bool) -> None:
        super().__init__()
        self.iso8601 = iso8601

    def format(self, record: logging.LogRecord) -> str:
        letter = _LEVEL_LETTERS.get(record.levelno, "I")
        seconds = record.created
        micros = int((seconds % 1) * 1_000_000)
        where = f"{os.path.basename(record.pathname)}:{record.lineno}"
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        message = json.dumps(message, ensure_ascii=False)
        if self.iso8601:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
            return f"{stamp} {letter} {os.getpid()} {where}] {message}"
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime(seconds))
        return f"{letter}{stamp}.{micros:06d} {os.getpid()} {where}] {message}"


_state: dict[str, Any] = {}


def configure_logging(settings: ServerSettings) -> None:
    root = logging.getLogger("nereid")
    for old in list(root.handlers):
        root.removeHandler(old)
    handler: logging.Handler = (
        logging.FileHandler(settings.log_file) if settings.log_file else logging.StreamHandler(sys.stderr)
    )
    handler.setFormatter(_TritonFormatter(settings.log_format.lower() == "iso8601"))
    root.addHandler(handler)
    root.propagate = False
    _state.update(
        log_file=settings.log_file,
        log_info=settings.log_info,
        log_warning=settings.log_warning,
        log_error=settings.log_error,
        log_verbose_level=settings.log_verbose,
        log_format=settings.log_format,
    )
    _apply()


def _apply() -> None:
    root = logging.getLogger("nereid")
    if _state.get("log_verbose_level", 0) > 0:
        root.setLevel(logging.DEBUG)
    elif _state.get("log_info", True):
        root.setLevel(logging.INFO)
    elif _state.get("log_warning", True):
        root.setLevel(logging.WARNING)
    elif _state.get("log_error", True):
        root.setLevel(logging.ERROR)
    else:
        root.setLevel(logging.CRITICAL + 1)


def log_settings() -> dict[str, Any]:
    defaults = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True, "log_verbose_level": 0, "log_format": "default"}
    return {key: _state.get(key, value) for key, value in defaults.items()}


def update_log_settings(changes: dict[str, Any]) -> dict[str, Any]:
    """Apply the known keys (unknown ones are ignored, as Triton ignores them) and return the result."""
    from nereid.core.errors import NereidError

    for key in ("log_info", "log_warning", "log_error"):
        if key in changes:
            if not isinstance(changes[key], bool):
                raise NereidError.invalid(f"expect boolean for '{key}'")
            _state[key] = changes[key]
    if "log_verbose_level" in changes:
        value = changes["log_verbose_level"]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise NereidError.invalid("expect unsigned integer for 'log_verbose_level'")
        _state["log_verbose_level"] = value
    if "log_format" in changes:
        if changes["log_format"] not in ("default", "ISO8601"):
            raise NereidError.invalid(
                f"invalid argument for log_format, got: {changes['log_format']}; expected 'default' or 'ISO8601'"
            )
        _state["log_format"] = changes["log_format"]
        for handler in logging.getLogger("nereid").handlers:
            handler.setFormatter(_TritonFormatter(changes["log_format"] == "ISO8601"))
    if "log_file" in changes and changes["log_file"] != _state.get("log_file", ""):
        raise NereidError.unsupported(
            "log file location can not be updated through network protocol; start the server with --log-file"
        )
    _apply()
    return log_settings()
