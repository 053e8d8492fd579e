"""Nereid: an inference server in Python that speaks Triton's protocols and reads Triton's model repositories."""

__version__ = "0.1.0"
# The version reported by server metadata; clients only display it.
__all__ = ["__version__"]
