"""Runs each request's JSON command through BLS from a plain (blocking) execute; see commands.py."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import commands  # noqa: E402


class TritonPythonModel:
    def execute(self, requests):
        return [commands.answer(commands.run(commands.command_of(request))) for request in requests]
