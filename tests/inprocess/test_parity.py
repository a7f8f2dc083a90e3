"""Parity behaviour in-process: which requests, as whom (issue 13).

- a denial says whether the ServiceAccount exists: looked up as the controller only in
  single-tenant mode, else as the ServiceAccount itself — and only after a denial;
- ``prune: false`` on delete: one patch per object, as the stage's identity, no delete;
- a bad health expression stops the StageSet before any request for its stages.
"""

from __future__ import annotations

from stageset.apply.ownership import LABEL_NAME, LABEL_NAMESPACE, LABEL_STAGE
from tests.inprocess.conftest import NS, TENANT, World, configmap, stageset_path
from tests.inprocess.fakes import CONTROLLER

CM = f"/api/v1/namespaces/{NS}/configmaps"
GHOST = f"system:serviceaccount:{NS}:ghost"
GHOST_SA = f"/api/v1/namespaces/{NS}/serviceaccounts/ghost"


def test_multi_tenant_mode_asks_the_account_itself_and_hedges_when_it_may_not_look(world: World) -> None:
    world.commit({"app/a.json": configmap("a")})
    world.stageset("shop", [{"name": "app", "path": "./app"}], serviceAccountName="ghost")
    world.reconcile("shop")
    message = world.ready("shop")["message"]
    assert world.ready("shop")["reason"] == "RBACDenied"
    assert f"{GHOST} may not read GitRepository {NS}/app (stage 'app')" in message
    assert f"check that ServiceAccount {NS}/ghost exists and that a RoleBinding" in message
    # The look-up was made as ghost, never as the controller (whose role reads no ServiceAccounts).
    assert [r.path for r in world.cluster.by(GHOST) if "serviceaccounts" in r.path] == [GHOST_SA]
    assert not [r for r in world.cluster.by(CONTROLLER) if "serviceaccounts" in r.path]


def test_an_account_that_may_look_learns_it_does_not_exist(world: World) -> None:
    # Bindings may name a ServiceAccount that was never created (or was deleted).
    world.cluster.grant(GHOST, f"/api/v1/namespaces/{NS}/serviceaccounts/", "get")
    world.commit({"app/a.json": configmap("a")})
    world.stageset("shop", [{"name": "app", "path": "./app"}], serviceAccountName="ghost")
    world.reconcile("shop")
    assert f"ServiceAccount {NS}/ghost does not exist" in world.ready("shop")["message"]


def test_single_tenant_mode_looks_the_account_up_as_the_controller(world: World) -> None:
    world.reconciler = world.make_reconciler(cluster_admin=True)
    world.cluster.controller_prefixes = None  # cluster-admin
    world.commit({"app/a.json": configmap("a")})
    world.stageset("shop", [{"name": "app", "path": "./app"}], serviceAccountName="ghost")
    world.reconcile("shop")
    assert f"ServiceAccount {NS}/ghost does not exist" in world.ready("shop")["message"]
    assert [r.path for r in world.cluster.by(CONTROLLER) if "serviceaccounts" in r.path] == [GHOST_SA]
    assert not [r for r in world.cluster.by(GHOST) if "serviceaccounts" in r.path]


def test_no_account_look_up_without_a_denial(world: World) -> None:
    world.commit({"app/a.json": configmap("a")})
    world.stageset("shop", [{"name": "app", "path": "./app"}])
    world.reconcile("shop")
    assert world.ready("shop")["reason"] == "Succeeded"
    assert not [r for r in world.cluster.requests if "serviceaccounts" in r.path]


def test_prune_false_stages_are_released_on_delete_not_deleted(world: World) -> None:
    world.commit({"keep/cm.json": configmap("kept"), "app/cm.json": configmap("gone")})
    world.stageset("shop", [{"name": "keep", "path": "./keep", "prune": False},
                            {"name": "app", "path": "./app"}])
    world.reconcile("shop")
    with world.cluster._lock:
        world.cluster.objects[stageset_path("shop")]["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    world.cluster.clear()
    while world.reconcile("shop").requeue_after is not None:
        pass
    assert world.cluster.get(stageset_path("shop")) is None
    writes = [(r.user, r.verb, r.path) for r in world.cluster.writes() if "/configmaps/" in r.path]
    assert (TENANT, "delete", f"{CM}/gone") in writes
    assert (TENANT, "patch", f"{CM}/kept") in writes
    assert (TENANT, "delete", f"{CM}/kept") not in writes
    kept = world.configmap("kept")
    assert kept is not None
    assert not {LABEL_NAME, LABEL_NAMESPACE, LABEL_STAGE} & set(kept["metadata"].get("labels") or {})
    # (The pass before the delete said it succeeded; the teardown says what it left.)
    events = [o for p, o in world.cluster.objects.items()
              if "/events/" in p and o["reason"] != "ReconciliationSucceeded"]
    assert [e["reason"] for e in events] == ["Orphaned"]
    assert f"ConfigMap {NS}/kept" in events[0]["note"]


def test_a_bad_health_expression_stops_the_stageset_before_any_stage_request(world: World) -> None:
    world.commit({"app/cm.json": configmap("a")})
    world.stageset("shop", [{"name": "app", "path": "./app", "readyChecks": {"exprs": [
        {"apiVersion": "example.com/v1", "kind": "Widget", "current": "status.phase =="}]}}])
    assert world.reconcile("shop").requeue_after is None
    ready = world.ready("shop")
    assert ready["reason"] == "InvalidSpec"
    assert ready["message"].startswith("stage 'app': readyChecks.exprs[0].current does not compile")
    assert world.cluster.by(TENANT) == []


def test_a_denied_kube_config_secret_says_whether_the_account_exists(world: World) -> None:
    world.commit({"app/a.json": configmap("a")})
    world.stageset("shop", [{"name": "app", "path": "./app"}], serviceAccountName="ghost",
                   kubeConfig={"secretRef": {"name": "prod"}})
    world.reconcile("shop")
    message = world.ready("shop")["message"]
    assert world.ready("shop")["reason"] == "RBACDenied"
    assert f"{GHOST} may not read Secret {NS}/prod (spec.kubeConfig)" in message
    assert f"check that ServiceAccount {NS}/ghost exists and that a RoleBinding" in message
    assert [r.path for r in world.cluster.by(GHOST) if "serviceaccounts" in r.path] == [GHOST_SA]
