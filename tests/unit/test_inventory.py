from __future__ import annotations

from stageset.api import StageInventory, StageSetStatus
from stageset.apply.inventory import (
    ObjectId,
    Stale,
    by_id,
    by_stage,
    duplicates,
    entry,
    merged,
    object_id,
    ordered,
    stage_inventory,
    stale,
    with_kept,
)


def oid(name: str, namespace: str = "ns", kind: str = "ConfigMap", group: str = "") -> ObjectId:
    return ObjectId(namespace=namespace, name=name, group=group, kind=kind)


def inv(stage: str, *names: str, account: str | None = "deployer") -> StageInventory:
    return stage_inventory(stage, account, [entry(oid(n), version="v1", digest="h") for n in names])


def names(inventory: StageInventory) -> list[str]:
    return [i.name for i in by_id(inventory)]


def test_ids_round_trip_in_fluxs_format() -> None:
    deployment = object_id({"apiVersion": "apps/v1", "kind": "Deployment",
                            "metadata": {"name": "web", "namespace": "shop"}})
    assert deployment.encode() == "shop_web_apps_Deployment"
    assert ObjectId.decode(deployment.encode()) == deployment
    role = object_id({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                      "metadata": {"name": "system:x"}})
    assert ObjectId.decode(role.encode()) == role


def test_status_round_trip_through_the_one_status_model() -> None:
    inventories = {"b": inv("b", "z", account=None), "a": inv("a", "y", "x")}
    wire = StageSetStatus(inventory=ordered(inventories)).model_dump(mode="json", exclude_none=True)
    assert [i["name"] for i in wire["inventory"]] == ["a", "b"]
    assert [e["id"] for e in wire["inventory"][0]["entries"]] == ["ns_x__ConfigMap", "ns_y__ConfigMap"]
    assert "serviceAccountName" not in wire["inventory"][1]
    assert by_stage(StageSetStatus.model_validate(wire).inventory) == inventories


def test_stale_is_what_no_stage_renders_any_more() -> None:
    old = {"a": inv("a", "keep", "gone", "mover"), "b": inv("b", "other")}
    new = {"a": inv("a", "keep"), "b": inv("b", "mover", "other")}
    assert [s.id.name for s in stale(old=old, new=new)] == ["gone"]


def test_removed_stages_are_stale_and_prune_false_keeps() -> None:
    old = {"a": inv("a", "x"), "removed": inv("removed", "r"), "keeper": inv("keeper", "k")}
    new = {"a": inv("a", "x"), "keeper": inv("keeper")}
    result = stale(old=old, new=new, prune_disabled=["keeper"])
    assert [(s.stage, s.id.name) for s in result] == [("removed", "r")]
    assert result[0].service_account == "deployer"


def test_merged_keeps_old_and_new_until_prune() -> None:
    both = merged(inv("a", "old", "same"), inv("a", "same", "new"))
    assert names(both) == ["new", "old", "same"]


def test_objects_that_could_not_be_pruned_stay_tracked() -> None:
    kept = Stale(stage="gone-stage", service_account="old-sa",
                 entry=entry(oid("stuck"), version="v1", digest=None))
    result = with_kept({"a": inv("a", "x")}, [kept])
    assert names(result["a"]) == ["x"]
    assert names(result["gone-stage"]) == ["stuck"]
    assert result["gone-stage"].service_account_name == "old-sa"


def test_duplicates_name_every_stage() -> None:
    clash = duplicates({"a": [oid("x"), oid("y")], "b": [oid("x")], "c": [oid("x", namespace="other")]})
    assert clash == {oid("x"): ["a", "b"]}
