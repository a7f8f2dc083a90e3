"""The durable record and the inventories name the cluster they were applied on: the format-1
migration, a move's previous targets, and the split a pass makes before it applies.  Pure tables."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stageset.api import (
    THIS_CLUSTER,
    AppliedTarget,
    InventoryEntry,
    PreviousTargets,
    SecretKeyRef,
    StageInventory,
    TargetRef,
)
from stageset.api.common import LocalObjectRef
from stageset.apply.inventory import split_by_target as split
from stageset.apply.record import (
    ANNOTATION,
    FORMAT,
    KindRef,
    Record,
    StageRecord,
    of_inventories,
    of_objects,
    parse,
    problem_of,
)
from stageset.controller.targets.clusters import where

A = "https://a.example:6443#aaaaaaaaaaaaaaaa"
B = "https://b.example:6443#bbbbbbbbbbbbbbbb"
CM = KindRef("v1", "ConfigMap")
NOW, EARLIER = "2026-03-01T12:00:00Z", "2026-03-01T11:00:00Z"


def obj(body: Any) -> dict[str, Any]:
    raw = body if isinstance(body, str) else json.dumps(body)
    return {"metadata": {"annotations": {ANNOTATION: raw}}}


def on(target: str, *, sa: str = "deployer", ns: str = "shop") -> StageRecord:
    via = None if target == THIS_CLUSTER else ("kc", "value")
    return StageRecord(sa, {CM: frozenset({ns})}, target, via)


V1 = {"v": 1, "stages": {"app": {"sa": "deployer", "kinds": {"v1//ConfigMap": ["shop"]}}}}


@pytest.mark.parametrize(("case", "body", "expected"), [
    ("format 1 (before targets): every stage on this cluster", V1,
     Record({"app": on(THIS_CLUSTER)}, targetless=True)),
    ("format 1 with a pending rebuild", {**V1, "rebuild": True},
     Record({"app": on(THIS_CLUSTER)}, rebuild=True, targetless=True)),
    ("format 2, this cluster (no target written)",
     {"v": 2, "stages": {"app": {"sa": "deployer", "kinds": {"v1//ConfigMap": ["shop"]}}}},
     Record({"app": on(THIS_CLUSTER)})),
    ("format 2, a remote with its kubeConfig Secret",
     {"v": 2, "stages": {"app": {"sa": "deployer", "kinds": {"v1//ConfigMap": ["shop"]}, "t": A,
                                 "kc": ["kc", "value"]}}},
     Record({"app": on(A)})),
    ("format 2, a move in flight",
     {"v": 2, "stages": {"app": {"sa": "deployer", "kinds": {"v1//ConfigMap": ["shop"]}, "t": B,
                                 "kc": ["kc", "value"]}},
      "prev": [{"stage": "app", "sa": "deployer", "kinds": {"v1//ConfigMap": ["shop"]}}], "since": EARLIER},
     Record({"app": on(B)}, previous=(("app", on(THIS_CLUSTER)),), since=EARLIER)),
    ("a format this controller does not know: look on the cluster again", {"v": 3, "stages": {}},
     Record(rebuild=True)),
    ("unreadable", "{not json", Record(rebuild=True)),
])
def test_parse_and_migrate(case: str, body: Any, expected: Record) -> None:
    assert parse(obj(body)) == expected, case


def test_no_record_at_all_is_one_from_before_targets() -> None:
    assert parse({"metadata": {}}) == Record(targetless=True)


@pytest.mark.parametrize("record", [
    Record({"app": on(THIS_CLUSTER)}),
    Record({"app": on(A), "web": on(A, ns="web")}),
    Record({"app": on(B)}, previous=(("app", on(A)), ("app", on(THIS_CLUSTER))), since=EARLIER),
])
def test_encode_round_trips_and_names_no_credential(record: Record) -> None:
    encoded = record.encode()
    assert json.loads(encoded)["v"] == FORMAT == 2
    assert parse(obj(encoded)) == record
    assert "token" not in encoded
    assert "certificate" not in encoded


def test_this_cluster_is_never_written_as_a_target() -> None:
    assert json.loads(Record({"app": on(THIS_CLUSTER)}).encode()) == {
        "v": 2, "stages": {"app": {"sa": "deployer", "kinds": {"v1//ConfigMap": ["shop"]}}}}


@pytest.mark.parametrize(("case", "record", "target", "expected"), [
    ("nothing moved", Record({"app": on(A)}), A, Record({"app": on(A)})),
    ("moved: the old stage record is one to clean up, since now", Record({"app": on(A)}), B,
     Record({}, previous=(("app", on(A)),), since=NOW)),
    ("moved again mid-move: both previous targets kept, since the first move",
     Record({"app": on(B)}, previous=(("app", on(A)),), since=EARLIER), THIS_CLUSTER,
     Record({}, previous=(("app", on(A)), ("app", on(B))), since=EARLIER)),
    ("back to a previous target: it is current again, never cleaned",
     Record({"app": on(B)}, previous=(("app", on(A)),), since=EARLIER), A,
     Record({"app": on(A)}, previous=(("app", on(B)),), since=EARLIER)),
    ("a record from before targets is taken where the StageSet points now (an upgrade is no move)",
     Record({"app": on(THIS_CLUSTER)}, targetless=True), A,
     Record({"app": StageRecord("deployer", {CM: frozenset({"shop"})}, A, None)})),
])
def test_rebased(case: str, record: Record, target: str, expected: Record) -> None:
    assert record.rebased(target, now=NOW) == expected, case


def test_grown_on_another_target_moves_the_old_stage_record_to_previous() -> None:
    grown = Record({"app": on(A)}).grown({"app": on(B)})
    assert grown.stages == {"app": on(B)}
    assert grown.previous == (("app", on(A)),)


def test_covers_only_the_same_target() -> None:
    assert on(A).covers(on(A))
    assert not on(A).covers(on(B))


def entry(name: str) -> InventoryEntry:
    return InventoryEntry(id=f"shop_{name}__ConfigMap", v="v1")


def inv(stage: str, target: str, *names: str) -> StageInventory:
    applied = None if target == THIS_CLUSTER else \
        AppliedTarget(id=target, kube_config=SecretKeyRef(name="kc"))
    return StageInventory(name=stage, service_account_name="deployer", entries=[entry(n) for n in names],
                          target=applied)


def test_of_inventories_records_targets_and_what_is_left_on_previous_ones() -> None:
    record = of_inventories([inv("app", B, "a")], previous=[inv("app", A, "a")], since=EARLIER)
    assert record.stages == {"app": on(B)}
    assert record.previous == (("app", on(A)),)
    assert record.since == EARLIER


@pytest.mark.parametrize(("case", "inventories", "moving", "target", "current", "left"), [
    ("nothing moved", {"app": inv("app", A, "a")}, None, A, {"app": inv("app", A, "a")}, None),
    ("inventories from before targets are this cluster", {"app": inv("app", THIS_CLUSTER, "a")}, None,
     THIS_CLUSTER, {"app": inv("app", THIS_CLUSTER, "a")}, None),
    ("moved: the old inventory is left to clean up, since now", {"app": inv("app", A, "a")}, None, B,
     {}, PreviousTargets(since=NOW, inventory=[inv("app", A, "a")])),
    ("moved again: both left, since the first move", {"app": inv("app", B, "a")},
     PreviousTargets(since=EARLIER, inventory=[inv("app", A, "a")]), THIS_CLUSTER,
     {}, PreviousTargets(since=EARLIER, inventory=[inv("app", A, "a"), inv("app", B, "a")])),
    ("back to a previous target: its inventory is the stage's own again, never cleaned",
     {"app": inv("app", B, "b")}, PreviousTargets(since=EARLIER, inventory=[inv("app", A, "a")]), A,
     {"app": inv("app", A, "a")}, PreviousTargets(since=EARLIER, inventory=[inv("app", B, "b")])),
    ("an empty inventory on a previous target leaves nothing to clean", {"app": inv("app", A)}, None, B,
     {}, None),
])
def test_split(case: str, inventories: dict[str, StageInventory], moving: PreviousTargets | None, target: str,
               current: dict[str, StageInventory], left: PreviousTargets | None) -> None:
    assert split(inventories, moving, target=target, now=NOW) == (current, left), case


def test_events_name_a_server_or_this_cluster_never_the_fingerprint() -> None:
    assert where(THIS_CLUSTER) == "this cluster"
    assert where(A) == "https://a.example:6443"


# -- a platform StageTarget in the record (issue 33: a status lost mid-move still reaches it) --------

ON_TARGET = StageRecord("deployer", {CM: frozenset({"shop"})}, A, None, ("platform", "prod"))


def test_a_stage_target_is_recorded_by_reference_and_read_back() -> None:
    encoded = Record({"app": on(B)}, previous=(("app", ON_TARGET),), since=EARLIER).encode()
    body = json.loads(encoded)
    assert body["v"] == FORMAT == 2, "an optional key of format 2: no new format, no rebuild on rollback"
    assert body["prev"][0]["st"] == ["platform", "prod"]
    assert body["prev"][0]["t"] == A
    assert "kc" not in body["prev"][0]
    assert parse(obj(encoded)).previous == (("app", ON_TARGET),)


def test_a_format_2_record_without_a_stage_target_reads_as_before() -> None:
    old = {"v": 2, "stages": {"app": {"sa": "deployer", "kinds": {"v1//ConfigMap": ["shop"]}, "t": A}}}
    assert parse(obj(old)).stages["app"] == StageRecord("deployer", {CM: frozenset({"shop"})}, A, None, None)


def test_an_inventory_on_a_stage_target_records_the_target() -> None:
    prod = AppliedTarget(id=A, target_ref=TargetRef(namespace="platform", name="prod"))
    on_prod = StageInventory(name="app", service_account_name="deployer", entries=[entry("a")], target=prod)
    record = of_inventories([inv("app", THIS_CLUSTER, "a")], previous=[on_prod], since=EARLIER)
    assert record.previous == (("app", ON_TARGET),)


def test_records_name_no_stage_target_for_this_cluster() -> None:
    local = of_objects("deployer", [("shop", {"apiVersion": "v1", "kind": "ConfigMap"})], target=THIS_CLUSTER,
                       via=None, stage_target=("platform", "prod"))
    assert local.stage_target is None


# -- a workload-identity ConfigMap in the record (issue 48: a move away from it reaches it again) ---

ON_CONFIG_MAP = StageRecord("deployer", {CM: frozenset({"shop"})}, A, None, None, "prod-eu")


def test_a_workload_identity_configmap_is_recorded_by_name_and_read_back() -> None:
    encoded = Record({"app": on(B)}, previous=(("app", ON_CONFIG_MAP),), since=EARLIER).encode()
    body = json.loads(encoded)
    assert body["v"] == FORMAT == 2, "an optional key of format 2, as st"
    assert body["prev"][0]["cm"] == "prod-eu"
    assert "kc" not in body["prev"][0]
    assert parse(obj(encoded)).previous == (("app", ON_CONFIG_MAP),)
    on_map = AppliedTarget(id=A, config_map_ref=LocalObjectRef(name="prod-eu"))
    inventory = StageInventory(name="app", service_account_name="deployer", entries=[entry("a")],
                               target=on_map)
    assert of_inventories([], previous=[inventory], since=EARLIER).previous == (("app", ON_CONFIG_MAP),)
    local = of_objects("deployer", [("shop", {"apiVersion": "v1", "kind": "ConfigMap"})], target=THIS_CLUSTER,
                       via=None, config_map="prod-eu")
    assert local.config_map is None, "nothing recorded for this cluster"


def test_one_way_to_a_target_the_newer_record_s() -> None:
    """A stage that switched from a Secret to a ConfigMap naming the same cluster records the ConfigMap
    only (and back): the record never names two ways to one cluster."""
    by_secret = StageRecord("deployer", {CM: frozenset({"shop"})}, A, ("kc", "value"))
    assert by_secret.union(ON_CONFIG_MAP).via is None
    assert by_secret.union(ON_CONFIG_MAP).config_map == "prod-eu"
    assert ON_CONFIG_MAP.union(by_secret).config_map is None
    assert ON_CONFIG_MAP.union(by_secret).via == ("kc", "value")

# -- every value of a tenant-editable record is checked where it is parsed (issue 43 item 7) ---------

GOOD = {"sa": "deployer", "kinds": {"v1//ConfigMap": ["shop"]}}
REMOTE = {**GOOD, "t": A, "kc": ["kc", "value"]}


@pytest.mark.parametrize(("body", "field"), [
    ({"v": 2, "stages": {"Not A Stage": GOOD}}, "stages: 'Not A Stage' is not a stage name"),
    ({"v": 2, "stages": {"app": {**GOOD, "sa": "x\r\ny"}}}, "stages[app].sa"),
    ({"v": 2, "stages": {"app": {**GOOD, "kinds": {"v1//Config Map": ["shop"]}}}}, "stages[app].kinds"),
    ({"v": 2, "stages": {"app": {**GOOD, "kinds": {"../../v1//ConfigMap": ["shop"]}}}}, "stages[app].kinds"),
    ({"v": 2, "stages": {"app": {**GOOD, "kinds": {"v1//ConfigMap": ["../kube-system"]}}}},
     "stages[app].kinds[v1//ConfigMap]"),
    ({"v": 2, "stages": {"app": {**GOOD, "kinds": {"v1//ConfigMap": "shop"}}}},
     "stages[app].kinds[v1//ConfigMap]"),
    ({"v": 2, "stages": {"app": REMOTE},
      "prev": [{"stage": "app", **REMOTE, "kc": ["Not_A_Secret", "value"]}]}, "prev[0].kc"),
    ({"v": 2, "stages": {"app": REMOTE}, "prev": [{"stage": "app", **REMOTE, "kc": ["kc"]}]}, "prev[0].kc"),
    ({"v": 2, "stages": {"app": {**REMOTE, "st": ["NS", "t"]}}}, "stages[app].st"),
    ({"v": 2, "stages": {"app": {**REMOTE, "cm": "../prod-eu"}}}, "stages[app].cm"),
    ({"v": 2, "stages": {"app": {**REMOTE, "cm": ["prod-eu"]}}}, "stages[app].cm"),
    ({"v": 2, "stages": {"app": {**REMOTE, "t": "a b"}}}, "stages[app].t"),
    ({"v": 2, "stages": {"app": GOOD}, "prev": [{"stage": 5, **GOOD}]}, "prev[0].stage"),
    ({"v": 2, "stages": {"app": GOOD}, "prev": {"stage": "app"}}, "prev: not a list"),
    ({"v": 2, "stages": {"app": GOOD}, "prev": [{"stage": "app", **REMOTE}], "since": "yesterday"}, "since"),
    ({"v": 1, "stages": {"app": "deployer"}}, "stages[app]: not an object"),
    ({"v": 2, "stages": ["app"]}, "stages: not an object"),
])
def test_a_record_value_that_fails_the_apis_rules_is_named_and_trusted_for_nothing(body: Any,
                                                                                    field: str) -> None:
    record = parse(obj(body))
    assert str(record.problem).startswith(field), record.problem
    assert (record.stages, record.previous, record.rebuild) == ({}, (), True)
    said = problem_of(obj(body))
    assert str(said).startswith(f"metadata.annotations[{ANNOTATION}]: {field}")


def test_what_the_controller_writes_passes_its_own_checks() -> None:
    written = Record({"app": StageRecord("deployer", {CM: frozenset({"shop", ""}),
                                                       KindRef("apps/v1", "Deployment"): frozenset({"shop"}),
                                                       KindRef("x.example.com/v1alpha1", "Widget-Set"):
                                                       frozenset({""})},
                                         A, ("kc", "value"), ("platform", "prod")),
                      "db": on(THIS_CLUSTER)},
                     previous=(("app", on(B)),), since=NOW)
    assert parse(obj(written.encode())) == written
    assert problem_of(obj(written.encode())) is None
