"""A PyTriton-compatible API: `from nereid.pytriton.triton import Triton` serves Python functions as Triton models
in this process, through Nereid's own Server (no tritonserver binary, no extra hop between processes).

The modules mirror PyTriton's (`triton`, `model_config`, `decorators`, `exceptions`, `proxy.types`), so a PyTriton
program changes only its import prefix. Importing this package starts nothing.
"""

from __future__ import annotations

__all__: list[str] = []
