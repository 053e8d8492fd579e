"""await_all: gather's results and errors, without a task (and its loop turns) for a single awaitable."""

from __future__ import annotations

import asyncio

import pytest

from nereid.core.await_all import await_all


async def _task_and(value: int) -> tuple[asyncio.Task[object] | None, int]:
    return asyncio.current_task(), value


async def _fail() -> None:
    raise ValueError("no")


def test_a_single_awaitable_runs_in_the_callers_task_and_several_run_as_gather_runs_them() -> None:
    async def main() -> None:
        caller = asyncio.current_task()
        [(task, value)] = await await_all([_task_and(1)])
        assert task is caller and value == 1
        results = await await_all(_task_and(n) for n in (2, 3))
        assert [value for _task, value in results] == [2, 3]
        assert all(task is not caller for task, _value in results)
        assert await await_all([]) == []

    asyncio.run(main())


def test_errors_are_raised_or_returned_as_gather_does() -> None:
    async def main() -> None:
        with pytest.raises(ValueError, match="no"):
            await await_all([_fail()])
        [error] = await await_all([_fail()], return_exceptions=True)
        assert isinstance(error, ValueError)
        both = await await_all([_fail(), _task_and(4)], return_exceptions=True)
        assert isinstance(both[0], ValueError) and both[1][1] == 4

    asyncio.run(main())
