"""A StageSet waits for objects of other kinds it names in ``spec.dependsOn`` — a test CRD's
``Database``, a Flux ``HelmRelease`` — through the controller process with the chart's rights, on a
real apiserver.

Each dependent retries only every 10 minutes, and no source, StageSet or interval changes meanwhile:
so a StageSet that moves on after the object changed was woken by the held watch (as its identity),
nothing else.  How fast that is is measured by ``bench/dependency_kinds.py`` (timestamps), not here.
What was read, and as whom, is counted from the apiserver's audit log.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from stageset.envtest import dependencykinds as kinds
from stageset.envtest.server import ControlPlane
from stageset.kube.client import KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import ControllerProcess, wait_for, writes_by
from tests.e2e.stagesets import Scenario, cm, scenario
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]
CONTROLLER = "system:serviceaccount:stageset-system:stageset-controller"
DATABASE = {"apiVersion": "db.example/v1", "kind": "Database", "name": "db"}


@pytest.fixture(scope="module")
def served(installed: KubeClient) -> KubeClient:
    kinds.install(installed)
    return installed


def on(events: list[dict[str, Any]], resource: str, namespace: str) -> list[dict[str, Any]]:
    """Audit events (complete or started) of requests on ``resource`` in ``namespace``."""
    return [e for e in events if (e.get("objectRef") or {}).get("resource") == resource
            and (e.get("objectRef") or {}).get("namespace") == namespace
            and e.get("stage") in ("ResponseComplete", "ResponseStarted")]


def acting(event: dict[str, Any]) -> str:
    return str((event.get("impersonatedUser") or event.get("user") or {}).get("username", ""))


def message(s: Scenario, name: str) -> str:
    """The StageSet's Ready message ("" before it has one)."""
    conditions = (s.get(name).get("status") or {}).get("conditions") or []
    return str(next((c["message"] for c in conditions if c["type"] == "Ready"), ""))


def test_a_stageset_waits_for_a_database_and_is_woken_by_its_watch(
    controller: ControllerProcess, served: KubeClient, control_plane: ControlPlane, git_server: GitServer,
    make_tenant: TenantFactory,
) -> None:
    s = scenario(served, git_server, make_tenant("dbwait"), {"app/cm.yaml": cm("app")})
    kinds.grant_reading(served, namespace=s.ns, account=s.tenant.service_account, group=kinds.DB_GROUP,
                        plural="databases")
    s.stageset("app", [{"name": "app", "path": "./app"}], dependsOn=[DATABASE], retryInterval="10m")
    waiting = s.wait_reason("app", "DependencyNotReady")
    assert waiting["message"].startswith("Database db not found (spec.dependsOn[0])")

    # It appears, not Ready yet: only the watch can tell the StageSet before 10 minutes.
    kinds.create_database(served, s.ns, "db", status={"conditions": [
        kinds.ready_condition("False", "provisioning storage")]})
    wait_for(lambda: message(s, "app").startswith("Database db is not Ready: provisioning storage"),
             what="the StageSet woken by the Database's creation")
    assert s.configmap("app") is None
    assert writes_by(control_plane.audit_events(), s.tenant.username) == [], "applied while waiting"

    kinds.set_database_status(served, s.ns, "db", {"conditions": [kinds.ready_condition("True")]})
    s.wait_ready("app", timeout=30)
    assert s.configmap("app") is not None

    # Read and watched as the tenant only: never as the controller itself.
    events = [e for e in on(control_plane.audit_events(), "databases", s.ns)
              if e["user"]["username"] == CONTROLLER]
    verbs = {(acting(e), e["verb"]) for e in events}
    assert {(s.tenant.username, "get"), (s.tenant.username, "watch")} <= verbs, verbs
    assert {user for user, _ in verbs} == {s.tenant.username}, verbs

    # No StageSet waits any more: the held watch is closed (its request completes), not left open.
    def closed() -> bool:
        watches = [e for e in on(control_plane.audit_events(), "databases", s.ns) if e["verb"] == "watch"]
        return bool(watches) and all(
            any(c["auditID"] == w["auditID"] and c["stage"] == "ResponseComplete" for c in watches)
            for w in watches)
    wait_for(closed, timeout=30, what="the tenant's watch of databases closed")


def test_a_ready_expr_holds_the_stageset_until_it_is_true(
    controller: ControllerProcess, served: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    s = scenario(served, git_server, make_tenant("dbexpr"), {"app/cm.yaml": cm("app")})
    kinds.grant_reading(served, namespace=s.ns, account=s.tenant.service_account, group=kinds.DB_GROUP,
                        plural="databases")
    # Ready by kstatus (a Ready=True condition), but not what the expression asks for.
    kinds.create_database(served, s.ns, "db", status={"conditions": [kinds.ready_condition("True")]})
    s.stageset("app", [{"name": "app", "path": "./app"}], retryInterval="10m",
               dependsOn=[{**DATABASE, "readyExpr": "status.endpoint.startsWith('postgres://')"}])
    waiting = s.wait_reason("app", "DependencyNotReady")
    assert waiting["message"].startswith(
        "Database db is not ready: spec.dependsOn[0].readyExpr is not true yet (")  # the missing key, said
    assert s.configmap("app") is None
    kinds.set_database_status(served, s.ns, "db", {"endpoint": "postgres://db.internal:5432"})
    s.wait_ready("app", timeout=30)
    assert s.configmap("app") is not None


def test_a_dependency_the_tenant_may_not_read_is_rbac_denied_and_read_as_the_tenant_only(
    controller: ControllerProcess, served: KubeClient, control_plane: ControlPlane, git_server: GitServer,
    make_tenant: TenantFactory,
) -> None:
    # The tenant has edit (no databases there).
    s = scenario(served, git_server, make_tenant("dbdenied"), {"app/cm.yaml": cm("app")})
    kinds.create_database(served, s.ns, "db", status={"conditions": [kinds.ready_condition("True")]})
    s.stageset("app", [{"name": "app", "path": "./app"}], dependsOn=[DATABASE])
    denied = s.wait_reason("app", "RBACDenied")
    assert denied["message"].startswith(f"{s.tenant.username} may not read Database db (spec.dependsOn[0])")
    assert s.configmap("app") is None
    events = [e for e in on(control_plane.audit_events(), "databases", s.ns)
              if e["stage"] == "ResponseComplete" and e["user"]["username"] == CONTROLLER]
    assert events, "no read of the Database in the audit log: nothing was attempted"
    assert {(acting(e), e["verb"], e["responseStatus"]["code"]) for e in events} == \
        {(s.tenant.username, "get", 403)}


def test_a_flux_helmrelease_is_waited_for_the_same_way(
    controller: ControllerProcess, served: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    s = scenario(served, git_server, make_tenant("hrwait"), {"app/cm.yaml": cm("app")})
    kinds.grant_reading(served, namespace=s.ns, account=s.tenant.service_account, group=kinds.HELM_GROUP,
                        plural="helmreleases")
    kinds.create_helmrelease(served, s.ns, "operator", ready=kinds.ready_condition(
        "False", "Helm install in progress", reason="Progressing"))
    s.stageset("app", [{"name": "app", "path": "./app"}], retryInterval="10m", dependsOn=[
        {"apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease", "name": "operator"}])
    waiting = s.wait_reason("app", "DependencyNotReady")
    assert waiting["message"].startswith("HelmRelease operator is not Ready: Helm install in progress")
    assert s.configmap("app") is None
    kinds.set_helmrelease_ready(served, s.ns, "operator", kinds.ready_condition(
        "True", "Helm install succeeded for release operator", reason="InstallSucceeded"))
    s.wait_ready("app", timeout=30)
    assert s.configmap("app") is not None


def test_with_get_alone_the_stageset_is_not_watched_says_so_and_looks_again_at_its_retry(
    controller: ControllerProcess, served: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    s = scenario(served, git_server, make_tenant("dbgetonly"), {"app/cm.yaml": cm("app")})
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{s.ns}"
    served.apply(f"{rbac}/roles/get-databases", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "get-databases", "namespace": s.ns},
        "rules": [{"apiGroups": [kinds.DB_GROUP], "resources": ["databases"], "verbs": ["get"]}]},
        field_manager="test")
    served.apply(f"{rbac}/rolebindings/get-databases", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "get-databases", "namespace": s.ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "get-databases"},
        "subjects": [{"kind": "ServiceAccount", "name": s.tenant.service_account, "namespace": s.ns}]},
        field_manager="test")
    kinds.create_database(served, s.ns, "db", status={"conditions": [kinds.ready_condition("False", "busy")]})
    s.stageset("app", [{"name": "app", "path": "./app"}], dependsOn=[DATABASE], retryInterval="3s")
    # The watch is refused (403 on list); the next look says so, and what it means.
    wait_for(lambda: "not watched" in message(s, "app"), what="the StageSet saying it is not watched")
    said = message(s, "app")
    assert said.startswith("Database db is not Ready: busy; not watched: "
                           f"{s.tenant.username} may not list and watch databases in namespace {s.ns}")
    kinds.set_database_status(served, s.ns, "db", {"conditions": [kinds.ready_condition("True")]})
    s.wait_ready("app", timeout=30)  # at its next retry
