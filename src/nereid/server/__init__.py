"""The in-process Server (Triton's C API in Python) that every frontend and embedding program goes through."""

from nereid.server.in_process import EXTENSIONS, Server

__all__ = ["EXTENSIONS", "Server"]
