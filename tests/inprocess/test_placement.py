"""``spec.targetNamespace`` and ``spec.deletionPolicy`` (issue 32 item 4), over the fake cluster."""

from __future__ import annotations

from stageset.apply.engine import StageApplier
from stageset.controller.stageset.placement import place
from stageset.controller.targets.clusters import Target
from stageset.kube.client import LOCAL
from stageset.kube.mapping import RestMapper
from tests.inprocess.conftest import NS, TENANT, World, configmap, stageset_path
from tests.inprocess.fakes import FakeClientPool, FakeCluster

LABEL = "stages.metio.wtf/name"


def test_place_overrides_namespaced_kinds_and_leaves_cluster_scoped_ones() -> None:
    target = Target(LOCAL, StageApplier(mapper=RestMapper(FakeClientPool(FakeCluster()).client())))
    bare = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}}
    named = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b", "namespace": "elsewhere"}}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "r"}}
    custom = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    assert place(bare, "web", target)["metadata"]["namespace"] == "web"
    assert place(named, "web", target)["metadata"]["namespace"] == "web"
    assert named["metadata"]["namespace"] == "elsewhere", "the manifest itself is left untouched"
    assert place(role, "web", target) is role
    # A kind not served yet (its CRD is in the same stage) is taken as namespaced.
    assert place(custom, "web", target)["metadata"]["namespace"] == "web"


def test_target_namespace_puts_every_object_there_and_a_change_moves_them(world: World) -> None:
    world.cluster.grant_namespace(TENANT, "web")
    world.cluster.grant_namespace(TENANT, "api")
    world.commit({"app/a.json": configmap("a"), "app/b.json": configmap("b", namespace="elsewhere")})
    world.stageset("shop", [{"name": "app", "path": "./app"}], targetNamespace="web")
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"
    assert world.configmap("a", "web") is not None
    assert world.configmap("b", "web") is not None
    assert world.configmap("a") is None
    assert [e["id"] for e in world.get("shop")["status"]["inventory"][0]["entries"]] == [
        "web_a__ConfigMap", "web_b__ConfigMap"]

    world.stageset("shop", [{"name": "app", "path": "./app"}], targetNamespace="api")
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"
    assert world.configmap("a", "api") is not None
    # The old namespace's copies are pruned once every stage is Ready there, as the stage's identity.
    assert world.configmap("a", "web") is None
    deletes = [r.path for r in world.cluster.by(TENANT, writes_only=True) if r.verb == "delete"]
    assert deletes == ["/api/v1/namespaces/web/configmaps/a", "/api/v1/namespaces/web/configmaps/b"]


def test_deletion_policy_orphan_releases_every_object(world: World) -> None:
    world.commit({"app/a.json": configmap("a"), "db/b.json": configmap("b")})
    world.stageset("shop", [{"name": "db", "path": "./db"}, {"name": "app", "path": "./app"}],
                   deletionPolicy="Orphan")
    world.reconcile("shop")
    uid = world.configmap("a")["metadata"]["uid"]  # type: ignore[index]
    world.cluster.objects[stageset_path("shop")]["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    world.cluster.clear()
    world.reconcile("shop")
    assert [r.verb for r in world.cluster.by(TENANT, writes_only=True)] == ["patch", "patch"]
    for name in ("a", "b"):
        left = world.configmap(name)
        assert left is not None
        assert LABEL not in (left["metadata"].get("labels") or {})
    assert world.configmap("a")["metadata"]["uid"] == uid  # type: ignore[index]
    events = [o for p, o in world.cluster.objects.items()
              if "/events/" in p and o.get("reason") == "Orphaned"]
    told = "(deletionPolicy: Orphan): left 1 object(s) in place without owner labels: ConfigMap"
    assert {e["note"] for e in events} == {f"stage 'app' {told} {NS}/a", f"stage 'db' {told} {NS}/b"}


def test_a_target_namespace_change_releases_the_old_copies_of_a_prune_false_stage(world: World) -> None:
    world.cluster.grant_namespace(TENANT, "web")
    world.cluster.grant_namespace(TENANT, "api")
    world.commit({"app/a.json": configmap("a"), "db/d.json": configmap("d")})
    stages = [{"name": "db", "path": "./db", "prune": False}, {"name": "app", "path": "./app"}]
    world.stageset("shop", stages, targetNamespace="web")
    world.reconcile("shop")
    world.stageset("shop", stages, targetNamespace="api")
    world.cluster.clear()
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"
    assert world.configmap("d", "api") is not None
    old = world.configmap("d", "web")
    assert old is not None, "a prune: false stage's object is never deleted"
    assert LABEL not in (old["metadata"].get("labels") or {}), "released, not left labelled"
    assert world.configmap("a", "web") is None, "the other stage's old copy is pruned"
    writes = [(r.verb, r.path) for r in world.cluster.by(TENANT, writes_only=True) if "/web/" in r.path]
    assert ("patch", "/api/v1/namespaces/web/configmaps/d") in writes
    assert ("delete", "/api/v1/namespaces/web/configmaps/d") not in writes
    inventory = {i["name"]: [e["id"] for e in i["entries"]] for i in world.get("shop")["status"]["inventory"]}
    assert inventory["db"] == ["api_d__ConfigMap"], "the released copy is no longer tracked"
