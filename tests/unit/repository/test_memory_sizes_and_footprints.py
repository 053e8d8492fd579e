"""The orchestration flags' value parsing and the footprint book (estimates, the state file), without a server."""

from __future__ import annotations

import asyncio
import gc
import mmap
import os
import subprocess
import sys
import weakref
from pathlib import Path

import numpy as np
import psutil
import pytest

from nereid.repository import footprints
from nereid.repository.footprints import (
    Footprint,
    FootprintBook,
    HeapRelease,
    Nvml,
    process_memory,
    release_freed_heap,
)
from nereid.repository.memory_sizes import parse_group_limit, parse_memory_budget, parse_memory_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1073741824", 1 << 30), ("512MiB", 512 << 20), ("1.5GiB", 3 << 29), ("2GB", 2 * 10**9), ("25%", 250), ("64 kib", 64 << 10)],
)
def test_memory_sizes_take_bytes_units_and_percentages(text: str, expected: int) -> None:
    assert parse_memory_size(text, "--model-memory-budget", total=1000) == expected


@pytest.mark.parametrize(("text", "message"), [("12XB", "not a size"), ("0", "more than 0"), ("150%", "percentage"), ("%", "percentage")])
def test_bad_memory_sizes_name_the_flag_and_the_form(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        parse_memory_size(text, "--model-memory-budget", total=1000)
    assert "--model-memory-budget" in str(caught.value)


def test_budgets_split_host_and_per_gpu_forms() -> None:
    budget = parse_memory_budget(["4GiB", "gpu1:2GiB"], gpu_count=2)
    assert budget.host_bytes == 4 << 30 and budget.gpu_bytes == {1: 2 << 30}
    assert parse_memory_budget(["gpu*:1GiB"], gpu_count=3).gpu_bytes == {0: 1 << 30, 1: 1 << 30, 2: 1 << 30}
    with pytest.raises(ValueError, match="no GPU is visible"):
        parse_memory_budget(["gpu0:1GiB"], gpu_count=None)
    with pytest.raises(ValueError, match="names GPU 4"):
        parse_memory_budget(["gpu4:1GiB"], gpu_count=2)
    with pytest.raises(ValueError, match="given twice"):
        parse_memory_budget(["1GiB,2GiB"], gpu_count=None)


def test_group_limits_are_name_colon_count() -> None:
    assert parse_group_limit(["gpu-heavy:2", "a:b:3"]) == {"gpu-heavy": 2, "a:b": 3}
    for bad in ("heavy", "heavy:0", ":2", "heavy:x"):
        with pytest.raises(ValueError, match="NAME:N"):
            parse_group_limit([bad])


def test_the_footprint_book_estimates_from_measured_models_of_the_same_backend(tmp_path: Path) -> None:
    book = FootprintBook("")
    unmeasured = book.estimate("python", files=1000, instances=2)
    assert unmeasured.source == "estimated" and unmeasured.host_bytes == 2000 + 2 * (48 << 20)
    book.record("a", "python", 1000, Footprint(31_000_000, {}, "measured"))
    book.record("b", "python", 3000, Footprint(33_000_000, {}, "measured"))
    # Files plus the mean overhead the same backend measured beyond its files.
    assert book.estimate("python", files=500, instances=1).host_bytes == 500 + (30_999_000 + 32_997_000) // 2
    assert book.estimate("onnxruntime", files=500, instances=1).host_bytes == 1000 + (8 << 20)


def test_the_state_file_remembers_footprints_while_the_files_keep_their_size(tmp_path: Path) -> None:
    path = tmp_path / "state" / "footprints.json"
    book = FootprintBook(str(path))
    book.record("m", "onnxruntime", 4096, Footprint(12_345_678, {0: 1000}, "measured"))
    book.save()
    again = FootprintBook(str(path))
    remembered = again.remembered("m", 4096)
    assert remembered is not None and remembered.host_bytes == 12_345_678 and remembered.gpu_bytes == {0: 1000}
    assert remembered.source == "remembered"
    assert again.remembered("m", 4097) is None  # the files changed: measure again
    path.write_text("{not json")
    assert FootprintBook(str(path)).remembered("m", 4096) is None  # unreadable: start without it


def test_nvml_is_simply_unavailable_without_a_gpu() -> None:
    nvml = Nvml()
    if nvml.available:
        pytest.skip("this machine has an NVIDIA GPU")
    assert nvml.device_count == 0 and nvml.used_by([1, 2]) == {}


_MAPPER = """
import mmap, os, sys
arena = mmap.mmap(int(sys.argv[1]), int(sys.argv[2]))
arena.write(b"x" * len(arena))  # touch every page, as a worker writing its outputs does
print("mapped", flush=True)
sys.stdin.read()
"""


def test_a_worker_is_charged_its_shared_memory_arenas_whole() -> None:
    size = 16 << 20
    fd = os.memfd_create("footprint-test")
    os.ftruncate(fd, size)
    ours = mmap.mmap(fd, size)
    ours.write(b"y" * size)  # the server maps (and touches) the same arena: its pages are shared, in no one's USS
    child = subprocess.Popen([sys.executable, "-c", _MAPPER, str(fd), str(size)], pass_fds=(fd,),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == b"mapped"
        uss = psutil.Process(child.pid).memory_full_info().uss
        assert process_memory(child.pid) - uss >= size - (1 << 20)
    finally:
        child.kill()
        child.wait()
        ours.close()
        os.close(fd)


def test_releasing_freed_heap_collects_the_cycles_an_unloaded_model_left() -> None:
    class Holder:
        pass

    holder = Holder()
    holder.me = holder  # type: ignore[attr-defined]
    holder.tensor = np.ones(1 << 20, dtype=np.float32)  # type: ignore[attr-defined]
    alive = weakref.ref(holder)
    del holder
    gc.disable()  # the server raises the collector's thresholds; here it does not run by itself at all
    try:
        assert alive() is not None
        asyncio.run(release_freed_heap())
        assert alive() is None
    finally:
        gc.enable()


def test_an_unload_does_not_wait_for_the_release_of_its_heap_which_comes_soon_after(monkeypatch) -> None:
    monkeypatch.setattr(footprints, "RELEASE_AFTER_UNLOAD_SECS", 0.05)

    class Holder:
        pass

    async def scenario() -> None:
        heap = HeapRelease()
        left: list[weakref.ref[Holder]] = []
        for _ in range(3):  # three unloads in a row share one collection
            holder = Holder()
            holder.me = holder  # type: ignore[attr-defined]
            left.append(weakref.ref(holder))
            del holder
            heap.after_unload()
            await asyncio.sleep(0)
        assert all(ref() is not None for ref in left)  # the unloads returned before any collection
        await asyncio.sleep(0.3)
        assert all(ref() is None for ref in left)

    gc.disable()
    try:
        asyncio.run(scenario())
    finally:
        gc.enable()
