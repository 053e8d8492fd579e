"""Model repositories on S3, against a real S3-compatible server (moto in server mode, a subprocess on loopback):
serving from s3://host:port/bucket/path, polling that sees models added, changed and removed, explicit loads that
read the bucket as it is, a local copy that fetches only what changed, and clear start-up errors."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import tritonclient.http as httpclient

boto3 = pytest.importorskip("boto3", reason="the s3 extra (boto3) is not installed")
pytest.importorskip("moto.server", reason="moto[server] (a dev dependency) is not installed")

from nereid.core.errors import NereidError  # noqa: E402
from nereid.repository.s3 import S3Sync, s3_repository  # noqa: E402
from tests.integration.remote_repository_models import (  # noqa: E402
    CONFIG,
    IDENTITY,
    index,
    infer,
    model_files,
    start_emulator,
    wait_for,
)
from tests.servers import free_port, start_nereid  # noqa: E402

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "nereid-test", "AWS_SECRET_ACCESS_KEY": "nereid-secret", "AWS_DEFAULT_REGION": "us-east-1"}

@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    process = start_emulator(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        lambda: requests.get(endpoint + "/moto-api/", timeout=1).status_code == 200,
        tmp_path_factory.mktemp("moto") / "moto.log",
    )
    yield endpoint
    process.terminate()
    process.wait(10)


@pytest.fixture
def bucket(s3_endpoint: str, request: pytest.FixtureRequest) -> Any:
    """A fresh bucket per test on the S3 server, as a boto3 Bucket."""
    s3 = boto3.resource("s3", endpoint_url=s3_endpoint, aws_access_key_id="x", aws_secret_access_key="x", region_name="us-east-1")
    name = "models-" + request.node.name.lower().replace("_", "-")[:40].strip("-")
    created = s3.Bucket(name)
    created.create()
    return created


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The AWS_* credentials and TRITON_AWS_MOUNT_DIRECTORY the served process inherits; returns the mount folder."""
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    mount = tmp_path / "mount"
    monkeypatch.setenv("TRITON_AWS_MOUNT_DIRECTORY", str(mount))
    return mount


def _upload_model(bucket: Any, prefix: str, name: str, versions: tuple[int, ...] = (1,)) -> None:
    for path, body in model_files(name, versions).items():
        bucket.put_object(Key=f"{prefix}/{path}", Body=body)


def _url(endpoint: str, bucket: Any, prefix: str) -> str:
    return f"s3://{endpoint.removeprefix('http://')}/{bucket.name}/{prefix}"


def test_models_in_an_s3_compatible_bucket_are_served_to_tritonclient(
    s3_endpoint: str, bucket: Any, environment: Path, tmp_path: Path
) -> None:
    _upload_model(bucket, "repo", "identity")
    server = start_nereid(_url(s3_endpoint, bucket, "repo"), log_dir=tmp_path)
    try:
        assert infer(server, "identity") == [1.5, -2.0]
        assert index(server)["identity:1"]["state"] == "READY"
        copies = list(environment.iterdir())  # fetched under TRITON_AWS_MOUNT_DIRECTORY
        assert any((c / "identity" / "1" / "model.py").is_file() for c in copies if c.is_dir())
    finally:
        server.stop()


def test_polling_sees_models_added_changed_and_removed_in_the_bucket(
    s3_endpoint: str, bucket: Any, environment: Path, tmp_path: Path
) -> None:
    _upload_model(bucket, "repo/nested", "identity")
    server = start_nereid(
        _url(s3_endpoint, bucket, "repo/nested"), "--model-control-mode=poll", "--repository-poll-secs=0.5", log_dir=tmp_path
    )
    try:
        assert infer(server, "identity") == [1.5, -2.0]
        _upload_model(bucket, "repo/nested", "second")
        wait_for(lambda: index(server).get("second:1", {}).get("state") == "READY", "the added model is ready")
        assert infer(server, "second") == [1.5, -2.0]
        # A new version under the default policy (latest 1) replaces version 1: the model scales by its version.
        bucket.put_object(Key="repo/nested/identity/2/model.py", Body=IDENTITY.encode())
        wait_for(lambda: index(server).get("identity:2", {}).get("state") == "READY", "version 2 is ready")
        wait_for(lambda: infer(server, "identity") == [3.0, -4.0], "requests reach version 2")
        bucket.objects.filter(Prefix="repo/nested/second/").delete()
        wait_for(lambda: not any(key.startswith("second:") for key in index(server)), "the removed model is gone")
        assert infer(server, "identity") == [3.0, -4.0]  # untouched by the removal
    finally:
        server.stop()


def test_explicit_load_reads_the_bucket_as_it_is_at_the_load(s3_endpoint: str, bucket: Any, environment: Path, tmp_path: Path) -> None:
    _upload_model(bucket, "repo", "identity")
    server = start_nereid(_url(s3_endpoint, bucket, "repo"), "--model-control-mode=explicit", log_dir=tmp_path)
    try:
        _upload_model(bucket, "repo", "late")  # uploaded after start-up
        client = httpclient.InferenceServerClient(server.http_url)
        client.load_model("late")
        assert client.is_model_ready("late")
        client.close()
        assert infer(server, "late") == [1.5, -2.0]
    finally:
        server.stop()


def test_a_missing_bucket_fails_start_up_naming_the_repository(s3_endpoint: str, environment: Path, tmp_path: Path) -> None:
    url = f"s3://{s3_endpoint.removeprefix('http://')}/no-such-bucket/repo"
    with pytest.raises(RuntimeError) as failed:
        start_nereid(url, log_dir=tmp_path, timeout=60)
    assert f"failed to poll from model repository '{url}'" in str(failed.value)
    assert "NoSuchBucket" in str(failed.value)


def test_an_unreachable_endpoint_fails_start_up_naming_the_repository(environment: Path, tmp_path: Path) -> None:
    url = f"s3://127.0.0.1:{free_port()}/models/repo"
    with pytest.raises(RuntimeError) as failed:
        start_nereid(url, log_dir=tmp_path, timeout=120)
    assert f"failed to poll from model repository '{url}'" in str(failed.value)


# -- the local copy ---------------------------------------------------------------------------------------------


def _sync(s3_endpoint: str, bucket: Any, prefix: str, cache: Path) -> S3Sync:
    credentials = {"access_key_id": "x", "secret_access_key": "x"}
    return S3Sync(s3_repository(_url(s3_endpoint, bucket, prefix), cache, credentials))


def test_the_local_copy_fetches_only_what_changed_and_deletes_what_went(s3_endpoint: str, bucket: Any, tmp_path: Path) -> None:
    _upload_model(bucket, "repo", "a", versions=(1, 2))
    bucket.put_object(Key="repo/a/3/", Body=b"")  # a folder marker: an empty version folder
    sync = _sync(s3_endpoint, bucket, "repo", tmp_path)
    root = sync.repository.local_path
    assert sync.sync() is True
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == [
        "a", "a/1", "a/1/model.py", "a/2", "a/2/model.py", "a/3", "a/config.pbtxt",
    ]  # fmt: skip
    stamp = (root / "a/1/model.py").stat().st_mtime_ns
    assert sync.sync() is False  # nothing changed: nothing fetched, mtimes kept, so polling sees no change
    assert (root / "a/1/model.py").stat().st_mtime_ns == stamp
    bucket.put_object(Key="repo/a/config.pbtxt", Body=(CONFIG + "# changed\n").encode())
    bucket.Object("repo/a/2/model.py").delete()
    assert sync.sync() is True
    assert (root / "a/config.pbtxt").read_text().endswith("# changed\n")
    assert not (root / "a/2").exists()
    assert (root / "a/1/model.py").stat().st_mtime_ns == stamp
    # A restarted server reuses the copy: its manifest says what each file is.
    assert _sync(s3_endpoint, bucket, "repo", tmp_path).sync() is False


def test_keys_that_would_leave_the_local_copy_are_ignored(s3_endpoint: str, bucket: Any, tmp_path: Path) -> None:
    _upload_model(bucket, "repo", "a")
    bucket.put_object(Key="repo/../escaped.txt", Body=b"x")
    bucket.put_object(Key="repo/a/./dot.txt", Body=b"x")
    sync = _sync(s3_endpoint, bucket, "repo", tmp_path / "cache")
    sync.sync()
    assert not list(tmp_path.rglob("escaped.txt")) and not list(tmp_path.rglob("dot.txt"))
    assert (sync.repository.local_path / "a" / "1" / "model.py").is_file()


def test_a_prefix_is_a_folder_not_a_name_start(s3_endpoint: str, bucket: Any, tmp_path: Path) -> None:
    _upload_model(bucket, "repo", "a")
    _upload_model(bucket, "repo-other", "b")
    sync = _sync(s3_endpoint, bucket, "repo", tmp_path)
    sync.sync()
    assert sorted(p.name for p in sync.repository.local_path.iterdir()) == ["a"]


def test_a_failed_listing_raises_a_nereid_error_and_keeps_the_copy(s3_endpoint: str, bucket: Any, tmp_path: Path) -> None:
    _upload_model(bucket, "repo", "a")
    sync = _sync(s3_endpoint, bucket, "repo", tmp_path)
    sync.sync()
    bucket.objects.all().delete()
    bucket.delete()
    with pytest.raises(NereidError, match="failed to poll from model repository"):
        sync.sync()
    assert (sync.repository.local_path / "a" / "config.pbtxt").is_file()  # still served from what was fetched
