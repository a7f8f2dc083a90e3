"""Ownership is explicit (issue 32 item 5): an object another live StageSet holds is never written.

Over the fake cluster, with the reconciler wired as the manager wires it: which requests each
StageSet makes on the contested objects, as whom.  The real-apiserver evidence (audit log, UIDs) is
tests/e2e/test_ownership.py.
"""

from __future__ import annotations

import datetime
import json

import pytest

from stageset.api import THIS_CLUSTER
from stageset.api.vocabulary import Reason
from stageset.apply.inventory import ObjectId
from stageset.controller.stageset.claims import UNREADABLE_HOLDER, LiveClaims, lists
from stageset.kube.client import Identity
from tests.inprocess.conftest import NS, SA, TENANT, World, configmap, stageset_path
from tests.inprocess.fakes import FakeClientPool, FakeCluster

CM = f"/api/v1/namespaces/{NS}/configmaps"


def labels(world: World, name: str) -> dict[str, str]:
    found = world.configmap(name)
    assert found is not None
    return dict(found["metadata"].get("labels") or {})


def tenant_writes(world: World, path: str) -> list[str]:
    return [r.verb for r in world.cluster.by(TENANT, writes_only=True) if r.path == path]


def test_a_second_stageset_reports_the_conflict_and_writes_nothing_until_the_holder_is_gone(
        world: World) -> None:
    world.commit({"app/a.json": configmap("a"), "app/b.json": configmap("b")})
    world.stageset("old", [{"name": "app", "path": "./app"}])
    world.reconcile("old")
    assert world.ready("old")["status"] == "True"
    uid = world.configmap("a")["metadata"]["uid"]  # type: ignore[index]
    world.cluster.clear()

    world.stageset("new", [{"name": "app", "path": "./app"}])
    world.reconcile("new")
    ready = world.ready("new")
    assert (ready["status"], ready["reason"]) == ("False", Reason.OWNERSHIP_CONFLICT.value)
    assert f"held by StageSet {NS}/old" in ready["message"]
    # Dry-runs only: neither object was written (nor labelled) by the new StageSet.
    assert tenant_writes(world, f"{CM}/a") == tenant_writes(world, f"{CM}/b") == []
    assert labels(world, "a")["stages.metio.wtf/name"] == "old"
    # The holder is not disturbed: a pass over it writes nothing to its objects.
    world.reconcile("old")
    assert world.ready("old")["status"] == "True"
    assert labels(world, "b")["stages.metio.wtf/name"] == "old"

    # The holder is gone (deleted after orphaning, say): the next pass adopts in place.
    world.cluster.remove(stageset_path("old"))
    world.cluster.clear()
    world.reconcile("new")
    assert world.ready("new")["status"] == "True"
    assert labels(world, "a")["stages.metio.wtf/name"] == "new"
    assert world.configmap("a")["metadata"]["uid"] == uid  # type: ignore[index]
    assert "delete" not in tenant_writes(world, f"{CM}/a")
    assert [e["id"] for e in world.get("new")["status"]["inventory"][0]["entries"]] == [
        f"{NS}_a__ConfigMap", f"{NS}_b__ConfigMap"]


def test_the_first_write_without_a_dry_run_never_takes_an_existing_object(world: World) -> None:
    """The pilot (the stage's first write, made without a dry-run) is create-only: here the only
    contested object is the pilot itself, its sibling is new."""
    world.commit({"app/a.json": configmap("a")}, url="https://git.example/old.git", name="old-src")
    world.stageset("old", [{"name": "app", "path": "./app", "sourceRef": {"name": "old-src"}}])
    world.reconcile("old")
    before = world.configmap("a")
    assert before is not None
    world.commit({"app/a.json": configmap("a"), "app/b.json": configmap("b")})
    world.stageset("new", [{"name": "app", "path": "./app"}])
    world.cluster.clear()

    world.reconcile("new")

    assert world.ready("new")["reason"] == Reason.OWNERSHIP_CONFLICT.value
    after = world.configmap("a")
    assert after is not None
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert world.configmap("b") is None  # nothing of the stage was written


def test_a_holder_that_no_longer_lists_the_object_lets_it_be_adopted(world: World) -> None:
    world.commit({"app/a.json": configmap("a")})
    world.stageset("old", [{"name": "app", "path": "./app"}])
    world.reconcile("old")
    # The holder stopped listing it (a prune: false stage dropped it from its inventory).
    world.cluster.edit(stageset_path("old"), lambda o: o["status"].update(
        inventory=[{"name": "app", "serviceAccountName": SA, "entries": []}]))
    world.stageset("new", [{"name": "app", "path": "./app"}])
    world.reconcile("new")
    assert world.ready("new")["status"] == "True"
    assert labels(world, "a")["stages.metio.wtf/name"] == "new"


def test_liveness_reads_the_inventory_then_the_record() -> None:
    oid = ObjectId(namespace="shop", name="a", group="", kind="ConfigMap")
    listed = {"status": {"inventory": [{"name": "app", "entries": [{"id": oid.encode(), "v": "v1"}]}]}}
    assert lists(listed, oid, target=THIS_CLUSTER)
    other = {"status": {"inventory": [{"name": "app", "entries": [{"id": "shop_b__ConfigMap", "v": "v1"}]}]}}
    assert not lists(other, oid, target=THIS_CLUSTER)
    # Status lost: the durable record covers ConfigMaps in shop, so the holder still holds it.
    record = '{"v":1,"stages":{"app":{"sa":"d","kinds":{"v1//ConfigMap":["shop"]}}}}'
    recorded = {"metadata": {"annotations": {"stages.metio.wtf/inventory-record": record}}}
    assert lists(recorded, oid, target=THIS_CLUSTER)
    elsewhere = ObjectId(namespace="web", name="a", group="", kind="ConfigMap")
    assert not lists(recorded, elsewhere, target=THIS_CLUSTER)
    assert not lists({}, oid, target=THIS_CLUSTER)


def test_a_holder_the_tenant_may_not_read_is_not_named() -> None:
    cluster = FakeCluster()
    cluster.grant_namespace(TENANT, NS)
    pool = FakeClientPool(cluster)
    cluster.put({"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                 "metadata": {"name": "secret-plan", "namespace": "platform"}, "spec": {"stages": []}})
    oid = ObjectId(namespace=NS, name="a", group="", kind="ConfigMap")
    claims = LiveClaims(controller=pool.client(), tenant=pool.client(Identity.service_account(
        namespace=NS, name=SA)), ours=(NS, "new"), target=THIS_CLUSTER)
    # No inventory and no record: it holds nothing, whoever reads it.
    assert claims.claim(holder=("platform", "secret-plan"), oid=oid) is None
    cluster.edit(stageset_path("secret-plan", "platform"), lambda o: o.update(status={"inventory": [
        {"name": "x", "entries": [{"id": oid.encode(), "v": "v1"}]}]}))
    claims = LiveClaims(controller=pool.client(), tenant=pool.client(Identity.service_account(
        namespace=NS, name=SA)), ours=(NS, "new"), target=THIS_CLUSTER)
    claim = claims.claim(holder=("platform", "secret-plan"), oid=oid)
    assert claim is not None
    assert claim.holder == UNREADABLE_HOLDER
    assert "platform" not in claim.holder
    assert "secret-plan" not in claim.holder
    # Once the tenant may read it, it is named.
    cluster.grant(TENANT, "/apis/stages.metio.wtf/v1/namespaces/platform/stagesets/", "get")
    claims = LiveClaims(controller=pool.client(), tenant=pool.client(Identity.service_account(
        namespace=NS, name=SA)), ours=(NS, "new"), target=THIS_CLUSTER)
    named = claims.claim(holder=("platform", "secret-plan"), oid=oid)
    assert named is not None
    assert named.holder == "StageSet platform/secret-plan"


# -- claims are per cluster: one object name on two clusters is two objects -------------------------

REMOTE = "https://prod.example:6443#aaaaaaaaaaaaaaaa"
OTHER = "https://other.example:6443#bbbbbbbbbbbbbbbb"


def holding(oid: ObjectId, *, on: str, previous_on: str | None = None) -> dict[str, object]:
    """A StageSet (as read) whose inventory lists ``oid`` on cluster ``on`` (and, mid-move, on
    ``previous_on``, not cleaned up yet)."""
    def inventory(target: str) -> dict[str, object]:
        found: dict[str, object] = {"name": "app", "entries": [{"id": oid.encode(), "v": "v1"}]}
        if target != THIS_CLUSTER:
            found["target"] = {"id": target, "kubeConfig": {"name": "kc", "key": "value"}}
        return found
    status: dict[str, object] = {"inventory": [inventory(on)]}
    if previous_on is not None:
        status["previousTargets"] = {"since": "2026-03-01T12:00:00Z", "inventory": [inventory(previous_on)]}
    return {"status": status}


def test_a_claim_holds_on_the_cluster_the_holder_listed_the_object_on_only() -> None:
    oid = ObjectId(namespace="shop", name="a", group="", kind="ConfigMap")
    on_remote = holding(oid, on=REMOTE)
    assert lists(on_remote, oid, target=REMOTE), "the same target: a conflict"
    assert not lists(on_remote, oid, target=THIS_CLUSTER), "another cluster: the object there is not its"
    assert not lists(on_remote, oid, target=OTHER)
    here = holding(oid, on=THIS_CLUSTER)
    assert lists(here, oid, target=THIS_CLUSTER)
    assert not lists(here, oid, target=REMOTE)
    # Mid-move the cluster it leaves is still held (its cleanup deletes the object there).
    moving = holding(oid, on=OTHER, previous_on=REMOTE)
    assert lists(moving, oid, target=REMOTE)
    assert lists(moving, oid, target=OTHER)
    assert not lists(moving, oid, target=THIS_CLUSTER)


def test_a_lost_status_holds_by_the_record_on_the_recorded_cluster_only() -> None:
    oid = ObjectId(namespace="shop", name="a", group="", kind="ConfigMap")
    stage = {"sa": "d", "kinds": {"v1//ConfigMap": ["shop"]}, "t": REMOTE, "kc": ["kc", "value"]}
    record = {"v": 2, "stages": {"app": stage}, "prev": [{"stage": "app", **stage, "t": OTHER}],
              "since": "2026-03-01T12:00:00Z"}
    recorded = {"metadata": {"annotations": {"stages.metio.wtf/inventory-record": json.dumps(record)}}}
    assert lists(recorded, oid, target=REMOTE)
    assert lists(recorded, oid, target=OTHER), "a previous cluster the move still has to clean up"
    assert not lists(recorded, oid, target=THIS_CLUSTER)
    # A record from before targets names no cluster: held wherever the object is.
    old = '{"v":1,"stages":{"app":{"sa":"d","kinds":{"v1//ConfigMap":["shop"]}}}}'
    before_targets = {"metadata": {"annotations": {"stages.metio.wtf/inventory-record": old}}}
    assert lists(before_targets, oid, target=REMOTE)
    assert lists(before_targets, oid, target=THIS_CLUSTER)


def test_a_holder_on_another_cluster_lets_the_stage_adopt_and_one_on_the_same_conflicts() -> None:
    cluster = FakeCluster()
    pool = FakeClientPool(cluster)
    oid = ObjectId(namespace=NS, name="a", group="", kind="ConfigMap")
    cluster.put({"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                 "metadata": {"name": "elsewhere", "namespace": NS}, "spec": {"stages": []},
                 "status": holding(oid, on=REMOTE)["status"]})
    tenant = pool.client(Identity.service_account(namespace=NS, name=SA))
    here = LiveClaims(controller=pool.client(), tenant=tenant, ours=(NS, "new"), target=THIS_CLUSTER)
    assert here.claim(holder=(NS, "elsewhere"), oid=oid) is None
    there = LiveClaims(controller=pool.client(), tenant=tenant, ours=(NS, "new"), target=REMOTE)
    claim = there.claim(holder=(NS, "elsewhere"), oid=oid)
    assert claim is not None
    assert claim.holder == f"StageSet {NS}/elsewhere"


# -- a claim that blocks rests on what the controller wrote (issue 43 item 4) ------------------------

RECORD = json.dumps({"v": 2, "stages": {"app": {"sa": "d", "kinds": {"v1//ConfigMap": ["shop"]}}}})
CREATED = "2030-01-01T00:00:00Z"


def recorded(**fields: object) -> dict[str, object]:
    """A StageSet (as read) with a durable record covering ConfigMaps in ``shop``, and ``fields``."""
    obj: dict[str, object] = {"metadata": {"creationTimestamp": CREATED,
                                           "annotations": {"stages.metio.wtf/inventory-record": RECORD}},
                              "spec": {"stages": []}}
    obj.update(fields)
    return obj


AT = datetime.datetime(2030, 1, 1, 0, 5, tzinfo=datetime.UTC)
LATER = datetime.datetime(2030, 1, 1, 0, 11, tzinfo=datetime.UTC)


@pytest.mark.parametrize(("case", "holder", "now", "held"), [
    ("status lost (a restore, or not reconciled yet): the record holds", recorded(), AT, True),
    ("status lost, past the window from its creation: the record no longer holds", recorded(), LATER, False),
    ("suspended: it applies nothing, its record holds nothing",
     recorded(spec={"suspend": True, "stages": []}), AT, False),
    ("reconciled and no inventory: it never applied anything",
     recorded(status={"observedGeneration": 1, "conditions": [
         {"type": "Ready", "status": "False", "reason": "Suspended"}]}), AT, False),
    ("reconciled, failed before any stage applied", recorded(status={"conditions": [
        {"type": "Ready", "status": "False", "reason": "RBACDenied"}]}), AT, False),
    ("the controller's inventory lists it: held, with no end", recorded(status={"inventory": [
        {"name": "app", "entries": [{"id": "shop_a__ConfigMap", "v": "v1"}]}]}), LATER, True),
    ("the controller's inventory lists something else: the record is not asked",
     recorded(status={"inventory": [{"name": "app", "entries": [{"id": "shop_b__ConfigMap", "v": "v1"}]}]}),
     AT, False),
    ("only a move's previous inventory, listing it", recorded(status={"previousTargets": {
        "since": CREATED,
        "inventory": [{"name": "app", "entries": [{"id": "shop_a__ConfigMap", "v": "v1"}]}]}}), LATER, True),
])
def test_a_record_only_claim_counts_only_while_status_is_genuinely_lost(
        case: str, holder: dict[str, object], now: datetime.datetime, held: bool) -> None:
    oid = ObjectId(namespace="shop", name="a", group="", kind="ConfigMap")
    assert lists(holder, oid, target=THIS_CLUSTER, now=now) is held, case


def forge(world: World, *, holder: str, **spec: object) -> None:
    """Another StageSet in the shared namespace, its tenant's forged record covering ConfigMaps in
    ``shop``, and the victim's object's owner labels pointed at it (one label patch)."""
    world.cluster.put({"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                       "metadata": {"name": holder, "namespace": NS,
                                    "annotations": {"stages.metio.wtf/inventory-record": RECORD}},
                       "spec": {"serviceAccountName": SA, **spec, "stages": [
                           {"name": "app", "sourceRef": {"name": "app"}, "path": "./other"}]}})
    world.cluster.edit(f"{CM}/a", lambda o: o["metadata"]["labels"].update(
        {"stages.metio.wtf/name": holder, "stages.metio.wtf/stage": "app"}))


def test_a_forged_record_on_a_suspended_stageset_blocks_nothing(world: World) -> None:
    world.commit({"app/a.json": configmap("a", "v1"), "other/o.json": configmap("o")})
    world.stageset("victim", [{"name": "app", "path": "./app"}])
    world.reconcile("victim")
    assert world.ready("victim")["status"] == "True"
    forge(world, holder="squatter", suspend=True)
    world.reconcile("squatter")  # Suspended: a status, and no inventory
    assert world.ready("squatter")["reason"] == "Suspended"
    world.commit({"app/a.json": configmap("a", "v2"), "other/o.json": configmap("o")})
    world.reconcile("victim")
    assert world.ready("victim")["status"] == "True", world.ready("victim")
    assert labels(world, "a")["stages.metio.wtf/name"] == "victim"


def test_a_record_only_claim_is_reported_with_its_end_and_lapses(world: World) -> None:
    world.commit({"app/a.json": configmap("a", "v1"), "other/o.json": configmap("o")})
    world.stageset("victim", [{"name": "app", "path": "./app"}])
    world.reconcile("victim")
    forge(world, holder="restored")  # never reconciled: its status is lost
    born = world.clock()
    world.cluster.edit(stageset_path("restored"), lambda o: o["metadata"].update(
        creationTimestamp=born.strftime("%Y-%m-%dT%H:%M:%SZ")))
    world.commit({"app/a.json": configmap("a", "v2"), "other/o.json": configmap("o")})
    world.reconcile("victim")
    ready = world.ready("victim")
    assert ready["reason"] == "OwnershipConflict"
    ends = (born + datetime.timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert f"StageSet {NS}/restored (by its durable record only, while its status is lost: at the latest " \
           f"until {ends})" in ready["message"], ready["message"]
    world.clock.advance(601)
    world.reconcile("victim")
    assert world.ready("victim")["status"] == "True", "the record-only claim lapsed"


def test_labels_pointed_at_a_newer_stageset_take_nothing_from_the_one_that_lists_it(world: World) -> None:
    """The squatter's lost status is rebuilt from the cluster by the owner labels its tenant pointed
    at itself: its inventory then lists the victim's object — but it came into existence after the
    object, and the victim's own inventory lists it: no claim."""
    world.commit({"app/a.json": configmap("a", "v1")})
    world.stageset("victim", [{"name": "app", "path": "./app"}])
    world.reconcile("victim")
    world.cluster.edit(f"{CM}/a", lambda o: o["metadata"].update(creationTimestamp="2030-01-01T00:00:00Z"))
    world.cluster.edit(f"{CM}/a", lambda o: o["metadata"]["labels"].update(
        {"stages.metio.wtf/name": "squatter", "stages.metio.wtf/stage": "app"}))
    world.cluster.put({"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                       "metadata": {"name": "squatter", "namespace": NS,
                                    "annotations": {"stages.metio.wtf/inventory-record": RECORD.replace(
                                        '"sa": "d"', f'"sa": "{SA}"')}},
                       "spec": {"serviceAccountName": SA, "stages": [
                           {"name": "app", "sourceRef": {"name": "missing"}, "path": "./app"}]}})
    world.cluster.edit(stageset_path("squatter"), lambda o: o["metadata"].update(
        creationTimestamp="2030-01-01T00:01:00Z"))
    world.reconcile("squatter")
    listed = [e["id"] for inv in world.get("squatter")["status"].get("inventory", []) for e in inv["entries"]]
    assert listed == [f"{NS}_a__ConfigMap"], "the rebuild trusted the labels"
    world.commit({"app/a.json": configmap("a", "v2")})
    world.reconcile("victim")
    assert world.ready("victim")["status"] == "True", world.ready("victim")
    assert labels(world, "a")["stages.metio.wtf/name"] == "victim"
    assert (world.configmap("a") or {})["data"]["k"] == "v2"
