"""The real kustomize builder and the upstream kustomize, built once from the Go module proxy.

Both land in ~/.cache/stageset (shared by all workers).  ``hack/test.sh`` builds them before
pytest (``python -m stageset.build``); these fixtures build them otherwise (about a minute
cold on two cores).  Under ``CI=true`` a failed build fails the run; elsewhere the tests that
need a binary are skipped with the reason.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from stageset.build.kustomize import ensure_builder, ensure_kustomize


def _binary(build: Callable[..., Path], what: str) -> Path:
    try:
        return build(log=False)
    except Exception as error:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{what} could not be built under CI: {error}", pytrace=False)
        pytest.skip(f"{what} unavailable: {error}")


@pytest.fixture(scope="session")
def builder_binary() -> Path:
    """``stageset-kustomize``: what the controller runs."""
    return _binary(ensure_builder, "stageset-kustomize")


@pytest.fixture(scope="session")
def kustomize_binary() -> Path:
    """The upstream ``kustomize`` command at the same version, to compare against."""
    return _binary(ensure_kustomize, "kustomize")
