"""Client shared memory is off unless --allow-client-shm (Triton's words and status), a key names one object in
/dev/shm (no folders, no symlinks), and reads stay inside the span the client registered."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from nereid.core.errors import NereidError, Status
from nereid.core.shared_memory import CLIENT_SHM_DISABLED, SharedMemoryRegistry


@pytest.fixture
def shm_object() -> Iterator[str]:
    key = f"nereid_registry_test_{os.getpid()}"
    path = Path("/dev/shm") / key
    path.write_bytes(bytes(range(64)))
    yield key
    path.unlink(missing_ok=True)


def test_register_and_unregister_are_refused_unless_allowed(shm_object: str) -> None:
    registry = SharedMemoryRegistry()
    for attempt in (lambda: registry.register("r", shm_object, 0, 64), registry.check_allowed):
        with pytest.raises(NereidError) as excinfo:
            attempt()
        assert (excinfo.value.status, excinfo.value.message) == (Status.UNSUPPORTED, CLIENT_SHM_DISABLED)
    assert CLIENT_SHM_DISABLED == "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
    assert registry.status() == []  # status stays allowed


@pytest.mark.parametrize("key", ["../../etc/passwd", "/a/b", ".."])
def test_a_key_that_is_not_one_object_in_dev_shm_is_refused(key: str) -> None:
    registry = SharedMemoryRegistry(allow_client=True)
    with pytest.raises(NereidError) as excinfo:
        registry.register("r", key, 0, 8)
    assert excinfo.value.message == f"Unable to open shared memory region: '{key}'"
    assert registry.status() == []


@pytest.mark.parametrize("key", ["", "/", "///"])
def test_an_empty_key_is_refused_in_triton_s_words(key: str) -> None:
    with pytest.raises(NereidError, match=f"cannot register shared memory region 'r' - invalid shm key '{key}'"):
        SharedMemoryRegistry(allow_client=True).register("r", key, 0, 8)


@pytest.mark.parametrize("key", ["triton_python_backend_shm_region_x", "///triton_python_backend_shm_region_x"])
def test_a_key_with_the_python_backend_s_reserved_prefix_is_refused(key: str) -> None:
    with pytest.raises(NereidError) as excinfo:
        SharedMemoryRegistry(allow_client=True).register("r", key, 0, 8)
    assert excinfo.value.message == (
        f"cannot register shared memory region 'r' with key '{key}' as the key contains the reserved prefix "
        "'triton_python_backend_shm_region_'"
    )


def test_offsets_outside_a_region_are_named_apart_from_spans_that_overrun_it(shm_object: str) -> None:
    registry = SharedMemoryRegistry(allow_client=True)
    registry.register("r", shm_object, 0, 64)
    for offset, size, words in ((64, 1, "Invalid offset for"), (-1, 1, "Invalid offset for"), (60, 8, "Invalid offset + byte size for"),
                                (32, 2**64 - 32, "Integer overflow detected: byte_size (18446744073709551584) + offset (32) exceeds 2^64 - 1 for")):  # fmt: skip
        with pytest.raises(NereidError, match=re.escape(f"{words} shared memory region: 'r'")):
            registry.read("r", offset, size, "UINT8", (size,))


def test_a_symlink_in_dev_shm_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "secret"
    target.write_bytes(b"s" * 64)
    link = Path("/dev/shm") / f"nereid_registry_link_{os.getpid()}"
    link.symlink_to(target)
    try:
        with pytest.raises(NereidError) as excinfo:
            SharedMemoryRegistry(allow_client=True).register("r", "/" + link.name, 0, 8)
        assert excinfo.value.status == Status.INTERNAL
    finally:
        link.unlink()


def test_reads_stay_inside_the_registered_span(shm_object: str) -> None:
    registry = SharedMemoryRegistry(allow_client=True)
    registry.register("r", "/" + shm_object, 16, 32)  # bytes 16..48 of the 64-byte object
    assert registry.read("r", 0, 4, "UINT8", (4,)).tolist() == [16, 17, 18, 19]
    for offset, size in ((0, 33), (30, 4), (-1, 4)):
        with pytest.raises(NereidError) as excinfo:
            registry.read("r", offset, size, "UINT8", (size,))
        assert excinfo.value.status == Status.INVALID_ARG
    with pytest.raises(NereidError):
        registry.register("big", "/" + shm_object, 32, 64)  # past the object's end
    registry.unregister("r")
    assert registry.status() == []
