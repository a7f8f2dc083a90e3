"""Workload identity between two real control planes: this directory's "local" plane serves its
ServiceAccount issuer (its own URL, discovery readable by anyone) and audits TokenRequests with
their bodies (the audiences asked for, never the token answered); its ``remote`` trusts that issuer
through a structured authentication configuration (audience: the remote's own URL, usernames
prefixed :data:`PREFIX`).

``control_plane`` and ``remote`` are overridden here, for the tests in this directory only (one such
local plane per test worker, started when the first of them runs; a remote per module).  The
fixtures built on the plane (its kubeconfig and clients, ``tests/conftest.py``) are session-scoped,
so they are registered here again by import, as ``tests/e2e/managed/`` does: each registration
keeps its own value, built on this directory's plane.
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
)

PREFIX = "local:"
"""How the remote names this cluster's ServiceAccounts: ``local:system:serviceaccount:<ns>:<name>``."""


@pytest.fixture(scope="session")
def control_plane() -> Iterator[envtest.ControlPlane]:
    plane = envtest.start(serve_issuer=True, audit_requests=("serviceaccounts/token",))
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="module")
def remote(control_plane: envtest.ControlPlane) -> Iterator[envtest.ControlPlane]:
    """A remote that trusts this directory's plane's ServiceAccount issuer (and nothing stored)."""
    plane = envtest.start(trust=[envtest.JwtIssuer(url=control_plane.issuer,
                                                   certificate_authority=control_plane.pki.ca_cert,
                                                   username_prefix=PREFIX)])
    try:
        yield plane
    finally:
        plane.stop()
