"""s3:// model repository URLs in Triton's forms, and what the CLI makes of them and of the AWS_* environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from nereid.repository.s3 import S3Location, parse_s3_url
from nereid.serve_flags import parse_serve_args


@pytest.mark.parametrize(("url", "expected"), [
    ("s3://bucket/path/to/repo", S3Location("", "bucket", "path/to/repo")),
    ("s3://bucket", S3Location("", "bucket", "")),
    ("s3://bucket/repo/", S3Location("", "bucket", "repo")),
    ("s3://minio.storage:9000/models/prod", S3Location("http://minio.storage:9000", "models", "prod")),
    ("s3://127.0.0.1:9000/models", S3Location("http://127.0.0.1:9000", "models", "")),
    ("s3://https://s3.example.com:443/b-1/x", S3Location("https://s3.example.com:443", "b-1", "x")),
    ("s3://http://localhost:9000/my.bucket/x/y", S3Location("http://localhost:9000", "my.bucket", "x/y")),
])  # fmt: skip
def test_s3_urls_in_triton_forms(url: str, expected: S3Location) -> None:
    assert parse_s3_url(url) == expected


@pytest.mark.parametrize("url", ["s3://", "s3:///path", "s3://Bad_Bucket/x", "s3://https://nohost/b/x", "s3://host:9000/"])
def test_bad_s3_urls_are_refused_naming_the_url(url: str) -> None:
    with pytest.raises(ValueError, match="model repository 's3://"):
        parse_s3_url(url)


def test_cli_fetches_s3_repositories_into_the_mount_directory_with_environment_credentials(tmp_path: Path) -> None:
    env = {
        "TRITON_AWS_MOUNT_DIRECTORY": str(tmp_path),
        "AWS_ACCESS_KEY_ID": "AKID",
        "AWS_SECRET_ACCESS_KEY": "SECRET",
        "AWS_SESSION_TOKEN": "TOKEN",
        "AWS_DEFAULT_REGION": "eu-west-1",
    }
    local = tmp_path / "local"
    local.mkdir()
    settings = parse_serve_args(["--model-repository", "s3://127.0.0.1:9000/models/prod", "--model-repository", str(local)], env)
    [repository] = settings.s3_repositories
    assert (repository.bucket, repository.prefix, repository.endpoint_url) == ("models", "prod", "http://127.0.0.1:9000")
    assert (repository.access_key_id, repository.secret_access_key, repository.session_token, repository.region) == (
        "AKID", "SECRET", "TOKEN", "eu-west-1",
    )  # fmt: skip
    assert repository.local_path.parent == tmp_path and repository.local_path.name.startswith("models-")
    assert settings.model_repositories == [repository.local_path, local.resolve()]
    assert "SECRET" not in repr(repository)  # credentials stay out of logs and reprs


def test_two_s3_repositories_of_one_bucket_get_separate_local_folders(tmp_path: Path) -> None:
    env = {"TRITON_AWS_MOUNT_DIRECTORY": str(tmp_path)}
    settings = parse_serve_args(["--model-repository", "s3://bucket/a", "--model-repository", "s3://bucket/b"], env)
    first, second = settings.s3_repositories
    assert first.local_path != second.local_path
    assert (first.access_key_id, first.region) == ("", "")  # the S3 library's own chain (e.g. a pod role) applies


def test_half_given_credentials_are_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_serve_args(["--model-repository", "s3://bucket/a"], {"AWS_ACCESS_KEY_ID": "AKID"})
    assert "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set together" in capsys.readouterr().err


def test_bad_s3_url_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_serve_args(["--model-repository", "s3://UPPER/a"], {})
    assert "model repository 's3://UPPER/a'" in capsys.readouterr().err
