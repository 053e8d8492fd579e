"""Triton's own QA units against Nereid: see runner.py."""
