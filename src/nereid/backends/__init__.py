"""Backends: one module (or package) per framework behind the protocol in `base`, each declared once in
`nereid.core.backend_registry`; frameworks import lazily."""
