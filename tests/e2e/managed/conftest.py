"""Tests against a control plane with kube-controller-manager: namespace lifecycle, garbage
collection and quota status by the real controllers (``stageset.envtest.server.CONTROLLERS``).

These fixtures override the session's control plane and its clients (``tests/conftest.py``) for
the tests in this directory only: one such control plane per test worker, started when the first
of them runs.  The rest of the suite keeps its plane without a controller manager (a deleted
namespace stays Terminating there, and owner references are never followed).  The e2e fixtures
(the controller process, the Git server) come from ``tests/e2e/conftest.py`` as usual and use
these.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from stageset.envtest import install
from stageset.envtest import server as envtest
from stageset.kube.client import ClientPool, KubeClient
from tests.conftest import started_control_plane


@pytest.fixture(scope="session")
def control_plane() -> Iterator[envtest.ControlPlane]:
    yield from started_control_plane(controller_manager=True)


@pytest.fixture(scope="session")
def kubeconfig(control_plane: envtest.ControlPlane) -> Path:
    return control_plane.kubeconfig


@pytest.fixture(scope="session")
def admin_api(kubeconfig: Path) -> Iterator[k8s.ApiClient]:
    api = k8s_config.new_client_from_config(config_file=str(kubeconfig))
    try:
        yield api
    finally:
        api.close()


@pytest.fixture(scope="session")
def kube_pool(kubeconfig: Path) -> Iterator[ClientPool]:
    pool = ClientPool.from_kubeconfig(str(kubeconfig))
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="session")
def admin(kube_pool: ClientPool) -> KubeClient:
    return kube_pool.client()


@pytest.fixture(scope="session")
def installed(admin: KubeClient) -> KubeClient:
    install.install(admin)
    return admin
