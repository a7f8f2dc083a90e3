"""Offboarding: a StageSet torn down because its own namespace is being deleted.

The tenant's RoleBinding in that namespace goes with the namespace, so here the tenant's rights
there are taken away as the teardown starts.  The teardown then makes no request at all for what
lies inside the terminating namespace (its deletion takes it) and still deletes, as the tenant,
what lies elsewhere; without the namespace terminating, the same denial keeps the teardown
waiting as before.  (The same on a real apiserver with the real namespace controller:
``tests/e2e/test_tenant_lifecycle.py``.)
"""

from __future__ import annotations

from tests.inprocess.conftest import NS, TENANT, World, configmap, stageset_path

OTHER = "shop-data"
INSIDE = f"/api/v1/namespaces/{NS}/configmaps/inside"
OUTSIDE = f"/api/v1/namespaces/{OTHER}/configmaps/outside"
DELETED_AT = "2030-01-01T00:00:00Z"


def _ready_and_deleted(world: World) -> None:
    """A Ready StageSet with an object in its namespace and one in another, then deleted, with the
    tenant's rights in its own namespace gone (its RoleBinding deleted)."""
    world.cluster.grant_namespace(TENANT, OTHER)
    world.commit({"app/inside.json": configmap("inside"),
                  "app/outside.json": configmap("outside", namespace=OTHER)})
    world.stageset("shop", [{"name": "app", "path": "./app"}])
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"
    assert world.configmap("inside") is not None
    assert world.configmap("outside", OTHER) is not None
    with world.cluster._lock:
        world.cluster.objects[stageset_path("shop")]["metadata"]["deletionTimestamp"] = DELETED_AT
    world.cluster.grants = [g for g in world.cluster.grants if g[:2] != (TENANT, f"namespace:{NS}")]
    world.cluster.clear()


def test_a_terminating_namespace_keeps_its_objects_to_itself_and_the_rest_is_torn_down(world: World) -> None:
    _ready_and_deleted(world)
    world.terminating.handle("MODIFIED", {"metadata": {"name": NS, "deletionTimestamp": DELETED_AT}})

    assert world.reconcile("shop").requeue_after == 1.0  # the object elsewhere is going
    assert world.reconcile("shop").requeue_after is None
    assert world.cluster.get(stageset_path("shop")) is None, "finalizer removed: the StageSet is gone"
    deletes = [(r.user, r.path) for r in world.cluster.requests if r.verb == "delete"]
    assert deletes == [(TENANT, OUTSIDE)], "deleted elsewhere as the tenant, as before"
    assert [r for r in world.cluster.requests if r.path == INSIDE] == [], "nothing asked inside"
    assert world.configmap("inside") is not None, "left to the namespace's deletion"
    assert world.configmap("outside", OTHER) is None
    forced = [o for path, o in world.cluster.objects.items()
              if "/events/" in path and o["reason"] == "TeardownForced"]
    assert forced == []


def test_without_the_namespace_terminating_a_denied_delete_waits_as_before(world: World) -> None:
    _ready_and_deleted(world)

    again = world.reconcile("shop").requeue_after
    assert again is not None
    assert world.cluster.get(stageset_path("shop")) is not None, "still held by its finalizer"
    denied = [r for r in world.cluster.requests if r.path == INSIDE]
    assert denied
    assert all(r.user == TENANT for r in denied)
    assert world.configmap("inside") is not None


def test_a_namespace_seen_deleted_or_back_is_not_terminating() -> None:
    from stageset.controller.terminating import TerminatingNamespaces

    terminating = TerminatingNamespaces()
    going = {"metadata": {"name": NS, "deletionTimestamp": DELETED_AT}}
    terminating.handle("ADDED", {"metadata": {"name": OTHER}})
    terminating.handle("MODIFIED", going)
    assert terminating(NS)
    assert not terminating(OTHER)
    terminating.handle("DELETED", going)
    assert not terminating(NS), "gone: a namespace of that name created later starts afresh"
    terminating.handle("ADDED", {"metadata": {"name": NS}})
    assert not terminating(NS)
