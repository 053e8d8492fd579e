"""What the CLI makes of gs:// and as:// repositories and their environment (GOOGLE_APPLICATION_CREDENTIALS,
STORAGE_EMULATOR_HOST, AZURE_STORAGE_*, the mount directories), and of Triton's TRITON_CLOUD_CREDENTIAL_PATH file:
the entry whose name is the longest start of the URL, for each of gs, s3 and as."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from nereid.cloud_storage_env import credential_for, read_credential_file
from nereid.core.settings import ServerSettings
from nereid.serve_flags import parse_serve_args

AZURITE = "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"


def _serve(env: dict[str, str], *urls: str) -> ServerSettings:
    return parse_serve_args([arg for url in urls for arg in ("--model-repository", url)], env)


def _usage_error(env: dict[str, str], url: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        _serve(env, url)
    return capsys.readouterr().err


def test_gcs_repositories_take_the_key_file_the_emulator_and_the_mount_directory(tmp_path: Path) -> None:
    env = {"GOOGLE_APPLICATION_CREDENTIALS": "/keys/sa.json", "STORAGE_EMULATOR_HOST": "localhost:9023",
           "TRITON_GCS_MOUNT_DIRECTORY": str(tmp_path)}  # fmt: skip
    local = tmp_path / "local"
    local.mkdir()
    settings = _serve(env, str(local), "gs://models/prod/v2")
    [repository] = settings.gcs_repositories
    assert (repository.bucket, repository.prefix) == ("models", "prod/v2")
    assert (repository.credentials_file, repository.endpoint_url) == ("/keys/sa.json", "http://localhost:9023")
    assert repository.local_path.parent == tmp_path and repository.local_path.name.startswith("models-")
    assert settings.model_repositories == [local.resolve(), repository.local_path]  # in flag order
    assert settings.s3_repositories == [] and settings.azure_repositories == []


def test_without_environment_gcs_is_google_itself_with_the_default_chain() -> None:
    [repository] = _serve({}, "gs://models/prod").gcs_repositories
    assert (repository.credentials_file, repository.endpoint_url) == ("", "")
    assert repository.local_path.parent == Path(tempfile.gettempdir()) / f"nereid-gcs-{os.getuid()}"


def test_azure_repositories_take_triton_account_and_key_variables(tmp_path: Path) -> None:
    env = {"AZURE_STORAGE_ACCOUNT": "other", "AZURE_STORAGE_KEY": "SECRET", "TRITON_AZURE_MOUNT_DIRECTORY": str(tmp_path)}
    [repository] = _serve(env, "as://account/models/prod").azure_repositories
    # As in Triton, AZURE_STORAGE_ACCOUNT names the account read, over the URL's.
    assert (repository.account, repository.container, repository.prefix) == ("other", "models", "prod")
    assert (repository.account_key, repository.connection_string) == ("SECRET", "")
    assert repository.local_path.parent == tmp_path and repository.local_path.name.startswith("account-models-")
    assert "SECRET" not in repr(repository)


def test_an_azure_connection_string_names_the_endpoint_and_credential() -> None:
    env = {"AZURE_STORAGE_CONNECTION_STRING": AZURITE, "AZURE_STORAGE_KEY": "unused"}
    [repository] = _serve(env, "as://devstoreaccount1/models/prod").azure_repositories
    assert (repository.account, repository.account_key, repository.connection_string) == ("devstoreaccount1", "", AZURITE)
    assert "AccountKey" not in repr(repository)
    assert repository.local_path.parent == Path(tempfile.gettempdir()) / f"nereid-azure-{os.getuid()}"


def test_a_connection_string_for_another_account_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    error = _usage_error({"AZURE_STORAGE_CONNECTION_STRING": AZURITE}, "as://production/models/x", capsys)
    assert "model repository 'as://production/models/x': AZURE_STORAGE_CONNECTION_STRING is for account 'devstoreaccount1', not 'production'" in error


@pytest.mark.parametrize(("url", "expected"), [
    ("gs://Models/x", "model repository 'gs://Models/x': expected gs://bucket/path/to/repository"),
    ("as://account", "model repository 'as://account': expected as://account_name/container_name/path/to/repository"),
    ("http://host/models", "model repository 'http://host/models': expected a folder, s3://, gs:// or as://"),
])  # fmt: skip
def test_bad_repository_urls_are_usage_errors(url: str, expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert expected in _usage_error({}, url, capsys)


# -- Triton's credential file (TRITON_CLOUD_CREDENTIAL_PATH) ------------------------------------------------------

CREDENTIALS: dict[str, Any] = {
    "gs": {"": "/keys/default.json", "gs://special": "/keys/special.json", "gs://special-bucket/prod": "/keys/prod.json"},
    "s3": {
        "": {"key_id": "AKID", "secret_key": "SECRET", "region": "eu-west-1", "session_token": "", "profile": ""},
        "s3://archive": {"key_id": "", "secret_key": "", "region": "", "session_token": "", "profile": "archive"},
    },
    "as": {"as://account/models": {"account_str": "account", "account_key": "AZKEY"}},
}


@pytest.fixture
def credential_file(tmp_path: Path) -> dict[str, str]:
    """The environment with the credential file, and env credentials that the file takes the place of."""
    path = tmp_path / "cloud_credential.json"
    path.write_text(json.dumps(CREDENTIALS))
    return {"TRITON_CLOUD_CREDENTIAL_PATH": str(path), "GOOGLE_APPLICATION_CREDENTIALS": "/keys/env.json",
            "AWS_ACCESS_KEY_ID": "ENV", "AWS_SECRET_ACCESS_KEY": "ENV", "AZURE_STORAGE_KEY": "ENV",
            "AZURE_STORAGE_CONNECTION_STRING": AZURITE}  # fmt: skip


@pytest.mark.parametrize(("url", "expected"), [
    ("gs://other/x", "/keys/default.json"),  # "" matches every URL
    ("gs://special/x", "/keys/special.json"),
    ("gs://special-bucket/prod/models", "/keys/prod.json"),  # the longest name that starts the URL wins
    ("gs://special-bucket/staging", "/keys/special.json"),  # a name is a start of the URL, not a whole segment
])  # fmt: skip
def test_the_longest_matching_credential_name_is_used(url: str, expected: str) -> None:
    assert credential_for(CREDENTIALS, url) == expected


def test_credentials_come_from_the_file_instead_of_the_environment(credential_file: dict[str, str]) -> None:
    settings = _serve(credential_file, "gs://special/x", "s3://models/prod", "s3://archive/old", "as://account/models/prod")
    [gcs] = settings.gcs_repositories
    assert gcs.credentials_file == "/keys/special.json"
    default, archive = settings.s3_repositories
    assert (default.access_key_id, default.secret_access_key, default.region, default.profile) == ("AKID", "SECRET", "eu-west-1", "")
    assert (archive.access_key_id, archive.profile) == ("", "archive")
    [azure] = settings.azure_repositories
    assert (azure.account, azure.account_key, azure.connection_string) == ("account", "AZKEY", "")


def test_a_url_no_credential_matches_is_a_usage_error(credential_file: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    error = _usage_error(credential_file, "as://account/other/x", capsys)
    assert "TRITON_CLOUD_CREDENTIAL_PATH: no \"as\" credential matches model repository 'as://account/other/x'" in error


@pytest.mark.parametrize(("content", "expected"), [
    ("{not json", "expected a JSON credential file"),
    ("[]", "expected a JSON object with \"gs\", \"s3\" and \"as\" sections"),
    ('{"gs": []}', "section \"gs\" must be an object of path prefix -> credential"),
    ('{"gs": {"": {"path": "x"}}}', "\"gs\" credential '' must be a credentials file path"),
    ('{"as": {"": "key"}}', "\"as\" credential '' must be an object"),
])  # fmt: skip
def test_a_bad_credential_file_is_refused_naming_it(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "creds.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="TRITON_CLOUD_CREDENTIAL_PATH '.*creds.json'") as refused:
        read_credential_file(str(path))
    assert expected in str(refused.value)


def test_a_missing_credential_file_is_a_usage_error_only_for_cloud_repositories(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = {"TRITON_CLOUD_CREDENTIAL_PATH": str(tmp_path / "missing.json")}
    assert _serve(env, str(tmp_path)).model_repositories == [tmp_path.resolve()]
    assert "cannot read the credential file" in _usage_error(env, "gs://models/x", capsys)
