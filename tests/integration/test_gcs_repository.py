"""Model repositories on Google Cloud Storage, against a real GCS emulator (gcp-storage-emulator, a subprocess on
loopback, reached through STORAGE_EMULATOR_HOST): serving from gs://bucket/path at start-up, polling that loads what
is uploaded later, an explicit load of a model uploaded after start-up, a local copy that fetches only what changed,
and a clear error for a bucket that cannot be read. One emulator and one server per control mode serve the module."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gcp_storage_emulator  # noqa: F401 - a dev dependency: a missing one fails here rather than skip
import pytest
import requests
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage  # the gcs extra

from nereid.core.errors import NereidError
from nereid.repository.gcs import GcsSync, gcs_repository
from tests.integration.remote_repository_models import (
    Upload,
    check_explicit_load_after_upload,
    check_local_copy_follows_changes,
    check_polling_loads_uploads,
    check_served_from_start_up,
    index,
    infer,
    start_emulator,
    upload_model,
    wait_for,
)
from tests.servers import RunningServer, free_port, start_nereid


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The emulator's host:port, as STORAGE_EMULATOR_HOST is usually written."""
    port = free_port()
    process = start_emulator(
        [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory", "-q"],
        lambda: requests.get(f"http://127.0.0.1:{port}/", timeout=1).ok,
        tmp_path_factory.mktemp("gcs") / "emulator.log",
    )
    yield f"127.0.0.1:{port}"
    process.terminate()
    process.wait(10)


@pytest.fixture(scope="module")
def client(emulator: str) -> Any:
    return storage.Client(project="nereid-test", credentials=AnonymousCredentials(), client_options={"api_endpoint": f"http://{emulator}"})


def _bucket(client: Any, name: str) -> tuple[Any, Upload]:
    """A new bucket holding `identity` below repo/, and what uploads more there."""
    bucket = client.create_bucket(name)

    def upload(path: str, body: bytes) -> None:
        bucket.blob(f"repo/{path}").upload_from_string(body)

    upload_model(upload, "identity")
    return bucket, upload


def _start(emulator: str, url: str | list[str], mount: Path, *args: str, env: dict[str, str] | None = None) -> RunningServer:
    environment = {"STORAGE_EMULATOR_HOST": emulator, "TRITON_GCS_MOUNT_DIRECTORY": str(mount), **(env or {})}
    return start_nereid(url, *args, log_dir=mount.parent, env=environment)


@pytest.fixture(scope="module")
def polling(emulator: str, client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Upload, Path]]:
    """A server polling gs://polled/repo every half second, and gs://second/repo (an empty bucket) beside it."""
    _, upload = _bucket(client, "polled")
    client.create_bucket("second")
    mount = tmp_path_factory.mktemp("gcs-polling") / "mount"
    server = _start(emulator, ["gs://polled/repo", "gs://second/repo"], mount, "--model-control-mode=poll", "--repository-poll-secs=0.5")
    yield server, upload, mount
    server.stop()


@pytest.fixture(scope="module")
def explicit(emulator: str, client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Upload]]:
    """A server in explicit mode over gs://explicit/repo, whose credential (none: anonymous, as an emulator wants)
    comes from Triton's credential file."""
    _, upload = _bucket(client, "explicit")
    folder = tmp_path_factory.mktemp("gcs-explicit")
    credentials = folder / "cloud_credential.json"
    credentials.write_text(json.dumps({"gs": {"": "", "gs://other-bucket": "/nonexistent/key.json"}}))
    server = _start(emulator, "gs://explicit/repo", folder / "mount", "--model-control-mode=explicit", "--load-model=identity",
                    env={"TRITON_CLOUD_CREDENTIAL_PATH": str(credentials)})  # fmt: skip
    yield server, upload
    server.stop()


def test_a_gcs_repository_is_served_from_start_up(polling: tuple[RunningServer, Upload, Path]) -> None:
    server, _upload, mount = polling
    check_served_from_start_up(server, mount)


def test_polling_loads_a_model_and_a_version_uploaded_to_the_gcs_bucket(polling: tuple[RunningServer, Upload, Path]) -> None:
    server, upload, _mount = polling
    check_polling_loads_uploads(server, upload)


def test_a_poll_that_cannot_read_a_bucket_is_skipped_and_the_models_keep_serving(
    client: Any, polling: tuple[RunningServer, Upload, Path]
) -> None:
    server, _upload, _mount = polling
    client.get_bucket("second").delete()
    try:
        wait_for(lambda: "failed to poll from model repository 'gs://second/repo'" in server.log(), "a poll fails")
        assert infer(server, "identity") == [1.5, -2.0]
        assert index(server)["identity:1"]["state"] == "READY"
    finally:
        client.create_bucket("second")  # the next rounds read both buckets again


def test_explicit_load_fetches_a_model_uploaded_to_gcs_after_start_up(explicit: tuple[RunningServer, Upload]) -> None:
    server, upload = explicit
    check_explicit_load_after_upload(server, upload)


# -- the local copy and errors ----------------------------------------------------------------------------------


def test_the_local_copy_refetches_a_gcs_object_only_when_its_generation_changes(emulator: str, client: Any, tmp_path: Path) -> None:
    bucket, upload = _bucket(client, "copied")
    upload("identity/3/", b"")  # a folder marker: an empty version folder
    sync = GcsSync(gcs_repository("gs://copied/repo", tmp_path, endpoint_url=f"http://{emulator}"))
    check_local_copy_follows_changes(sync, upload, lambda path: bucket.blob(f"repo/{path}").delete(), "identity/3/")


def test_a_gcs_bucket_that_cannot_be_read_raises_naming_the_repository(emulator: str, tmp_path: Path) -> None:
    sync = GcsSync(gcs_repository("gs://no-such-bucket/repo", tmp_path, endpoint_url=f"http://{emulator}"))
    with pytest.raises(NereidError, match=r"failed to poll from model repository 'gs://no-such-bucket/repo': 404"):
        sync.sync()


def test_a_missing_gcs_bucket_fails_start_up(emulator: str, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError) as failed:
        _start(emulator, "gs://no-such-bucket/repo", tmp_path / "mount")
    assert "failed to poll from model repository 'gs://no-such-bucket/repo'" in str(failed.value)
