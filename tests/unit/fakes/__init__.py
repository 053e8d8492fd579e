"""Fakes more than one package of the unit tests uses: an asyncio transport (transport.py) and a backend whose
models say in their parameters what they answer (backend.py). A package's own fakes live beside its tests."""
