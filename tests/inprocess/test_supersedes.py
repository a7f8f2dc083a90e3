"""A predecessor lets go of what it handed over (issue 46 item 3), over the fake cluster.

The moment the end-to-end test cannot stop in: the successor has recorded the hand-over on the
predecessor (``stages.metio.wtf/handed-over``) but has not relabelled the objects yet (it died, or is
still writing).  The predecessor must already let them go: never write them, not list them, and not
tear them down when it is deleted — they still carry its labels, so only the record tells.  And when
the successor is gone, the record no longer holds: the predecessor manages them again and drops the
entry.  The real-apiserver evidence of the whole move is tests/e2e/test_supersedes.py.
"""

from __future__ import annotations

from stageset.apply.handover import ANNOTATION, HandOver
from stageset.apply.inventory import ObjectId
from tests.inprocess.conftest import NS, TENANT, World, configmap, stageset_path

CM = f"/api/v1/namespaces/{NS}/configmaps"
A = ObjectId(namespace=NS, name="a", group="", kind="ConfigMap")


def handed_to_new(world: World) -> None:
    """``old`` holds a and b; ``new`` (naming it in supersedes) has recorded that it takes a."""
    world.commit({"app/a.json": configmap("a"), "app/b.json": configmap("b")})
    world.stageset("old", [{"name": "app", "path": "./app"}])
    world.reconcile("old")
    assert world.ready("old")["status"] == "True"
    world.stageset("new", [{"name": "app", "path": "./app"}], supersedes=[{"name": "old"}])
    record = HandOver().grown(successor=(NS, "new"), uid=world.get("new")["metadata"]["uid"],
                              generation=world.get("old")["metadata"]["generation"],
                              target="", since="2026-03-01T12:00:00Z", objects=[A])
    value = record.encode()
    assert value is not None
    world.cluster.edit(stageset_path("old"), lambda o: o["metadata"].setdefault("annotations", {}).update(
        {ANNOTATION: value.replace(',"t":""', "")}))


def listed(world: World, name: str) -> list[str]:
    return [e["id"] for inv in world.get(name)["status"]["inventory"] for e in inv["entries"]]


def test_what_was_handed_over_is_never_written_nor_listed_by_the_predecessor(world: World) -> None:
    handed_to_new(world)
    world.cluster.clear()

    world.reconcile("old")

    ready = world.ready("old")
    assert ready["status"] == "True"
    assert f"handed over 1 object(s) to StageSet {NS}/new" in ready["message"], ready
    assert listed(world, "old") == [f"{NS}_b__ConfigMap"]
    assert [r for r in world.cluster.by(TENANT, writes_only=True) if r.path == f"{CM}/a"] == []
    events = [r for r in world.cluster.requests if "/events" in r.path and r.verb == "create"]
    assert events, "a HandedOver event"
    # Still labelled for old (the successor has not written it yet)...
    found = world.configmap("a")
    assert found is not None
    assert found["metadata"]["labels"]["stages.metio.wtf/name"] == "old"



def torn_down(world: World, name: str) -> None:
    with world.cluster._lock:
        world.cluster.objects[stageset_path(name)]["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    for _ in range(8):
        world.reconcile(name)
        if world.cluster.get(stageset_path(name)) is None:
            return
    raise AssertionError("the teardown never ended")


def test_a_predecessor_deleted_right_after_the_hand_over_was_recorded_leaves_its_objects(
        world: World) -> None:
    """Its status still lists them and they still carry its labels: only the record tells."""
    handed_to_new(world)
    assert listed(world, "old") == [f"{NS}_a__ConfigMap", f"{NS}_b__ConfigMap"]

    torn_down(world, "old")

    assert world.configmap("b") is None, "what only old held goes with it"
    assert world.configmap("a") is not None, "what it handed over is the successor's"


def test_a_hand_over_to_a_successor_that_is_gone_no_longer_holds(world: World) -> None:
    handed_to_new(world)
    world.cluster.remove(stageset_path("new"))
    world.cluster.clear()

    world.reconcile("old")

    assert world.ready("old")["status"] == "True"
    assert listed(world, "old") == [f"{NS}_a__ConfigMap", f"{NS}_b__ConfigMap"]
    annotations = world.get("old")["metadata"].get("annotations") or {}
    assert ANNOTATION not in annotations, "the void entry is dropped"
    assert "handed over" not in world.ready("old")["message"]


def test_a_predecessor_naming_its_successor_in_a_newer_generation_drops_the_entry(world: World) -> None:
    handed_to_new(world)
    # A newer generation of old names new in its own supersedes: the entry no longer holds for it.
    world.stageset("old", [{"name": "app", "path": "./app"}], supersedes=[{"name": "new"}])
    world.cluster.clear()

    world.reconcile("old")

    assert ANNOTATION not in (world.get("old")["metadata"].get("annotations") or {})
