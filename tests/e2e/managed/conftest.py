"""Tests against a control plane with kube-controller-manager: namespace lifecycle, garbage
collection and quota status by the real controllers (``stageset.envtest.server.CONTROLLERS``).

``control_plane`` is overridden here, for the tests in this directory only: one such control
plane per test worker, started when the first of them runs.  The rest of the suite keeps its plane
without a controller manager (a deleted namespace stays Terminating there, and owner references
are never followed).

The fixtures built on the plane (its kubeconfig and clients, ``tests/conftest.py``) are
session-scoped, so they are registered here again by import: each registration keeps its own
value, and these are built on this directory's plane.  Overriding ``control_plane`` alone would
hand these tests a kubeconfig and clients cached for the other plane, whenever a test elsewhere
ran first.  The e2e fixtures (the controller process, the Git server) come from
``tests/e2e/conftest.py`` as usual and use these.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stageset.envtest import server as envtest
from tests.conftest import (  # noqa: F401 - registered again: built on this directory's plane
    admin,
    admin_api,
    installed,
    kube_pool,
    kubeconfig,
    started_control_plane,
)


@pytest.fixture(scope="session")
def control_plane() -> Iterator[envtest.ControlPlane]:
    yield from started_control_plane(controller_manager=True)
