"""Fixtures for the chart tests: the real ``helm`` binary, built once from the Go module proxy."""

from __future__ import annotations

from pathlib import Path

import pytest

from stageset.envtest.helm import ensure_helm
from tests.helm.chart import Helm


@pytest.fixture(scope="session")
def helm_binary() -> Path:
    return ensure_helm(log=False)


@pytest.fixture(scope="module")
def helm(helm_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(binary=helm_binary, home=tmp_path_factory.mktemp("helm-home"))
