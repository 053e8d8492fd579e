"""gs:// and as:// model repository URLs in Triton's forms, and clear errors naming the expected form."""

from __future__ import annotations

import pytest

from nereid.repository.azure import AzureLocation, parse_azure_url
from nereid.repository.gcs import GcsLocation, parse_gcs_url


@pytest.mark.parametrize(("url", "expected"), [
    ("gs://bucket/path/to/repo", GcsLocation("bucket", "path/to/repo")),
    ("gs://bucket", GcsLocation("bucket", "")),
    ("gs://bucket/repo/", GcsLocation("bucket", "repo")),
    ("gs://my_bucket.example.com/x", GcsLocation("my_bucket.example.com", "x")),
])  # fmt: skip
def test_gcs_urls_in_triton_form(url: str, expected: GcsLocation) -> None:
    assert parse_gcs_url(url) == expected


@pytest.mark.parametrize("url", ["gs://", "gs:///path", "gs://Bad/x", "gs://-bucket/x", "gs://ab/x"])
def test_bad_gcs_urls_are_refused_naming_the_form(url: str) -> None:
    with pytest.raises(ValueError, match=rf"model repository '{url}': expected gs://bucket/path/to/repository"):
        parse_gcs_url(url)


@pytest.mark.parametrize(("url", "expected"), [
    ("as://account/container/path/to/repo", AzureLocation("account", "container", "path/to/repo")),
    ("as://account/container", AzureLocation("account", "container", "")),
    ("as://account/my-container/repo/", AzureLocation("account", "my-container", "repo")),
    # Triton also takes the account's host name.
    ("as://account.blob.core.windows.net/models/x", AzureLocation("account", "models", "x")),
])  # fmt: skip
def test_azure_urls_in_triton_form(url: str, expected: AzureLocation) -> None:
    assert parse_azure_url(url) == expected


@pytest.mark.parametrize(("url", "what"), [
    ("as://", "account name ''"),
    ("as://account", "container name ''"),
    ("as://account//path", "container name ''"),
    ("as://Account/container/x", "account name 'Account'"),
    ("as://account/Container/x", "container name 'Container'"),
    ("as://account/double--hyphen/x", "container name 'double--hyphen'"),
])  # fmt: skip
def test_bad_azure_urls_are_refused_naming_the_form(url: str, what: str) -> None:
    expected = f"model repository '{url}': expected as://account_name/container_name/path/to/repository, got {what}"
    with pytest.raises(ValueError) as refused:
        parse_azure_url(url)
    assert str(refused.value) == expected
