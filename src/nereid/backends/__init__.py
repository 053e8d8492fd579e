"""Backends: one module (or package) per framework behind the protocol in `base`; frameworks import lazily."""
