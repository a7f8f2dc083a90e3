"""A predecessor lets go of what it handed over (issue 46 item 3), over the fake cluster.

The moment the end-to-end test cannot stop in: the successor has recorded the hand-over on the
predecessor (``stages.metio.wtf/handed-over``) but has not relabelled the objects yet (it died, or is
still writing).  The predecessor must already let them go: never write them, not list them, and not
tear them down when it is deleted — they still carry its labels, so only the record tells.  And when
the successor is gone, the record no longer holds: the predecessor manages them again and drops the
entry.  The real-apiserver evidence of the whole move is tests/e2e/test_supersedes.py.
"""

from __future__ import annotations

from stageset.api.vocabulary import Reason
from stageset.apply.handover import ANNOTATION, HandOver, parse
from stageset.apply.inventory import ObjectId
from stageset.controller.consumers import artifact_consumer
from stageset.controller.kinds import GITREPOSITORIES
from tests.inprocess.conftest import NS, TENANT, URL, World, configmap, stageset_path
from tests.inprocess.fakes import ALL_VERBS, CONTROLLER

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


# -- the successor's side ------------------------------------------------------------------------

SYSTEM = "shop-system"
SUCCESSOR = f"system:serviceaccount:{SYSTEM}:deployer"
REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


def same_source_in(world: World, namespace: str) -> None:
    """A GitRepository ``app`` in ``namespace`` at the revision the one in ``shop`` is at (the same
    repository, as the control-plane namespace's own source would be)."""
    world.cluster.put({"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
                       "metadata": {"name": "app", "namespace": namespace}, "spec": {"url": URL}})
    path = GITREPOSITORIES.object_path(name="app", namespace=namespace)
    world.cluster.set_status(path, {"artifact": {"revision": world.sources.revision(URL)}})
    sha = world.sources.revision(URL).rpartition(":")[2]
    world.sources.served.add((URL, sha, artifact_consumer((world.cluster.get(path) or {})["metadata"])))


def successor(world: World, *, rights_in_shop: str | None) -> None:
    """``old`` in shop holds a and b; ``new`` in shop-system names it in ``supersedes``."""
    world.cluster.reviews = True
    world.commit({"app/a.json": configmap("a"), "app/b.json": configmap("b")})
    world.stageset("old", [{"name": "app", "path": "./app"}])
    world.reconcile("old")
    assert world.ready("old")["status"] == "True"
    world.cluster.grant_namespace(SUCCESSOR, SYSTEM)
    if rights_in_shop is not None:
        world.cluster.grant_namespace(SUCCESSOR, NS, rights_in_shop)
    same_source_in(world, SYSTEM)
    world.stageset("new", [{"name": "app", "path": "./app"}], namespace=SYSTEM, targetNamespace=NS,
                   supersedes=[{"namespace": NS, "name": "old"}])


def test_a_successor_takes_over_in_place_what_it_may_and_the_predecessor_lets_go(world: World) -> None:
    successor(world, rights_in_shop=ALL_VERBS)
    before = {name: (world.configmap(name) or {})["metadata"]["uid"] for name in ("a", "b")}
    world.cluster.clear()

    world.reconcile("new", SYSTEM)

    assert world.ready("new", SYSTEM)["status"] == "True", world.ready("new", SYSTEM)
    mine = world.cluster.by(SUCCESSOR)
    # Asked as the successor's identity: the predecessor read, and one access review.
    assert [r.verb for r in mine if r.path == stageset_path("old")] == ["get"]
    assert [r.verb for r in mine if r.path == REVIEWS] == ["create"]
    for name in ("a", "b"):
        written = [r.verb for r in world.cluster.by(SUCCESSOR, writes_only=True) if r.path == f"{CM}/{name}"]
        assert written == ["apply"], (name, written)
        found = world.configmap(name)
        assert found is not None
        assert found["metadata"]["uid"] == before[name]
        assert found["metadata"]["labels"]["stages.metio.wtf/namespace"] == SYSTEM
    record = parse(world.get("old"))
    assert [(e.successor, sorted(o.name for o in e.objects)) for e in record.entries] == [
        ((SYSTEM, "new"), ["a", "b"])]
    # The record is written as the controller, before the objects: once per check that finds objects
    # to take (the stage's first write, made alone, is one).
    recorded = [r.verb for r in world.cluster.by(CONTROLLER, writes_only=True)
                if r.path == stageset_path("old")]
    assert recorded
    assert set(recorded) == {"patch"}

    world.cluster.clear()
    world.reconcile("old")
    assert listed(world, "old") == []
    assert f"handed over 2 object(s) to StageSet {SYSTEM}/new" in world.ready("old")["message"]
    assert [r for r in world.cluster.by(TENANT, writes_only=True) if r.path.startswith(CM)] == []
    # The predecessor names no one: it asks nothing of anyone's rights; it reads its successor once.
    assert [r for r in world.cluster.requests if r.path == REVIEWS] == []
    assert [r.verb for r in world.cluster.by(CONTROLLER) if r.path == stageset_path("new", SYSTEM)] == ["get"]

    # The successor's next pass takes nothing more, and writes no record again.
    world.cluster.clear()
    world.reconcile("new", SYSTEM)
    assert [r for r in world.cluster.by(CONTROLLER, writes_only=True) if r.path == stageset_path("old")] == []


def test_a_successor_that_may_not_patch_its_predecessor_takes_nothing(world: World) -> None:
    successor(world, rights_in_shop="get,list,watch,create,apply,delete")
    world.cluster.clear()

    world.reconcile("new", SYSTEM)

    ready = world.ready("new", SYSTEM)
    assert (ready["status"], ready["reason"]) == ("False", Reason.SUPERSEDE_DENIED.value)
    assert f"spec.supersedes[0]: {SUCCESSOR} may not patch StageSet {NS}/old" in ready["message"]
    applied = [r for r in world.cluster.by(SUCCESSOR) if r.verb not in ("get", "create")]
    assert applied == [], "nothing applied, not even dry-run"
    assert ANNOTATION not in (world.get("old")["metadata"].get("annotations") or {})
    holders = {(world.configmap(n) or {})["metadata"]["labels"]["stages.metio.wtf/name"] for n in ("a", "b")}
    assert holders == {"old"}


def test_a_successor_that_may_not_read_its_predecessor_is_told_nothing_about_it(world: World) -> None:
    successor(world, rights_in_shop=None)

    world.reconcile("new", SYSTEM)

    ready = world.ready("new", SYSTEM)
    assert (ready["status"], ready["reason"]) == ("False", Reason.SUPERSEDE_DENIED.value)
    assert f"spec.supersedes[0]: {SUCCESSOR} may not read the StageSet it names" in ready["message"]
    assert f"{NS}/old" not in ready["message"]


def test_a_predecessor_that_is_gone_refuses_nothing_and_costs_one_read(world: World) -> None:
    successor(world, rights_in_shop=ALL_VERBS)
    world.cluster.remove(stageset_path("old"))
    world.cluster.clear()

    world.reconcile("new", SYSTEM)

    assert world.ready("new", SYSTEM)["status"] == "True"
    asked = [r.verb for r in world.cluster.by(SUCCESSOR) if r.path in (stageset_path("old"), REVIEWS)]
    assert asked == ["get"]


def test_two_stagesets_naming_each_other_hand_over_once_each_way_and_then_stand(world: World) -> None:
    """Back again while the old one still exists: it names the new one at a newer generation and takes
    everything back; the new one, whose own record says who took it, does not take it back again."""
    successor(world, rights_in_shop=ALL_VERBS)
    world.reconcile("new", SYSTEM)
    world.reconcile("old")
    assert listed(world, "old") == []
    world.cluster.grant_namespace(TENANT, SYSTEM, "get,patch")
    world.stageset("old", [{"name": "app", "path": "./app"}],
                   supersedes=[{"namespace": SYSTEM, "name": "new"}])

    world.reconcile("old")

    assert world.ready("old")["status"] == "True", world.ready("old")
    assert listed(world, "old") == [f"{NS}_a__ConfigMap", f"{NS}_b__ConfigMap"]
    holders = {(world.configmap(n) or {})["metadata"]["labels"]["stages.metio.wtf/namespace"]
               for n in ("a", "b")}
    assert holders == {NS}
    assert ANNOTATION not in (world.get("old")["metadata"].get("annotations") or {}), "its own entry dropped"
    assert [e.successor for e in parse(world.get("new", SYSTEM)).entries] == [(NS, "old")]

    world.reconcile("new", SYSTEM)
    assert world.ready("new", SYSTEM)["status"] == "True"
    assert f"handed over 2 object(s) to StageSet {NS}/old" in world.ready("new", SYSTEM)["message"]
    world.cluster.clear()
    world.reconcile("old")
    world.reconcile("new", SYSTEM)
    assert [r for r in world.cluster.writes() if r.path.startswith(CM) and not r.dry_run] == [], \
        "neither takes them back again"


def test_no_cross_namespace_refs_does_not_refuse_a_hand_over_across_namespaces(world: World) -> None:
    """Crossing namespaces is the point of a hand-over: the patch right on the predecessor gates it."""
    world.reconciler = world.make_reconciler(no_cross_namespace_refs=True)
    successor(world, rights_in_shop=ALL_VERBS)

    world.reconcile("new", SYSTEM)

    assert world.ready("new", SYSTEM)["status"] == "True", world.ready("new", SYSTEM)
    assert (world.configmap("a") or {})["metadata"]["labels"]["stages.metio.wtf/namespace"] == SYSTEM
