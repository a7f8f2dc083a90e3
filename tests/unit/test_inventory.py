from __future__ import annotations

from stageset.apply.inventory import (
    Entry,
    ObjectId,
    StageInventory,
    dump,
    duplicates,
    load,
    merged,
    object_id,
    stale,
)


def oid(name: str, namespace: str = "ns", kind: str = "ConfigMap", group: str = "") -> ObjectId:
    return ObjectId(namespace=namespace, name=name, group=group, kind=kind)


def inv(stage: str, *names: str, account: str | None = "deployer") -> StageInventory:
    return StageInventory(stage, account, {oid(n): Entry(oid(n), "v1", "h") for n in names})


def test_ids_round_trip_in_fluxs_format() -> None:
    deployment = object_id({"apiVersion": "apps/v1", "kind": "Deployment",
                            "metadata": {"name": "web", "namespace": "shop"}})
    assert deployment.encode() == "shop_web_apps_Deployment"
    assert ObjectId.decode(deployment.encode()) == deployment
    role = object_id({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                      "metadata": {"name": "system:x"}})
    assert ObjectId.decode(role.encode()) == role


def test_status_round_trip() -> None:
    inventories = {"a": inv("a", "x", "y"), "b": inv("b", "z", account=None)}
    assert load({"inventory": dump(inventories)}) == inventories


def test_stale_is_what_no_stage_renders_any_more() -> None:
    old = {"a": inv("a", "keep", "gone", "mover"), "b": inv("b", "other")}
    new = {"a": inv("a", "keep"), "b": inv("b", "mover", "other")}
    assert [s.entry.id.name for s in stale(old=old, new=new)] == ["gone"]


def test_removed_stages_are_stale_and_prune_false_keeps() -> None:
    old = {"a": inv("a", "x"), "removed": inv("removed", "r"), "keeper": inv("keeper", "k")}
    new = {"a": inv("a", "x"), "keeper": inv("keeper")}
    result = stale(old=old, new=new, prune_disabled=["keeper"])
    assert [(s.stage, s.entry.id.name) for s in result] == [("removed", "r")]
    assert result[0].service_account == "deployer"


def test_merged_keeps_old_and_new_until_prune() -> None:
    both = merged(inv("a", "old", "same"), inv("a", "same", "new"))
    assert sorted(i.name for i in both.entries) == ["new", "old", "same"]


def test_duplicates_name_every_stage() -> None:
    clash = duplicates({"a": [oid("x"), oid("y")], "b": [oid("x")], "c": [oid("x", namespace="other")]})
    assert clash == {oid("x"): ["a", "b"]}
