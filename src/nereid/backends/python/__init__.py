"""The Python backend (Triton `model.py` files in worker processes); `BACKEND` is imported on first use.

The worker process imports this package too, so it must stay light: the server-side modules load lazily.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BACKEND"]


def __getattr__(name: str) -> Any:
    if name == "BACKEND":
        from nereid.backends.python.backend import BACKEND

        return BACKEND
    raise AttributeError(f"module 'nereid.backends.python' has no attribute '{name}'")
