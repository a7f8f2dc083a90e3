"""Attacks through Git sources, end to end: the controller as a subprocess with the chart's
multi-tenant RBAC, real Git servers on loopback, tenants as ServiceAccounts bound to ``edit``.

Each case asserts the secure outcome and that the controller stayed up and responsive (a
canary StageSet in another namespace converges on a new commit afterwards).  The rows are
in docs/security.md ("Git sources").
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stageset.kube.client import KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import GITREPOS, ControllerProcess, apply, condition, get_or_none, wait_for
from tests.e2e.stagesets import Scenario, cm, scenario
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]
SECRET_CM = cm("alice-secret", "top-secret-value")


@pytest.fixture(scope="module")
def host() -> Iterator[GitServer]:
    """A Git host where alice and bob see different things."""
    with GitServer(accounts={"alice": "alice-pw", "bob": "bob-pw"}) as server:
        yield server


@pytest.fixture
def canary(installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory) -> Scenario:
    s = scenario(installed, git_server, make_tenant("canary"), {"app/cm.yaml": cm("canary", "0")})
    s.stageset("canary", [{"name": "app", "path": "./app"}])
    s.wait_ready("canary")
    return s


def _still_serving(controller: ControllerProcess, canary: Scenario) -> None:
    """The controller is up and converges other tenants' work after the attack."""
    controller.check_alive()
    sha = canary.commit({"app/cm.yaml": cm("canary", "after-attack")})
    canary.wait_ready("canary", revision=sha)
    found = canary.configmap("canary")
    assert found is not None
    assert found["data"] == {"k": "after-attack"}


def _git_tenant(admin: KubeClient, tenant: Tenant, *, user: str, password: str) -> None:
    """The tenant's ServiceAccount may read its own Git credentials (``edit``)."""
    tenant.bind_cluster_role("edit")
    admin.request("POST", f"/api/v1/namespaces/{tenant.namespace}/secrets", body={
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "git-auth"},
        "data": {"username": base64.b64encode(user.encode()).decode(),
                 "password": base64.b64encode(password.encode()).decode()}})


def _git_repository(admin: KubeClient, tenant: Tenant, url: str, ref: dict[str, str], *,
                    credentials: bool = True) -> None:
    spec: dict[str, Any] = {"url": url, "ref": ref, "interval": "1m"}
    if credentials:
        spec |= {"secretRef": {"name": "git-auth"}, "serviceAccountName": tenant.service_account}
    apply(admin, {"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
                  "metadata": {"name": "vault", "namespace": tenant.namespace}, "spec": spec})


def _stageset(admin: KubeClient, tenant: Tenant) -> None:
    apply(admin, {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                  "metadata": {"name": "vault", "namespace": tenant.namespace},
                  "spec": {"serviceAccountName": tenant.service_account,
                           "stages": [{"name": "app", "path": "./deploy",
                                       "sourceRef": {"name": "vault"}}]}})


def _repo_condition(admin: KubeClient, tenant: Tenant, status: str,
                    reason: str | None = None) -> dict[str, Any]:
    def check() -> Any:
        found = condition(admin.get(f"{GITREPOS.format(ns=tenant.namespace)}/vault"))
        return found if found and found["status"] == status and (
            reason is None or found["reason"] == reason) else None
    found: dict[str, Any] = wait_for(check, what=f"GitRepository {tenant.namespace}/vault {status}")
    return found


def _stageset_reason(admin: KubeClient, tenant: Tenant, reasons: set[str]) -> dict[str, Any]:
    def check() -> Any:
        found = condition(admin.get(f"/apis/stages.metio.wtf/v1/namespaces/{tenant.namespace}"
                                    "/stagesets/vault"))
        return found if found and found["reason"] in reasons else None
    found: dict[str, Any] = wait_for(check, what=f"StageSet {tenant.namespace}/vault {reasons}")
    return found


def _assert_no_leak(admin: KubeClient, tenant: Tenant, secret_commit: str) -> None:
    assert get_or_none(admin, f"/api/v1/namespaces/{tenant.namespace}/configmaps/alice-secret") is None
    repo = admin.get(f"{GITREPOS.format(ns=tenant.namespace)}/vault")
    artifact = (repo.get("status") or {}).get("artifact") or {}
    assert secret_commit not in artifact.get("revision", "")
    stageset = admin.get(f"/apis/stages.metio.wtf/v1/namespaces/{tenant.namespace}/stagesets/vault")
    assert "top-secret-value" not in str(stageset)
    ready = condition(stageset)
    assert ready is None or ready["status"] != "True"


def _alice_applies(admin: KubeClient, host: GitServer, alice: Tenant, url: str,
                   ref: dict[str, str]) -> None:
    """Tenant A deploys its private content: it is now in the controller's shared mirror."""
    _git_tenant(admin, alice, user="alice", password="alice-pw")
    _git_repository(admin, alice, url, ref)
    _repo_condition(admin, alice, "True")
    _stageset(admin, alice)
    wait_for(lambda: get_or_none(admin, f"/api/v1/namespaces/{alice.namespace}/configmaps/alice-secret"),
             what="tenant A's private ConfigMap")


def test_commit_pin_of_a_commit_only_tenant_a_can_see(
    controller: ControllerProcess, installed: KubeClient, host: GitServer, canary: Scenario,
    make_tenant: TenantFactory,
) -> None:
    """Same URL, same mirror; the server hides A's ref from B (hideRefs, protocol v0).  B pins
    A's commit: not Ready, nothing of A's applied in B's namespace."""
    url = host.create_repo("shared", {"deploy/cm.yaml": cm("public")})
    secret = host.commit("shared", {"deploy/cm.yaml": SECRET_CM}, branch="refs/private/alice")
    host.restrict("shared", {"alice", "bob"})
    host.user_config("bob", "uploadpack.hideRefs", "refs/private")
    host.user_protocol_v0("bob")
    alice, bob = make_tenant("alice"), make_tenant("bob")
    _alice_applies(installed, host, alice, url, {"name": "refs/private/alice"})

    _git_tenant(installed, bob, user="bob", password="bob-pw")
    _git_repository(installed, bob, url, {"commit": secret})
    _stageset(installed, bob)
    refused = _repo_condition(installed, bob, "False", "RefNotFound")
    assert secret in refused["message"]
    _stageset_reason(installed, bob, {"SourceNotReady", "ArtifactNotFound"})
    _assert_no_leak(installed, bob, secret)
    _still_serving(controller, canary)
    _assert_no_leak(installed, bob, secret)


def test_commit_pin_through_a_public_dot_git_twin(
    controller: ControllerProcess, installed: KubeClient, host: GitServer, canary: Scenario,
    make_tenant: TenantFactory,
) -> None:
    """A's private ``/vault.git`` and B's public ``/vault`` are two repositories on the server
    (they used to share a mirror key).  B pins A's commit on its own URL: refused."""
    private = host.create_repo("vault", {"deploy/cm.yaml": SECRET_CM})
    host.restrict("vault", {"alice"})
    public = host.create_repo("vault-public", {"deploy/cm.yaml": cm("public")}, directory="vault")
    secret = host.head("vault")
    alice, bob = make_tenant("alice"), make_tenant("bob")
    _alice_applies(installed, host, alice, private, {"branch": "main"})

    bob.bind_cluster_role("edit")
    _git_repository(installed, bob, public, {"commit": secret}, credentials=False)
    _stageset(installed, bob)
    _repo_condition(installed, bob, "False", "RefNotFound")
    _stageset_reason(installed, bob, {"SourceNotReady", "ArtifactNotFound"})
    _assert_no_leak(installed, bob, secret)
    _still_serving(controller, canary)


def test_a_forged_artifact_revision_reads_nothing(
    controller: ControllerProcess, installed: KubeClient, host: GitServer, canary: Scenario,
    make_tenant: TenantFactory,
) -> None:
    """Tenants cannot write status with the chart's roles; should one be able to (a custom
    role), a GitRepository pointing at A's URL with A's revision in its status still reads
    nothing: StageSets read only commits the controller served to *that* GitRepository."""
    private = host.create_repo("forge", {"deploy/cm.yaml": SECRET_CM})
    host.restrict("forge", {"alice"})
    secret = host.head("forge")
    alice, bob = make_tenant("alice"), make_tenant("bob")
    _alice_applies(installed, host, alice, private, {"branch": "main"})

    bob.bind_cluster_role("edit")
    _git_repository(installed, bob, private, {"branch": "main"}, credentials=False)
    _repo_condition(installed, bob, "False", "AuthenticationFailed")
    installed.request(
        "PATCH", f"{GITREPOS.format(ns=bob.namespace)}/vault/status",
        content_type="application/merge-patch+json",
        body={"status": {"artifact": {"revision": f"main@sha1:{secret}", "digest": "sha1:x"}}})
    _stageset(installed, bob)
    refused = _stageset_reason(installed, bob, {"ArtifactNotFound"})
    assert "has not been fetched for it" in refused["message"]
    assert get_or_none(installed, f"/api/v1/namespaces/{bob.namespace}/configmaps/alice-secret") is None
    _still_serving(controller, canary)
    assert get_or_none(installed, f"/api/v1/namespaces/{bob.namespace}/configmaps/alice-secret") is None


def test_local_sources_are_refused_by_default(
    controller: ControllerProcess, installed: KubeClient, canary: Scenario, make_tenant: TenantFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The e2e controller allows http:// (loopback test servers) but not file://: a tenant
    cannot point a GitRepository at the controller's disk (its mirrors included)."""
    tenant = make_tenant("local")
    tenant.bind_cluster_role("edit")
    mirrors = controller.log.parent / "mirrors"
    _git_repository(installed, tenant, f"file://{mirrors}", {"branch": "main"}, credentials=False)
    refused = _repo_condition(installed, tenant, "False", "InvalidURL")
    assert "local repositories are off" in refused["message"]
    _still_serving(controller, canary)
