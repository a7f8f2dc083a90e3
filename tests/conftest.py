"""Shared fixtures: a real control plane per test worker, admin and impersonated clients, tenants.

The control plane is started once per pytest worker (``-n auto`` gives each worker its
own etcd + kube-apiserver, so tests on different workers never share state).  Under
``CI=true`` a control plane that cannot start fails the run; elsewhere it skips the
tests that need it, with the reason.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from stageset.envtest import install
from stageset.envtest import server as envtest
from stageset.kube.client import ClientPool, KubeClient


def started_control_plane(*, controller_manager: bool = False) -> Iterator[envtest.ControlPlane]:
    """A fresh control plane for a fixture to yield (skipped where none can start, failed under CI);
    with ``controller_manager``, kube-controller-manager runs too (``tests/e2e/managed/``)."""
    try:
        plane = envtest.start(controller_manager=controller_manager)
    except Exception as error:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the control plane could not start under CI: {error}", pytrace=False)
        pytest.skip(f"control plane unavailable: {error}")
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def control_plane() -> Iterator[envtest.ControlPlane]:
    yield from started_control_plane()


@pytest.fixture(scope="session")
def kubeconfig(control_plane: envtest.ControlPlane) -> Path:
    return control_plane.kubeconfig


@pytest.fixture(scope="session")
def admin_api(kubeconfig: Path) -> Iterator[k8s.ApiClient]:
    """An official-client ApiClient authenticated as ``system:masters``."""
    api = k8s_config.new_client_from_config(config_file=str(kubeconfig))
    try:
        yield api
    finally:
        api.close()


def impersonating(kubeconfig: Path, user: str, groups: list[str] | None = None) -> k8s.ApiClient:
    """An admin client that impersonates ``user`` — every request is authorized as that user."""
    api = k8s_config.new_client_from_config(config_file=str(kubeconfig))
    api.set_default_header("Impersonate-User", user)
    for group in groups or []:
        # The official client cannot send a repeated header; one group is enough for our tests.
        api.set_default_header("Impersonate-Group", group)
    return api


@dataclass
class Tenant:
    """A namespace with a ServiceAccount, as an application team would have."""

    namespace: str
    service_account: str
    api: k8s.ApiClient

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    def bind_cluster_role(self, role: str, *, name: str | None = None) -> None:
        """Grant ``role`` (a ClusterRole) to the tenant's ServiceAccount inside its namespace."""
        k8s.RbacAuthorizationV1Api(self.api).create_namespaced_role_binding(
            self.namespace,
            {
                "metadata": {"name": name or f"{self.service_account}-{role}"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": self.service_account,
                              "namespace": self.namespace}],
            },
        )


@pytest.fixture
def make_namespace(admin_api: k8s.ApiClient) -> Iterator[Callable[..., str]]:
    """Create uniquely named namespaces; they are deleted after the test."""
    created: list[str] = []
    core = k8s.CoreV1Api(admin_api)

    def make(prefix: str = "t", *, name: str | None = None) -> str:
        namespace = name or f"{prefix}-{uuid.uuid4().hex[:8]}"
        try:
            core.create_namespace({"metadata": {"name": namespace}})
        except k8s.ApiException as error:
            # A fixed name (DESIGN.md's examples) may exist already; it is then shared and kept,
            # since without kube-controller-manager a deleted namespace never finishes terminating.
            if error.status != 409 or name is None:
                raise
            return namespace
        created.append(namespace)
        return namespace

    yield make
    for namespace in created:
        try:
            core.delete_namespace(namespace)
        except k8s.ApiException as error:
            if error.status != 404:
                raise


@pytest.fixture
def make_tenant(admin_api: k8s.ApiClient, make_namespace: Callable[..., str]) -> Callable[..., Tenant]:
    """A namespace plus a ServiceAccount; bind roles with ``Tenant.bind_cluster_role``."""

    def make(prefix: str = "tenant", *, namespace: str | None = None,
             service_account: str = "deployer") -> Tenant:
        ns = make_namespace(prefix, name=namespace)
        try:
            k8s.CoreV1Api(admin_api).create_namespaced_service_account(
                ns, {"metadata": {"name": service_account}})
        except k8s.ApiException as error:
            if error.status != 409:
                raise
        return Tenant(namespace=ns, service_account=service_account, api=admin_api)

    return make


def api_error_body(error: k8s.ApiException) -> dict[str, Any]:
    import json

    body: dict[str, Any] = json.loads(error.body or "{}")
    return body


@pytest.fixture(scope="session")
def kube_pool(kubeconfig: Path) -> Iterator[ClientPool]:
    """Our own client layer, as the controller uses it (admin identity by default)."""
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
    """The control plane with our CRDs and tenant roles installed (once per worker)."""
    install.install(admin)
    return admin
