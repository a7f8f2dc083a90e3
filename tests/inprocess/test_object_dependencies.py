"""``spec.dependsOn`` on objects of other kinds, through the real StageSet reconciler over the
recording fake cluster: nothing applied until the object is ready, each request as the tenant, the
message naming the object and what is missing.  Against a real apiserver, with the controller
process and the watch that wakes it: tests/e2e/test_object_dependencies.py."""

from __future__ import annotations

from typing import Any

from stageset.api.vocabulary import Reason
from tests.inprocess.conftest import NS, TENANT, World, configmap
from tests.inprocess.fakes import CONTROLLER

DATABASES = f"/apis/db.example/v1/namespaces/{NS}/databases"
DB = {"apiVersion": "db.example/v1", "kind": "Database", "name": "db"}


def database(name: str = "db", namespace: str = NS, *, ready: str | None = None, phase: str | None = None,
             message: str = "") -> dict[str, Any]:
    status: dict[str, Any] = {}
    if ready is not None:
        status["conditions"] = [{"type": "Ready", "status": ready, "message": message}]
    if phase is not None:
        status["phase"] = phase
    return {"apiVersion": "db.example/v1", "kind": "Database",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"size": "1Gi"},
            **({"status": status} if status else {})}


def tenant_writes(world: World) -> list[str]:
    return [r.path for r in world.cluster.by(TENANT, writes_only=True)]


def test_nothing_is_applied_while_the_object_is_missing_or_not_ready(world: World) -> None:
    world.commit({"app/cm.json": configmap("app")})
    world.stageset("app", [{"name": "app", "path": "./app"}], dependsOn=[DB])
    world.reconcile("app")
    ready = world.ready("app")
    assert (ready["status"], ready["reason"]) == ("False", Reason.DEPENDENCY_NOT_READY)
    assert ready["message"].startswith("Database db not found (spec.dependsOn[0])")
    world.cluster.put(database(ready="False", message="provisioning storage"))
    world.reconcile("app")
    assert world.ready("app")["message"].startswith("Database db is not Ready: provisioning storage")
    assert tenant_writes(world) == []
    assert world.configmap("app") is None
    world.cluster.set_status(f"{DATABASES}/db", {"conditions": [{"type": "Ready", "status": "True"}]})
    world.reconcile("app")
    assert world.ready("app")["status"] == "True"
    assert world.configmap("app") is not None
    # Read as the tenant, never as the controller.
    reads = [(r.user, r.verb) for r in world.cluster.requests if r.path == f"{DATABASES}/db"]
    assert reads
    assert {user for user, _ in reads} == {TENANT}


def test_a_ready_expr_holds_until_it_is_true(world: World) -> None:
    world.commit({"app/cm.json": configmap("app")})
    world.cluster.put(database(ready="True", phase="Provisioning"))  # kstatus would say Current
    world.stageset("app", [{"name": "app", "path": "./app"}],
                   dependsOn=[{**DB, "readyExpr": "status.phase == 'Available'"}])
    world.reconcile("app")
    ready = world.ready("app")
    assert ready["reason"] == Reason.DEPENDENCY_NOT_READY
    assert ready["message"].startswith(
        "Database db is not ready: spec.dependsOn[0].readyExpr is not true yet")
    assert world.configmap("app") is None
    world.cluster.set_status(f"{DATABASES}/db", {"phase": "Available"})
    world.reconcile("app")
    assert world.ready("app")["status"] == "True"


def test_a_ready_expr_that_does_not_compile_is_refused_before_anything_is_read(world: World) -> None:
    world.commit({"app/cm.json": configmap("app")})
    world.stageset("app", [{"name": "app", "path": "./app"}],
                   dependsOn=[{**DB, "readyExpr": "status.phase =="}])
    world.reconcile("app")
    ready = world.ready("app")
    assert ready["reason"] == Reason.INVALID_SPEC
    assert ready["message"].startswith("spec.dependsOn[0].readyExpr does not compile")
    assert not [r for r in world.cluster.requests if "databases" in r.path]


def test_an_object_the_tenant_may_not_read_is_rbac_denied_naming_it(world: World) -> None:
    world.commit({"app/cm.json": configmap("app")})
    world.cluster.put(database(namespace="infra", ready="True"))
    world.stageset("app", [{"name": "app", "path": "./app"}], dependsOn=[{**DB, "namespace": "infra"}])
    world.reconcile("app")
    ready = world.ready("app")
    assert ready["reason"] == Reason.RBAC_DENIED
    assert ready["message"].startswith(f"{TENANT} may not read Database infra/db (spec.dependsOn[0])")
    attempts = [(r.user, r.verb) for r in world.cluster.requests if "/databases" in r.path]
    assert attempts == [(TENANT, "get")]
    assert world.configmap("app") is None


def test_no_cross_namespace_refs_refuses_another_namespace_without_reading_it(world: World) -> None:
    world.reconciler = world.make_reconciler(no_cross_namespace_refs=True)
    world.commit({"app/cm.json": configmap("app")})
    world.stageset("app", [{"name": "app", "path": "./app"}], dependsOn=[{**DB, "namespace": "infra"}])
    world.reconcile("app")
    ready = world.ready("app")
    assert ready["reason"] == Reason.DEPENDENCY_NOT_READY
    assert ready["message"].startswith("dependsOn names an object in another namespace")
    assert "infra" not in ready["message"]
    assert not [r for r in world.cluster.requests if "/databases" in r.path]


def test_a_kind_the_cluster_does_not_serve_says_so(world: World) -> None:
    world.commit({"app/cm.json": configmap("app")})
    world.stageset("app", [{"name": "app", "path": "./app"}],
                   dependsOn=[{"apiVersion": "db.example/v1", "kind": "Ledger", "name": "books"}])
    world.reconcile("app")
    ready = world.ready("app")
    assert ready["reason"] == Reason.DEPENDENCY_NOT_READY
    assert "this cluster serves no kind Ledger in db.example/v1" in ready["message"]
    assert "Ledger books (spec.dependsOn[0])" in ready["message"]


def test_a_cluster_scoped_crd_is_read_without_a_namespace_and_ready_once_established(world: World) -> None:
    world.cluster.grant(TENANT, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", "get,list,watch")
    world.commit({"app/cm.json": configmap("app")})
    crd = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/databases.db.example"
    world.cluster.put({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                       "metadata": {"name": "databases.db.example"}, "spec": {}})
    world.stageset("app", [{"name": "app", "path": "./app"}], dependsOn=[
        {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
         "name": "databases.db.example"}])
    world.reconcile("app")
    assert world.ready("app")["message"].startswith(
        "CustomResourceDefinition databases.db.example is not Ready: not yet established")
    world.cluster.set_status(crd, {"conditions": [{"type": "Established", "status": "True"}]})
    world.reconcile("app")
    assert world.ready("app")["status"] == "True"
    assert {r.path for r in world.cluster.by(TENANT) if "customresourcedefinitions" in r.path} == {crd}


def test_stageset_dependencies_come_first_and_cost_what_they_cost(world: World) -> None:
    world.commit({"app/cm.json": configmap("app"), "db/cm.json": configmap("db")})
    world.cluster.put(database(ready="True"))
    world.stageset("db", [{"name": "db", "path": "./db"}])
    world.stageset("app", [{"name": "app", "path": "./app"}], dependsOn=[DB, {"name": "db"}])
    world.reconcile("app")
    ready = world.ready("app")
    assert (ready["reason"], ready["message"].split(";")[0]) == (Reason.DEPENDENCY_NOT_READY,
                                                                 f"StageSet {NS}/db is not Ready")
    # The object of another kind is not read while a StageSet dependency is not ready.
    assert not [r for r in world.cluster.requests if "/databases" in r.path]
    world.reconcile("db")
    world.reconcile("app")
    assert world.ready("app")["status"] == "True"
    # With every entry a StageSet: no discovery of other kinds, no read of them (unchanged cost).
    world.cluster.clear()
    world.stageset("plain", [{"name": "app", "path": "./app"}], dependsOn=[{"name": "db"}])
    world.reconcile("plain")
    assert [r for r in world.cluster.requests if r.user == CONTROLLER and "db.example" in r.path] == []


def test_in_cluster_admin_mode_without_a_service_account_the_controller_reads_it(world: World) -> None:
    world.reconciler = world.make_reconciler(cluster_admin=True)
    world.cluster.controller_prefixes = None
    world.commit({"app/cm.json": configmap("app")})
    world.cluster.put(database(ready="False", message="provisioning"))
    world.stageset("app", [{"name": "app", "path": "./app"}], serviceAccountName=None, dependsOn=[DB])
    world.reconcile("app")
    assert world.ready("app")["message"].startswith("Database db is not Ready: provisioning")
    world.cluster.set_status(f"{DATABASES}/db", {"conditions": [{"type": "Ready", "status": "True"}]})
    world.reconcile("app")
    assert world.ready("app")["status"] == "True"
    assert {r.user for r in world.cluster.requests if r.path == f"{DATABASES}/db"} == {CONTROLLER}


def test_a_stageset_naming_a_service_account_drops_to_its_rights_in_cluster_admin_mode(world: World) -> None:
    world.reconciler = world.make_reconciler(cluster_admin=True)
    world.cluster.controller_prefixes = None
    world.commit({"app/cm.json": configmap("app")})
    world.cluster.put(database(namespace="infra", ready="True"))
    world.stageset("app", [{"name": "app", "path": "./app"}], dependsOn=[{**DB, "namespace": "infra"}])
    world.reconcile("app")
    assert world.ready("app")["reason"] == Reason.RBAC_DENIED
    assert {r.user for r in world.cluster.requests if "/databases" in r.path} == {TENANT}
