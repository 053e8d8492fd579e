"""Model repositories on Azure Blob Storage, against a real Azure Storage emulator (Azurite from npm, a subprocess on
loopback, reached through AZURE_STORAGE_CONNECTION_STRING): serving from as://account/container/path at start-up,
polling that loads what is uploaded later, an explicit load of a model uploaded after start-up, a local copy that
fetches only what changed (Data Lake folder markers included), and a clear error for a container that cannot be
read. One emulator and one server per control mode serve the module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from azure.storage import blob  # the azure extra: make installs it, and a missing one fails here

from nereid.core.errors import NereidError
from nereid.repository.azure import AzureSync, azure_repository
from tests.azurite_tool import fetch_azurite
from tests.integration.remote_repository_models import (  # noqa: E402
    Upload,
    check_explicit_load_after_upload,
    check_local_copy_follows_changes,
    check_polling_loads_uploads,
    check_served_from_start_up,
    start_emulator,
    upload_model,
)
from tests.servers import RunningServer, free_port, start_nereid  # noqa: E402

# Azurite's one account and its well-known key, which Microsoft publishes for the emulator.
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


@pytest.fixture(scope="module")
def connection_string(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Azurite's blob service on a free port, as the connection string that reaches it."""
    launcher = fetch_azurite()
    if launcher is None:
        pytest.fail("npm and node are needed to fetch and run Azurite (make system-deps installs them)")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}/{ACCOUNT}"
    process = start_emulator(
        # In memory, quiet, without telemetry; the API version check is off because the client library may be newer.
        [str(launcher), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence", "--silent",
         "--disableTelemetry", "--skipApiVersionCheck", "--loose"],  # fmt: skip
        lambda: requests.get(f"{endpoint}?comp=list", timeout=1).status_code > 0,  # any answer: it listens
        tmp_path_factory.mktemp("azurite") / "azurite.log",
    )
    yield f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};BlobEndpoint={endpoint};"
    process.terminate()
    process.wait(10)


@pytest.fixture(scope="module")
def service(connection_string: str) -> Any:
    return blob.BlobServiceClient.from_connection_string(connection_string)


def _container(service: Any, name: str) -> tuple[Any, Upload]:
    """A new container holding `identity` below repo/, and what uploads more there."""
    container = service.create_container(name)

    def upload(path: str, body: bytes) -> None:
        container.upload_blob(f"repo/{path}", body, overwrite=True)

    upload_model(upload, "identity")
    return container, upload


def _start(connection_string: str, url: str, mount: Path, *args: str) -> RunningServer:
    environment = {"AZURE_STORAGE_CONNECTION_STRING": connection_string, "TRITON_AZURE_MOUNT_DIRECTORY": str(mount)}
    return start_nereid(url, *args, log_dir=mount.parent, env=environment)


@pytest.fixture(scope="module")
def polling(connection_string: str, service: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Upload, Path]]:
    """A server polling as://devstoreaccount1/polled/repo every half second."""
    _, upload = _container(service, "polled")
    mount = tmp_path_factory.mktemp("azure-polling") / "mount"
    server = _start(connection_string, f"as://{ACCOUNT}/polled/repo", mount, "--model-control-mode=poll", "--repository-poll-secs=0.5")
    yield server, upload, mount
    server.stop()


@pytest.fixture(scope="module")
def explicit(connection_string: str, service: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Upload]]:
    """A server in explicit mode over as://devstoreaccount1/explicit/repo."""
    _, upload = _container(service, "explicit")
    mount = tmp_path_factory.mktemp("azure-explicit") / "mount"
    server = _start(connection_string, f"as://{ACCOUNT}/explicit/repo", mount, "--model-control-mode=explicit", "--load-model=identity")
    yield server, upload
    server.stop()


def test_an_azure_repository_is_served_from_start_up(polling: tuple[RunningServer, Upload, Path]) -> None:
    server, _upload, mount = polling
    check_served_from_start_up(server, mount)


def test_polling_loads_a_model_and_a_version_uploaded_to_the_azure_container(polling: tuple[RunningServer, Upload, Path]) -> None:
    server, upload, _mount = polling
    check_polling_loads_uploads(server, upload)


def test_explicit_load_fetches_a_model_uploaded_to_azure_after_start_up(explicit: tuple[RunningServer, Upload]) -> None:
    server, upload = explicit
    check_explicit_load_after_upload(server, upload)


# -- the local copy and errors ----------------------------------------------------------------------------------


def test_the_local_copy_refetches_an_azure_blob_only_when_its_etag_changes(connection_string: str, service: Any, tmp_path: Path) -> None:
    container, upload = _container(service, "copied")
    # A Data Lake (hierarchical namespace) account lists a folder as an empty blob marked hdi_isfolder.
    container.upload_blob("repo/identity/3", b"", metadata={"hdi_isfolder": "true"})
    sync = AzureSync(azure_repository(f"as://{ACCOUNT}/copied/repo", tmp_path, connection_string=connection_string))
    check_local_copy_follows_changes(sync, upload, lambda path: container.delete_blob(f"repo/{path}"), "identity/3")


def test_an_azure_container_that_cannot_be_read_raises_naming_the_repository(connection_string: str, tmp_path: Path) -> None:
    url = f"as://{ACCOUNT}/no-such-container/repo"
    sync = AzureSync(azure_repository(url, tmp_path, connection_string=connection_string))
    with pytest.raises(NereidError, match=rf"failed to poll from model repository '{url}': .*\(ContainerNotFound\)$"):
        sync.sync()


def test_a_missing_azure_container_fails_start_up(connection_string: str, tmp_path: Path) -> None:
    url = f"as://{ACCOUNT}/no-such-container/repo"
    with pytest.raises(RuntimeError) as failed:
        _start(connection_string, url, tmp_path / "mount")
    assert f"failed to poll from model repository '{url}'" in str(failed.value)
