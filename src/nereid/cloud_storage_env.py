"""The environment that Triton's cloud-storage model repositories honour, read here and only here: each
--model-repository URL (s3://, gs://, as://) becomes the local folder the server reads and the settings of the copy
that fills it, with the credentials of AWS_*, GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_* or Triton's
TRITON_CLOUD_CREDENTIAL_PATH file, the emulator endpoints and the TRITON_*_MOUNT_DIRECTORY folders. It reaches no
store."""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nereid.core.settings import AzureRepository, GcsRepository, S3Repository
from nereid.repository.azure import azure_repository, is_azure_url, parse_azure_url
from nereid.repository.gcs import gcs_repository, is_gcs_url
from nereid.repository.s3 import is_s3_url, s3_repository

__all__ = ["ModelRepositories", "credential_for", "model_repositories", "read_credential_file"]

_CREDENTIAL_FILE_VARIABLE = "TRITON_CLOUD_CREDENTIAL_PATH"
# Triton's credential file: one section per scheme; what an entry holds in each.
_S3_FIELDS = {"key_id": "access_key_id", "secret_key": "secret_access_key", "session_token": "session_token",
              "region": "region", "profile": "profile"}  # fmt: skip
_AZURE_FIELDS = ("account_str", "account_key")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")


@dataclass(slots=True)
class ModelRepositories:
    """The --model-repository flags: every folder the server reads (in flag order), and the remote copies."""

    local: list[Path] = field(default_factory=list)
    s3: list[S3Repository] = field(default_factory=list)
    gcs: list[GcsRepository] = field(default_factory=list)
    azure: list[AzureRepository] = field(default_factory=list)


def read_credential_file(path: str) -> dict[str, dict[str, Any]]:
    """Triton's credential file: {"gs": {name: path}, "s3": {name: {...}}, "as": {name: {...}}}, where a name is the
    start of the repository URLs its entry is for ("" for all). ValueError naming the file when it is unreadable."""
    where = f"{_CREDENTIAL_FILE_VARIABLE} '{path}'"
    try:
        content = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"{where}: cannot read the credential file: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ValueError(f"{where}: expected a JSON credential file: {exc}") from None
    if not isinstance(content, dict):
        raise ValueError(f"{where}: expected a JSON object with \"gs\", \"s3\" and \"as\" sections")
    sections: dict[str, dict[str, Any]] = {}
    for scheme in ("gs", "s3", "as"):
        section = content.get(scheme, {})
        if not isinstance(section, dict):
            raise ValueError(f"{where}: section \"{scheme}\" must be an object of path prefix -> credential")
        for name, entry in section.items():
            expected = str if scheme == "gs" else dict
            if not isinstance(entry, expected):
                what = "a credentials file path" if scheme == "gs" else "an object"
                raise ValueError(f"{where}: \"{scheme}\" credential '{name}' must be {what}")
        sections[scheme] = section
    return sections


def credential_for(sections: Mapping[str, Mapping[str, Any]], url: str) -> Any:
    """The entry of the URL's section whose name is the longest start of the URL, as Triton matches them;
    ValueError when none is (Triton then refuses the repository too)."""
    scheme = url.partition("://")[0]
    section = sections.get(scheme, {})
    names = [name for name in section if url.startswith(name)]
    if not names:
        raise ValueError(
            f"{_CREDENTIAL_FILE_VARIABLE}: no \"{scheme}\" credential matches model repository '{url}' "
            "(name an entry after the start of the URL, or \"\" for every repository)"
        )
    return section[max(names, key=len)]


def _mount_directory(env: Mapping[str, str], variable: str, default_name: str) -> Path:
    """Where a store's local copies go: Triton's TRITON_*_MOUNT_DIRECTORY, else a folder of this user's in the
    temporary directory (kept between runs, so a restart fetches only what changed)."""
    return Path(env.get(variable) or Path(tempfile.gettempdir()) / f"{default_name}-{os.getuid()}")


def _s3_credentials(env: Mapping[str, str], file_entry: Mapping[str, Any] | None) -> dict[str, str]:
    if file_entry is not None:
        credentials = {ours: str(file_entry.get(theirs) or "") for theirs, ours in _S3_FIELDS.items()}
        where = "the credential file's key_id and secret_key"
    else:
        credentials = {
            "access_key_id": env.get("AWS_ACCESS_KEY_ID", ""),
            "secret_access_key": env.get("AWS_SECRET_ACCESS_KEY", ""),
            "session_token": env.get("AWS_SESSION_TOKEN", ""),
            "region": env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION", ""),
        }
        where = "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    if bool(credentials["access_key_id"]) != bool(credentials["secret_access_key"]):
        raise ValueError(f"{where} must be set together")
    return credentials


def _gcs_endpoint(env: Mapping[str, str]) -> str:
    """STORAGE_EMULATOR_HOST, the variable Google's clients honour for an emulator, as a URL."""
    host = env.get("STORAGE_EMULATOR_HOST", "").strip().rstrip("/")
    return host if not host or "://" in host else f"http://{host}"


def _azure_connection_string(env: Mapping[str, str], url: str) -> str:
    """AZURE_STORAGE_CONNECTION_STRING, checked against the URL's account where it names one."""
    value = env.get("AZURE_STORAGE_CONNECTION_STRING", "").strip()
    if not value:
        return ""
    parts = dict(part.split("=", 1) for part in value.split(";") if "=" in part)
    named = parts.get("AccountName", "")
    account = parse_azure_url(url).account
    if named and named != account:
        raise ValueError(f"model repository '{url}': AZURE_STORAGE_CONNECTION_STRING is for account '{named}', not '{account}'")
    return value


def _remote_repository(
    url: str, env: Mapping[str, str], sections: Mapping[str, Mapping[str, Any]] | None
) -> S3Repository | GcsRepository | AzureRepository | None:
    """The settings of a cloud URL's copy; None for a folder."""
    if not (is_s3_url(url) or is_gcs_url(url) or is_azure_url(url)):
        if _SCHEME.match(url):
            raise ValueError(f"model repository '{url}': expected a folder, s3://, gs:// or as://")
        return None
    entry = credential_for(sections, url) if sections is not None else None
    if is_s3_url(url):
        cache = _mount_directory(env, "TRITON_AWS_MOUNT_DIRECTORY", "nereid-s3")
        return s3_repository(url, cache, _s3_credentials(env, entry))
    if is_gcs_url(url):
        cache = _mount_directory(env, "TRITON_GCS_MOUNT_DIRECTORY", "nereid-gcs")
        key_file = str(entry) if entry is not None else env.get("GOOGLE_APPLICATION_CREDENTIALS", "")
        return gcs_repository(url, cache, key_file, _gcs_endpoint(env))
    cache = _mount_directory(env, "TRITON_AZURE_MOUNT_DIRECTORY", "nereid-azure")
    if entry is not None:
        account, key = (str(entry.get(name) or "") for name in _AZURE_FIELDS)
        return azure_repository(url, cache, account, key)
    connection_string = _azure_connection_string(env, url)
    if connection_string:  # it names the endpoint, the account and the credential itself
        return azure_repository(url, cache, connection_string=connection_string)
    return azure_repository(url, cache, env.get("AZURE_STORAGE_ACCOUNT", ""), env.get("AZURE_STORAGE_KEY", ""))


def model_repositories(paths: list[str], env: Mapping[str, str]) -> ModelRepositories:
    """Local folders as given (resolved); a cloud URL becomes the folder its copy is fetched into. With
    TRITON_CLOUD_CREDENTIAL_PATH set, credentials come from that file only, as in Triton; emulator endpoints and
    mount directories still come from the environment. ValueError for a bad URL or credential."""
    file_path = env.get(_CREDENTIAL_FILE_VARIABLE, "")
    sections = read_credential_file(file_path) if file_path and any(_SCHEME.match(p) for p in paths) else None
    result = ModelRepositories()
    for path in paths:
        repository = _remote_repository(path, env, sections)
        if repository is None:
            result.local.append(Path(path).resolve())
            continue
        result.local.append(repository.local_path)
        if isinstance(repository, S3Repository):
            result.s3.append(repository)
        elif isinstance(repository, GcsRepository):
            result.gcs.append(repository)
        else:
            result.azure.append(repository)
    return result
