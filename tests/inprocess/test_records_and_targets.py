"""Records (the durable inventory record, rebuilding a lost inventory) and Targets (the clusters a
StageSet applies to, a bounded cache) at their seams: the fake cluster, no reconciler."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import yaml

from stageset.api import StageInventory, StageSet
from stageset.apply.engine import StageApplier
from stageset.apply.inventory import ObjectId, entry, stage_inventory
from stageset.apply.ownership import LABEL_NAME, LABEL_NAMESPACE, LABEL_STAGE
from stageset.apply.record import ANNOTATION, KindRef, Record, StageRecord, parse
from stageset.apply.settings import ApplySettings
from stageset.controller.identity import IdentityPolicy
from stageset.controller.stageset import records
from stageset.controller.stageset.records import Records
from stageset.controller.targets.clusters import LOCAL_TARGET, Target, Targets
from stageset.kube.client import LOCAL, ApiError
from stageset.kube.mapping import RestMapper
from tests.inprocess.conftest import NS, SA, TENANT
from tests.inprocess.fakes import CONTROLLER, FakeClientPool, FakeCluster

CONFIGMAP = KindRef("v1", "ConfigMap")
DEPLOYMENT = KindRef("apps/v1", "Deployment")


def owned(kind: str, name: str, stage: str, owner: str = "shop") -> dict[str, Any]:
    api = "v1" if kind == "ConfigMap" else "apps/v1"
    return {"apiVersion": api, "kind": kind, "metadata": {"name": name, "namespace": NS, "labels": {
        LABEL_NAME: owner, LABEL_NAMESPACE: NS, LABEL_STAGE: stage}}}


def stageset_obj(record: Record | None, status: dict[str, Any] | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "shop", "namespace": NS}
    if record is not None:
        metadata["annotations"] = {ANNOTATION: record.encode()}
    obj: dict[str, Any] = {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet", "metadata": metadata}
    if status is not None:
        obj["status"] = status
    return obj


def inventory(stage: str, *names: str) -> StageInventory:
    return stage_inventory(stage, SA, [entry(ObjectId(NS, n, "", "ConfigMap"), version="v1", digest=None)
                                       for n in names])


@pytest.fixture
def cluster() -> FakeCluster:
    cluster = FakeCluster()
    cluster.grant_namespace(TENANT, NS)
    for obj in (owned("ConfigMap", "a", "app"), owned("ConfigMap", "b", "app"),
                owned("Deployment", "web", "web"), owned("ConfigMap", "theirs", "app", owner="other"),
                owned("ConfigMap", "c", "web")):
        cluster.put(obj)
    return cluster


def recover(cluster: FakeCluster, obj: dict[str, Any], *, inventories: dict[str, StageInventory],
            wanted: dict[str, StageRecord] | None = None) -> records.Recovered:
    pool = FakeClientPool(cluster)
    target = Target(LOCAL, StageApplier(mapper=RestMapper(pool.client())))
    return Records(clients=pool, identities=IdentityPolicy(cluster_admin=False)).recover(
        obj, inventories=inventories, wanted=wanted or {}, target=target, now="2026-01-01T00:00:00Z")


RECORD = Record({"app": StageRecord(SA, {CONFIGMAP: frozenset({NS})}),
                 "web": StageRecord(SA, {DEPLOYMENT: frozenset({NS})})})


@pytest.mark.parametrize(("case", "record", "status", "inventories", "rebuilds"), [
    ("status lost, the record names stages", RECORD, None, {}, True),
    ("status lost, no record: nothing ever applied", None, None, {}, False),
    ("status has conditions but no inventory: never applied", RECORD,
     {"conditions": [{"type": "Ready", "status": "False"}]}, {}, False),
    ("status has the inventory", RECORD, {"observedGeneration": 1}, {"app": inventory("app", "a")}, False),
    ("the last rebuild was incomplete: again", Record(RECORD.stages, rebuild=True), {"observedGeneration": 1},
     {"app": inventory("app", "a")}, True),
])
def test_when_an_inventory_is_rebuilt(cluster: FakeCluster, case: str, record: Record | None,
                                      status: dict[str, Any] | None, inventories: dict[str, StageInventory],
                                      rebuilds: bool) -> None:
    found = recover(cluster, stageset_obj(record, status), inventories=inventories)
    lists = [r for r in cluster.requests if r.verb == "list"]
    assert bool(lists) is rebuilds, case
    assert (found.record is not None) is rebuilds, case
    if not rebuilds:
        assert found.inventories == inventories, case


def test_a_rebuild_lists_as_the_recorded_identity_where_the_record_says_and_takes_only_ours(
        cluster: FakeCluster) -> None:
    found = recover(cluster, stageset_obj(RECORD, None), inventories={})
    assert found.problem is None
    names = {n: sorted(ObjectId.decode(e.id).name for e in i.entries) for n, i in found.inventories.items()}
    # c is labelled for stage web but is a ConfigMap, a kind not recorded there: not looked for.
    assert names == {"app": ["a", "b"], "web": ["web"]}
    assert {(r.user, r.path) for r in cluster.requests if r.verb == "list"} == {
        (TENANT, f"/api/v1/namespaces/{NS}/configmaps"),
        (TENANT, f"/apis/apps/v1/namespaces/{NS}/deployments")}
    assert found.record == Record(RECORD.stages, rebuild=False)


def test_a_denied_list_makes_the_view_incomplete_and_the_record_says_so(cluster: FakeCluster) -> None:
    cluster.failures[("list", f"/apis/apps/v1/namespaces/{NS}/deployments", None)] = ApiError(
        status=403, reason="Forbidden", message="no")
    found = recover(cluster, stageset_obj(RECORD, None), inventories={},
                    wanted={"new": StageRecord(SA, {CONFIGMAP: frozenset({NS})})})
    assert found.problem is not None
    assert "may not list Deployment" in found.problem
    assert found.record is not None
    assert found.record.rebuild
    assert "new" in found.record.stages, "what is about to be applied is recorded before it is"
    assert cluster.writes() == [], "Records only reads: the writer writes the record"


def test_the_record_grows_before_applying_and_settles_after_prune() -> None:
    obj = stageset_obj(RECORD, {})
    here = {"target": LOCAL_TARGET, "now": "2026-01-01T00:00:00Z"}
    covered = records.grown(obj, {"app": StageRecord(SA, {CONFIGMAP: frozenset({NS})})}, **here)
    assert covered is None, "covered"
    grown = records.grown(obj, {"app": StageRecord(SA, {DEPLOYMENT: frozenset({"elsewhere"})})}, **here)
    assert grown is not None
    assert grown.stages["app"].kinds == {CONFIGMAP: frozenset({NS}), DEPLOYMENT: frozenset({"elsewhere"})}
    settled = records.settled([inventory("app", "a")], previous=None, unlisted=())
    assert json.loads(settled.encode())["stages"] == {"app": {"sa": SA, "kinds": {"v1//ConfigMap": [NS]}}}
    assert parse(stageset_obj(settled, None)) == settled


# -- Targets: one per kubeconfig content, at most `capacity`, least recently used dropped -------

def kubeconfig_secret(cluster: FakeCluster, name: str, server: str) -> None:
    config = yaml.safe_dump({
        "current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": {"server": f"https://{server}:6443"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]})
    cluster.put({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS},
                 "data": {"value": base64.b64encode(config.encode()).decode()}})


def target_stageset(secret: str) -> StageSet:
    return StageSet.model_validate({"metadata": {"name": "shop", "namespace": NS}, "spec": {
        "serviceAccountName": SA, "kubeConfig": {"secretRef": {"name": secret}},
        "stages": [{"name": "app", "sourceRef": {"name": "app"}}]}})


def test_remote_targets_are_kept_least_recently_used_first_out(cluster: FakeCluster) -> None:
    pool = FakeClientPool(cluster)
    for i in range(3):
        kubeconfig_secret(cluster, f"k{i}", f"remote{i}.example")
        pool.clusters[f"remote{i}.example"] = FakeCluster(name=f"remote{i}.example")
    local = StageApplier(mapper=RestMapper(pool.client()))
    targets = Targets(clients=pool, settings=ApplySettings(), local=local, capacity=2)
    reader = pool.client()

    def resolve(i: int) -> Target:
        found = targets.resolve(reader, target_stageset(f"k{i}"))
        found.applier.resolve({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}, NS)
        return found

    def discoveries(i: int) -> int:
        return len([r for r in pool.clusters[f"remote{i}.example"].requests if r.user == CONTROLLER])

    first, second = resolve(0), resolve(1)
    assert resolve(0) is first, "the same kubeconfig: the same target (and discovery cache)"
    assert discoveries(0) == 1
    third = resolve(2)  # over capacity: 1 is the least recently used
    assert len(targets) == 2
    assert pool.forgotten == [second.cluster], "its clients are dropped with it"
    assert resolve(0) is first
    assert resolve(1) is not second, "built again when used again"
    assert pool.forgotten == [second.cluster, third.cluster]
    assert discoveries(1) == 2, "discovery runs again for a target built again"
