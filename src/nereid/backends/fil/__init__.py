"""Tree models served as Triton's FIL backend serves them; importing this package imports the tree frameworks
(the `fil` extra), so a missing one makes the backend UNAVAILABLE with that hint."""

from nereid.backends.fil.backend import BACKEND, FilBackend

__all__ = ["BACKEND", "FilBackend"]
