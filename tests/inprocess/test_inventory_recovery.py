"""An inventory that survives losing status: rebuilt from owner labels, never pruned from a partial view."""

from __future__ import annotations

import json

from stageset.apply.record import ANNOTATION
from stageset.kube.client import ApiError, UnreachableError
from tests.inprocess.conftest import NS, TENANT, World, configmap, deployment, stageset_path
from tests.inprocess.test_stageset_reconciler import CM

DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"


def wipe_status(world: World, name: str = "shop") -> None:
    """As a backup restore or a re-creation leaves it: the object, its annotations, no status."""
    with world.cluster._lock:
        world.cluster.objects[stageset_path(name)].pop("status", None)


def ready_with(world: World, files: dict[str, str]) -> None:
    world.commit(files)
    world.stageset("shop", [{"name": "app", "path": "./app"}, {"name": "web", "path": "./web"}])
    world.reconcile("shop")
    world.roll_out("web")
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"


def test_the_record_names_kinds_namespaces_and_identity_and_a_quiet_pass_leaves_it(world: World) -> None:
    ready_with(world, {"app/a.json": configmap("a"), "web/web.json": deployment("web")})
    record = json.loads(world.get("shop")["metadata"]["annotations"][ANNOTATION])
    assert record == {"v": 2, "stages": {
        "app": {"sa": "deployer", "kinds": {"v1//ConfigMap": [NS]}},
        "web": {"sa": "deployer", "kinds": {"apps/v1/Deployment": [NS]}}}}
    world.cluster.clear()
    world.clock.advance(600)
    world.reconcile("shop")
    assert world.cluster.writes() == []


def test_wiped_status_then_a_file_removed_prunes_exactly_that_object(world: World) -> None:
    ready_with(world, {"app/a.json": configmap("a"), "app/b.json": configmap("b"),
                       "web/web.json": deployment("web")})
    # Someone else's ConfigMap in the same namespace, and one labelled for another StageSet.
    world.cluster.put({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "mine", "namespace": NS}})
    world.cluster.put({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "other", "namespace": NS, "labels": {"stages.metio.wtf/name": "other",
                                                      "stages.metio.wtf/namespace": NS,
                                                      "stages.metio.wtf/stage": "app"}}})
    wipe_status(world)
    world.commit({"app/a.json": configmap("a"), "web/web.json": deployment("web")})
    world.cluster.clear()

    world.reconcile("shop")

    assert world.ready("shop")["status"] == "True"
    assert world.configmap("b") is None, "removed from Git: pruned"
    for kept in ("a", "mine", "other"):
        assert world.configmap(kept) is not None, kept
    assert world.cluster.get(f"{DEPLOYMENTS}/web") is not None
    deletes = [(r.user, r.path) for r in world.cluster.requests if r.verb == "delete"]
    assert deletes == [(TENANT, f"{CM}/b")]
    # The objects were found as the tenant, by label, in the recorded namespace only.
    lists = [r for r in world.cluster.requests if r.verb == "list"]
    assert {(r.user, r.path) for r in lists} == {(TENANT, CM), (TENANT, DEPLOYMENTS)}
    assert [e["id"] for e in world.get("shop")["status"]["inventory"][0]["entries"]] == [f"{NS}_a__ConfigMap"]


def test_a_kind_no_longer_rendered_is_found_through_the_record(world: World) -> None:
    ready_with(world, {"app/a.json": configmap("a"), "web/web.json": deployment("web")})
    wipe_status(world)
    world.commit({"app/a.json": configmap("a"), "web/cm.json": configmap("instead")})
    world.reconcile("shop")
    assert world.cluster.get(f"{DEPLOYMENTS}/web") is None, "the Deployment's kind came from the record"
    assert world.configmap("instead") is not None
    record = json.loads(world.get("shop")["metadata"]["annotations"][ANNOTATION])
    assert record["stages"]["web"]["kinds"] == {"v1//ConfigMap": [NS]}, "shrunk after the prune"


def test_a_denied_list_prunes_nothing_until_the_view_is_complete(world: World) -> None:
    ready_with(world, {"app/a.json": configmap("a"), "app/b.json": configmap("b"),
                       "web/web.json": deployment("web")})
    wipe_status(world)
    world.commit({"app/a.json": configmap("a"), "web/web.json": deployment("web")})
    denied = ApiError(status=403, reason="Forbidden", message="no")
    world.cluster.failures[("list", DEPLOYMENTS, None)] = denied

    world.reconcile("shop")

    ready = world.ready("shop")
    assert (ready["status"], ready["reason"]) == ("False", "InventoryIncomplete")
    assert "may not list Deployment in shop" in ready["message"]
    assert world.configmap("b") is not None, "nothing pruned from a partial view"
    assert not [r for r in world.cluster.requests if r.verb == "delete"]
    assert json.loads(world.get("shop")["metadata"]["annotations"][ANNOTATION])["rebuild"] is True

    # The rebuild is tried again on the next pass (status now has entries), and then prunes.
    del world.cluster.failures[("list", DEPLOYMENTS, None)]
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"
    assert world.configmap("b") is None
    assert "rebuild" not in json.loads(world.get("shop")["metadata"]["annotations"][ANNOTATION])


def test_a_cluster_failing_during_the_rebuild_prunes_nothing(world: World) -> None:
    ready_with(world, {"app/a.json": configmap("a"), "app/b.json": configmap("b"),
                       "web/web.json": deployment("web")})
    wipe_status(world)
    world.commit({"app/a.json": configmap("a"), "web/web.json": deployment("web")})
    world.cluster.failures[("list", CM, None)] = UnreachableError(server="x", why="connection refused")  # type: ignore[assignment]
    world.reconcile("shop")
    assert world.ready("shop")["reason"] == "InventoryIncomplete"
    assert world.configmap("b") is not None


def test_teardown_after_status_was_lost_deletes_what_the_labels_say(world: World) -> None:
    ready_with(world, {"app/a.json": configmap("a"), "web/web.json": deployment("web")})
    wipe_status(world)
    with world.cluster._lock:
        world.cluster.objects[stageset_path("shop")]["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    for _ in range(4):
        if world.reconcile("shop").requeue_after is None:
            break
    assert world.cluster.get(stageset_path("shop")) is None
    assert world.configmap("a") is None
    assert world.cluster.get(f"{DEPLOYMENTS}/web") is None


def test_a_stageset_that_never_applied_anything_is_not_rebuilt(world: World) -> None:
    # First pass denied (a ClusterRole the tenant may not write): the record was grown, nothing applied.
    role = ('{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", '
            '"metadata": {"name": "escalate"}, "rules": []}')
    world.commit({"app/a.json": configmap("a"), "app/role.json": role})
    world.stageset("shop", [{"name": "app", "path": "./app"}])
    world.reconcile("shop")
    assert world.ready("shop")["reason"] == "RBACDenied"
    world.cluster.clear()
    world.commit({"app/a.json": configmap("a")})
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"
    assert not [r for r in world.cluster.requests if r.verb == "list"], "no rebuild: status was not lost"
