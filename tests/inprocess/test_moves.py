"""Re-targeting is make-before-break (issue 32 items 1-3), over fake clusters: what a move writes
where, and what it never deletes.  The real apiservers' version is tests/e2e/test_retarget.py."""

from __future__ import annotations

import base64
from typing import Any

import yaml

from stageset.api.vocabulary import Reason
from stageset.apply.record import ANNOTATION, parse
from stageset.kube.client import ApiError, UnreachableError
from tests.inprocess.conftest import NS, TENANT, World, configmap, stageset_path
from tests.inprocess.fakes import FakeCluster

LABEL = "stages.metio.wtf/name"
CM = f"/api/v1/namespaces/{NS}/configmaps"
PROD = "https://prod.example:6443"


def kubeconfig(world: World, secret: str, host: str) -> None:
    config = yaml.safe_dump({
        "current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": {"server": f"https://{host}:6443"}}],
        "users": [{"name": "u", "user": {"token": "t0k3n"}}]})
    world.cluster.objects.pop(f"/api/v1/namespaces/{NS}/secrets/{secret}", None)
    world.cluster.put({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret, "namespace": NS},
                       "data": {"value": base64.b64encode(config.encode()).decode()}})


def remote(world: World, host: str) -> FakeCluster:
    cluster = FakeCluster(name=host)
    cluster.grant_namespace(TENANT, NS)
    world.pool.clusters[host] = cluster
    return cluster


def events(world: World, reason: str) -> list[str]:
    return [str(o.get("note")) for p, o in world.cluster.objects.items()
            if "/events/" in p and o.get("reason") == reason]


def unreachable(host: str) -> UnreachableError:
    return UnreachableError(server=f"https://{host}:6443", why="connection refused")


def deny_apply(cluster: FakeCluster, path: str) -> None:
    cluster.failures[("apply", path, None)] = ApiError(status=403, reason="Forbidden", message="denied")


def allow_apply(cluster: FakeCluster, path: str) -> None:
    cluster.failures.pop(("apply", path, None))


def deletes(cluster: FakeCluster) -> list[str]:
    return [r.path for r in cluster.by(TENANT, writes_only=True) if r.verb == "delete"]


STAGES = [{"name": "db", "path": "./db"}, {"name": "app", "path": "./app", "dependsOn": ["db"]}]


def settle(world: World) -> int:
    """Reconcile until the move is over (a deleted object is looked at again before the next
    stage's go, as teardown does); returns how many passes that took."""
    for passes in range(1, 8):
        world.reconcile("shop")
        if not (world.get("shop").get("status") or {}).get("previousTargets"):
            return passes
    raise AssertionError("the move never ended")


def ready_here(world: World, **spec: Any) -> None:
    world.commit({"db/d.json": configmap("d"), "app/a.json": configmap("a")})
    world.stageset("shop", STAGES, **spec)
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"


def move_to(world: World, host: str | None, **spec: Any) -> None:
    if host is None:
        world.stageset("shop", STAGES, **spec)
        return
    kubeconfig(world, "prod", host)
    world.stageset("shop", STAGES, kubeConfig={"secretRef": {"name": "prod"}}, **spec)


def test_a_move_applies_on_the_new_cluster_first_then_deletes_here_dependents_first(world: World) -> None:
    ready_here(world)
    prod = remote(world, "prod.example")
    move_to(world, "prod.example")
    world.cluster.clear()
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"
    assert deletes(world.cluster) == [f"{CM}/a"], "dependents first: the app stage's objects go first"
    settle(world)

    assert world.ready("shop")["status"] == "True"
    assert prod.get(f"{CM}/a") is not None
    assert prod.get(f"{CM}/d") is not None
    assert deletes(prod) == [], "nothing is deleted on the new target"
    # Then the previous target, as the identity that applied it, dependents first.
    assert deletes(world.cluster) == [f"{CM}/a", f"{CM}/d"]
    assert world.configmap("a") is None
    assert world.configmap("d") is None
    status = world.get("shop")["status"]
    assert status.get("previousTargets") is None
    assert {inv["target"]["id"] for inv in status["inventory"]} == {f"{PROD}#insecure"}
    assert events(world, "DriftCorrected") == [], "what a move creates is not drift"
    assert events(world, "Retargeted") == [
        f"moved from this cluster to {PROD}: 2 object(s) applied and ready there; on this cluster: "
        "2 deleted, 0 released (prune: false)"]
    record = parse(world.get("shop"))
    assert record.previous == ()
    assert {s.target for s in record.stages.values()} == {f"{PROD}#insecure"}
    assert "t0k3n" not in str(world.get("shop")), "never a credential"

    # A quiet pass afterwards writes nothing (the move is over).
    world.cluster.clear()
    prod.clear()
    world.clock.advance(600)
    world.reconcile("shop")
    assert world.cluster.writes() == []
    assert prod.writes() == []


def test_a_move_back_here_from_a_remote(world: World) -> None:
    prod = remote(world, "prod.example")
    world.commit({"db/d.json": configmap("d"), "app/a.json": configmap("a")})
    move_to(world, "prod.example")
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"
    move_to(world, None)
    settle(world)
    assert world.ready("shop")["status"] == "True"
    assert world.configmap("a") is not None
    assert prod.get(f"{CM}/a") is None
    assert prod.get(f"{CM}/d") is None
    assert deletes(world.cluster) == []
    assert all("target" not in inv for inv in world.get("shop")["status"]["inventory"])


def test_prune_false_stages_are_released_on_the_previous_target(world: World) -> None:
    world.commit({"db/d.json": configmap("d"), "app/a.json": configmap("a")})
    stages = [{"name": "db", "path": "./db", "prune": False}, {"name": "app", "path": "./app"}]
    world.stageset("shop", stages)
    world.reconcile("shop")
    remote(world, "prod.example")
    kubeconfig(world, "prod", "prod.example")
    world.stageset("shop", stages, kubeConfig={"secretRef": {"name": "prod"}})
    settle(world)
    left = world.configmap("d")
    assert left is not None, "kept"
    assert LABEL not in (left["metadata"].get("labels") or {}), "released"
    assert world.configmap("a") is None
    assert events(world, "Retargeted")[0].endswith("on this cluster: 1 deleted, 1 released (prune: false)")


def test_an_unreachable_new_target_deletes_nothing_anywhere(world: World) -> None:
    ready_here(world)
    prod = remote(world, "prod.example")
    prod.down = unreachable("prod.example")
    move_to(world, "prod.example")
    world.cluster.clear()
    world.reconcile("shop")
    ready = world.ready("shop")
    assert (ready["status"], ready["reason"]) == ("False", Reason.CLUSTER_UNREACHABLE)
    assert deletes(world.cluster) == []
    assert world.configmap("a") is not None
    # The move is still known: once the new target answers, it completes.
    prod.down = None
    settle(world)
    assert world.ready("shop")["status"] == "True"
    assert world.configmap("a") is None
    assert prod.get(f"{CM}/a") is not None


def test_a_stage_not_ready_on_the_new_target_holds_the_cleanup(world: World) -> None:
    ready_here(world)
    prod = remote(world, "prod.example")
    deny_apply(prod, f"{CM}/a")
    move_to(world, "prod.example")
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "False"
    assert world.configmap("a") is not None, "nothing deleted here"
    assert world.configmap("d") is not None, "nothing deleted here"
    status = world.get("shop")["status"]
    assert status["previousTargets"]["inventory"], "what is left here is kept in status"


def test_an_unreachable_old_target_is_given_up_after_the_wait(world: World) -> None:
    prod = remote(world, "prod.example")
    world.commit({"db/d.json": configmap("d"), "app/a.json": configmap("a")})
    move_to(world, "prod.example")
    world.reconcile("shop")
    prod.down = unreachable("prod.example")
    move_to(world, None)
    result = world.reconcile("shop")
    assert world.ready("shop")["status"] == "True", "the new target does not wait for the old one"
    assert world.configmap("a") is not None
    assert world.get("shop")["status"]["previousTargets"]["inventory"]
    assert result.requeue_after is not None
    assert result.requeue_after < 60, "retried with backoff"
    assert events(world, "RetargetAbandoned") == []
    world.clock.advance(world.settings.max_teardown_wait)
    world.reconcile("shop")
    assert world.get("shop")["status"].get("previousTargets") is None
    assert parse(world.get("shop")).previous == ()
    [abandoned] = events(world, "RetargetAbandoned")
    assert abandoned.startswith(f"gave up cleaning up {PROD} after ")
    assert "2 object(s) left behind (last failure: spec.kubeConfig: the cluster at " \
        f"{PROD} cannot be used: connection refused)" in abandoned
    assert f"ConfigMap in {NS}: 2" in abandoned
    prod.down = None
    assert prod.get(f"{CM}/a")["metadata"]["labels"][LABEL] == "shop", "left objects keep their labels"


def test_status_lost_mid_move_finds_the_previous_target_from_the_record(world: World) -> None:
    ready_here(world)
    prod = remote(world, "prod.example")
    deny_apply(prod, f"{CM}/a")
    move_to(world, "prod.example")
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "False"
    assert parse(world.get("shop")).previous, "the record names what is left here"
    world.cluster.objects[stageset_path("shop")].pop("status")
    allow_apply(prod, f"{CM}/a")
    settle(world)
    assert world.ready("shop")["status"] == "True"
    assert world.configmap("a") is None
    assert world.configmap("d") is None
    assert prod.get(f"{CM}/a") is not None
    assert prod.get(f"{CM}/d") is not None


def test_a_second_change_mid_move_back_to_the_first_target_deletes_nothing_there(world: World) -> None:
    ready_here(world)
    prod = remote(world, "prod.example")
    deny_apply(prod, f"{CM}/a")
    move_to(world, "prod.example")
    world.reconcile("shop")  # d applied there, a denied: nothing cleaned up here
    assert prod.get(f"{CM}/d") is not None
    move_to(world, None)
    world.cluster.clear()
    settle(world)
    assert world.ready("shop")["status"] == "True"
    assert deletes(world.cluster) == [], "the newest target loses nothing"
    assert world.configmap("a") is not None
    assert world.configmap("d") is not None
    assert prod.get(f"{CM}/d") is None, "the copy on the abandoned target is gone: one live copy"
    assert ANNOTATION in world.get("shop")["metadata"]["annotations"]
    assert parse(world.get("shop")).previous == ()


def test_diff_shows_what_a_pending_move_deletes_or_releases_where(world: World) -> None:
    from stageset.api import StageSet
    from stageset.apply.engine import StageApplier
    from stageset.cli.preview import moving
    from stageset.controller.targets.clusters import Target
    from stageset.kube.client import LOCAL
    from stageset.kube.mapping import RestMapper

    world.commit({"db/d.json": configmap("d"), "app/a.json": configmap("a")})
    stages = [{"name": "db", "path": "./db", "prune": False},
              {"name": "app", "path": "./app", "dependsOn": ["db"]}]
    world.stageset("shop", stages)
    world.reconcile("shop")
    live = world.get("shop")
    spec = StageSet.model_validate({**live, "status": None})
    here = Target(LOCAL, StageApplier(mapper=RestMapper(world.pool.client())))
    assert moving(spec, here, live) == [], "nothing moves while the target stays"
    there = Target(LOCAL, here.applier, server=PROD, id=f"{PROD}#insecure")
    shown = {(d.object, d.action, d.note) for d in moving(spec, there, live)}
    assert shown == {
        (f"ConfigMap/{NS}/a", "Deleted",
         f"moved: deleted on this cluster (stage app) once every stage is Ready on {PROD}"),
        (f"ConfigMap/{NS}/d", "Released",
         f"moved: released on this cluster (stage db) once every stage is Ready on {PROD}")}


def torn_down(world: World) -> None:
    """Reconcile the deleted StageSet until its teardown lets it go."""
    for _ in range(8):
        world.reconcile("shop")
        if world.cluster.get(stageset_path("shop")) is None:
            return
    raise AssertionError("the teardown never ended")


def test_deleting_the_stageset_mid_move_tears_down_both_clusters(world: World) -> None:
    ready_here(world)
    prod = remote(world, "prod.example")
    deny_apply(prod, f"{CM}/a")
    move_to(world, "prod.example")
    world.reconcile("shop")  # d applied there, a denied: the move is in flight
    assert world.get("shop")["status"]["previousTargets"]
    world.cluster.objects[stageset_path("shop")]["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    torn_down(world)
    assert prod.get(f"{CM}/d") is None, "the new cluster's objects are torn down"
    assert world.configmap("a") is None, "and what the move left on the previous one"
    assert world.configmap("d") is None
    assert events(world, "TeardownForced") == []


def test_deleted_right_after_the_change_tears_down_each_cluster_what_it_holds(world: World) -> None:
    ready_here(world)
    prod = remote(world, "prod.example")
    move_to(world, "prod.example")  # no pass yet: status names only this cluster
    world.cluster.objects[stageset_path("shop")]["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    torn_down(world)
    assert world.configmap("a") is None, "torn down where it was applied, not looked for on the new cluster"
    assert world.configmap("d") is None
    assert deletes(prod) == []


def test_a_new_cluster_slow_to_turn_ready_does_not_use_up_the_cleanup_wait(world: World) -> None:
    ready_here(world)
    prod = remote(world, "prod.example")
    deny_apply(prod, f"{CM}/a")
    move_to(world, "prod.example")
    world.reconcile("shop")
    world.clock.advance(world.settings.max_teardown_wait * 2)
    allow_apply(prod, f"{CM}/a")
    settle(world)
    assert events(world, "RetargetAbandoned") == []
    assert world.configmap("a") is None
    assert world.configmap("d") is None


def test_deletion_policy_orphan_releases_what_a_move_leaves_and_deletes_nothing_there(world: World) -> None:
    """The rule (docs/tenancy.md, "The cluster moves"): a move is the StageSet leaving a cluster, so
    ``deletionPolicy: Orphan`` governs it as it governs a teardown: released, never deleted."""
    ready_here(world, deletionPolicy="Orphan")
    prod = remote(world, "prod.example")
    move_to(world, "prod.example", deletionPolicy="Orphan")
    world.cluster.clear()
    settle(world)
    assert world.ready("shop")["status"] == "True"
    assert prod.get(f"{CM}/a") is not None
    assert deletes(world.cluster) == [], "nothing deleted on the cluster left behind"
    for name in ("a", "d"):
        left = world.configmap(name)
        assert left is not None, "kept"
        assert LABEL not in (left["metadata"].get("labels") or {}), "released: owner labels removed"
    assert events(world, "Retargeted") == [
        f"moved from this cluster to {PROD}: 2 object(s) applied and ready there; on this cluster: "
        "0 deleted, 2 released (deletionPolicy: Orphan)"]
