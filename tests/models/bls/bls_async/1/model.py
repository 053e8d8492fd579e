"""BLS with `async def execute` and `await request.async_exec()`: several calls in flight at once."""

import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bls_driver", "1"))

import commands  # noqa: E402


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            command = commands.command_of(request)
            if command.get("op") != "infer":
                responses.append(commands.answer(commands.run(command)))
                continue
            decoupled = bool(command.get("decoupled", False))
            calls = [commands.build_request(command).async_exec(decoupled=decoupled)
                     for _ in range(int(command.get("concurrency", 1)))]
            start = time.monotonic()
            try:
                results = await asyncio.gather(*calls)
                result = {"results": [commands.collect(r, decoupled, command.get("cancel_after")) for r in results]}
            except Exception as exc:
                result = {"exception": f"{type(exc).__name__}: {exc}"}
            result["elapsed_ms"] = (time.monotonic() - start) * 1000
            responses.append(commands.answer(result))
        return responses
