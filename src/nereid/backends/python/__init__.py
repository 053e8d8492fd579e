"""The Python backend (Triton `model.py` files in worker processes); `new_backend` (one backend per Server) is
imported on first use.

The worker process imports this package too, so it must stay light: the server-side modules load lazily.
"""

from __future__ import annotations

from typing import Any

__all__ = ["new_backend"]


def __getattr__(name: str) -> Any:
    if name == "new_backend":
        from nereid.backends.python.backend import new_backend

        return new_backend
    raise AttributeError(f"module 'nereid.backends.python' has no attribute '{name}'")
