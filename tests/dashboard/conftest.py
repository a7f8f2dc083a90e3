"""Dashboard fixtures: the system Chromium, and the controller and Git server of the e2e suite."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser

from tests.dashboard.browser import CHROMIUM, chromium
from tests.e2e.conftest import controller, controller_args, git_server  # noqa: F401 - fixtures


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Headless Debian Chromium (``hack/bootstrap.sh`` installs it); skipped without one, failed
    under CI."""
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing: run ./hack/bootstrap.sh as root (installs Debian's chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    with chromium() as found:
        yield found
