"""Teardown always ends: every way a cluster can fail counts toward --max-teardown-wait."""

from __future__ import annotations

import json

import pytest

from stageset.kube.client import UnreachableError, _api_error
from tests.inprocess.conftest import NS, TENANT, World, configmap, stageset_path
from tests.inprocess.fakes import FakeCluster
from tests.inprocess.test_stageset_reconciler import CM, remote_world


def delete(world: World, name: str = "shop") -> None:
    with world.cluster._lock:
        world.cluster.objects[stageset_path(name)]["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"


def events(world: World) -> list[dict[str, object]]:
    """Warning events (a pass that succeeded also says so, as a Normal event)."""
    return [o for p, o in world.cluster.objects.items() if "/events/" in p and o.get("type") == "Warning"]


FAILURES: dict[str, Exception] = {
    "connection refused": UnreachableError(server="https://prod.example:6443", why="connection refused"),
    "TLS": UnreachableError(server="https://prod.example:6443", why="TLS failed (certificate or protocol)"),
    "timeout": UnreachableError(server="https://prod.example:6443", why="no answer in time"),
    "5xx": _api_error(503, b'{"kind": "Status", "reason": "ServiceUnavailable", "message": "REMOTE-BODY"}'),
    "a proxy's page": _api_error(502, b"<html>REMOTE-BODY</html>"),
    "not JSON": ValueError("Expecting value: REMOTE-BODY"),
}


@pytest.mark.parametrize("failure", list(FAILURES))
def test_a_remote_cluster_that_fails_during_teardown_is_given_up_at_the_wait(
    world: World, failure: str
) -> None:
    remote = remote_world(world)
    world.commit({"app/cm.json": configmap("remote"), "app/other.json": configmap("other")})
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"
    delete(world)
    remote.down = FAILURES[failure]
    world.reconciler = world.make_reconciler()  # a fresh process: nothing cached about the remote

    # Retried with a growing delay, the inventory kept, the StageSet held by its finalizer.
    delays = []
    for _ in range(4):
        result = world.reconcile("shop")
        assert result.requeue_after is not None
        delays.append(result.requeue_after)
        world.clock.advance(60)
    assert delays == sorted(delays), delays
    assert delays[-1] > delays[0], delays
    assert world.cluster.get(stageset_path("shop")) is not None
    assert [len(i["entries"]) for i in world.get("shop")["status"]["inventory"]] == [2]

    # Past --max-teardown-wait (5m): released, with an event that counts what was left.
    world.clock.advance(world.settings.max_teardown_wait)
    assert world.reconcile("shop").requeue_after is None
    assert world.cluster.get(stageset_path("shop")) is None
    (event,) = events(world)
    assert event["reason"] == "TeardownForced"
    message = str(event.get("note") or event.get("message"))
    assert "2 object(s) left behind" in message
    assert "ConfigMap in shop: 2" in message
    assert "REMOTE-BODY" not in json.dumps(event)
    # Still on the remote, still labelled: findable later.
    labels = (remote.get(f"{CM}/remote") or {})["metadata"]["labels"]
    assert labels["stages.metio.wtf/name"] == "shop"


def test_the_delay_never_passes_the_wait(world: World) -> None:
    remote = remote_world(world)
    world.reconcile("shop")
    delete(world)
    remote.down = FAILURES["timeout"]
    world.clock.advance(world.settings.max_teardown_wait - 2)
    result = world.reconcile("shop")
    assert result.requeue_after is not None
    assert result.requeue_after <= 2.1


def test_a_missing_kubeconfig_secret_counts_toward_the_wait_too(world: World) -> None:
    remote_world(world)
    world.reconcile("shop")
    delete(world)
    world.cluster.remove(f"/api/v1/namespaces/{NS}/secrets/prod")
    world.reconciler = world.make_reconciler()
    assert world.reconcile("shop").requeue_after is not None
    world.clock.advance(world.settings.max_teardown_wait)
    assert world.reconcile("shop").requeue_after is None
    assert world.cluster.get(stageset_path("shop")) is None
    assert [e["reason"] for e in events(world)] == ["TeardownForced"]


def test_a_remote_that_comes_back_is_torn_down_normally(world: World) -> None:
    remote: FakeCluster = remote_world(world)
    world.reconcile("shop")
    delete(world)
    remote.down = FAILURES["connection refused"]
    world.reconciler = world.make_reconciler()
    world.reconcile("shop")
    remote.down = None
    world.clock.advance(30)
    assert world.reconcile("shop").requeue_after == 1.0
    assert ("delete", f"{CM}/remote") in [(r.verb, r.path) for r in remote.by(TENANT)]
    assert world.reconcile("shop").requeue_after is None
    assert events(world) == []


@pytest.mark.parametrize(("status", "answer"), [
    (409, b'{"kind": "Status", "reason": "Conflict", "message": "the object has been modified"}'),
    # A second pass on a stale cached copy, after the first one released it: already gone.
    (404, b'{"kind": "Status", "reason": "NotFound", "message": "not found"}'),
])
def test_a_forced_release_whose_finalizer_patch_fails_warns_once(
    world: World, status: int, answer: bytes
) -> None:
    # The finalizer patch that would release the StageSet fails as a stale copy's does: nothing
    # was released by this pass, so it tells nothing; the TeardownForced warning is told once,
    # by the pass whose patch released it.
    remote = remote_world(world)
    world.reconcile("shop")
    delete(world)
    remote.down = FAILURES["connection refused"]
    world.reconciler = world.make_reconciler()
    world.clock.advance(world.settings.max_teardown_wait)
    world.cluster.failures[("patch", stageset_path("shop"), False)] = _api_error(status, answer)
    assert world.reconcile("shop").requeue_after is not None
    assert world.cluster.get(stageset_path("shop")) is not None
    assert events(world) == []
    del world.cluster.failures[("patch", stageset_path("shop"), False)]
    assert world.reconcile("shop").requeue_after is None
    assert world.cluster.get(stageset_path("shop")) is None
    assert [e["reason"] for e in events(world)] == ["TeardownForced"]
