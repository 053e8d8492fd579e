"""The orchestration flags' value parsing and the footprint book (estimates, the state file), without a server."""

from __future__ import annotations

from pathlib import Path

import pytest

from nereid.repository.footprints import Footprint, FootprintBook, Nvml
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
