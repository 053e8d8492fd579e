"""The in-process server API and the types every layer shares; knows nothing of wire formats."""
