"""A real kustomize, built once from the Go module proxy into ~/.cache/stageset (shared by all workers).

``hack/test.sh`` builds it before pytest (``python -m stageset.build``); this fixture builds it
otherwise (about a minute cold on two cores).  Under ``CI=true`` a failed build fails the run;
elsewhere the tests that need the binary are skipped with the reason.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stageset.build.kustomize import ensure_kustomize


@pytest.fixture(scope="session")
def kustomize_binary() -> Path:
    try:
        return ensure_kustomize(log=False)
    except Exception as error:
        if os.environ.get("CI") == "true":
            pytest.fail(f"kustomize could not be built under CI: {error}", pytrace=False)
        pytest.skip(f"kustomize unavailable: {error}")
