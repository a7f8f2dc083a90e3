"""A new StageSet created with its source: the first word held while it only waits
(stageset/controller/stageset/holding.py), through the real wiring, with a hand-moved tick.

A source fetched within the grace is never shown as not ready, and the StageSet is written
as if it had been created after its source: one finalizer-and-record patch, one status write.
One still waiting when the grace is over says exactly what it said before — but a GitRepository
that has said nothing yet (its first fetch queued) is waited for longer: its word wakes the StageSet.
"""

from __future__ import annotations

import pytest

from stageset.apply.ownership import FINALIZER
from stageset.controller.events import EventRecorder
from stageset.controller.identity import IdentityPolicy
from stageset.controller.kinds import GITREPOSITORIES, STAGESETS
from stageset.controller.metrics import Metrics
from stageset.controller.settings import ControllerSettings
from stageset.controller.shared import Shared
from stageset.controller.stageset.holding import GRACE, PATIENCE
from stageset.controller.stageset.reconciler import StageSetReconciler
from stageset.controller.stageset.setup import stageset_reconciler
from stageset.controller.targets.setup import clusters
from tests.inprocess.conftest import NS, World, configmap, stageset_path
from tests.inprocess.fakes import CONTROLLER


class Ticks:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def holding_reconciler(world: World, ticks: Ticks) -> StageSetReconciler:
    """The World's reconciler as the controller runs it: the first wait held for GRACE seconds."""
    settings = ControllerSettings(**{**world.settings.__dict__, "first_wait_grace": GRACE})
    shared = Shared(clients=world.pool, settings=settings, metrics=Metrics(), clock=world.clock,
                    events=EventRecorder(world.pool.client(), clock=world.clock), ticks=ticks,
                    terminating=world.terminating)
    return stageset_reconciler(shared, identities=IdentityPolicy(cluster_admin=False), store=world.sources,
                               resource=STAGESETS, source_resource=GITREPOSITORIES, index=world.index,
                               stop=world.stop, selected_by=world.selected_by,
                               targets=clusters(shared))


def stageset_writes(world: World) -> list[tuple[str, str]]:
    """The controller's writes to the StageSet and its Events: (verb, what)."""
    path, events = stageset_path("shop"), f"/apis/events.k8s.io/v1/namespaces/{NS}/events"
    return [(r.verb, "status" if r.path.endswith("/status") else "event" if r.path.startswith(events)
             else "object") for r in world.cluster.by(CONTROLLER, writes_only=True)
            if r.path.startswith((path, events))]


def test_a_source_fetched_within_the_grace_is_never_shown_as_not_ready(world: World) -> None:
    ticks = Ticks()
    world.reconciler = holding_reconciler(world, ticks)
    world.stageset("shop", [{"name": "app", "path": "./app"}])

    held = world.reconcile("shop")  # its GitRepository is not there yet

    assert held.requeue_after == GRACE
    assert held.wanted is not None
    assert held.wanted(), "it looks again at the deadline unless woken sooner"
    assert world.cluster.writes() == [], "nothing written: no finalizer, status or event"
    assert "status" not in world.get("shop")

    ticks.now += GRACE / 2
    world.commit({"app/a.json": configmap("a")})  # fetched: its watch wakes the StageSet
    done = world.reconcile("shop")

    assert world.ready("shop")["status"] == "True"
    assert done.requeue_after == 600.0
    assert not held.wanted(), "the held pass's requeue is dropped: no extra pass"
    writes = stageset_writes(world)
    assert writes.count(("patch", "object")) == 1, writes  # finalizer and record, one patch
    assert writes.count(("patch", "status")) == 1, writes  # one status write for the whole wait
    assert world.configmap("a") is not None


def test_a_source_still_missing_after_the_grace_is_said_as_before(world: World) -> None:
    ticks = Ticks()
    world.reconciler = holding_reconciler(world, ticks)
    world.stageset("shop", [{"name": "app", "path": "./app"}])
    held = world.reconcile("shop")
    assert world.cluster.writes() == []

    ticks.now += GRACE
    said = world.reconcile("shop")  # the deadline's requeue

    assert held.wanted is not None
    assert not held.wanted()
    assert said.wanted is None
    ready = world.ready("shop")
    assert (ready["status"], ready["reason"]) == ("False", "SourceNotReady")
    assert FINALIZER in (world.get("shop")["metadata"].get("finalizers") or [])
    # Said once: the next pass over the same generation is not held again.
    world.cluster.clear()
    ticks.now += 30
    again = world.reconcile("shop")
    assert again.wanted is None


def test_a_stageset_that_already_says_where_it_stands_is_never_held(world: World) -> None:
    ticks = Ticks()
    world.commit({"app/a.json": configmap("a")})
    world.stageset("shop", [{"name": "app", "path": "./app"}])
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"
    world.reconciler = holding_reconciler(world, ticks)
    # The same generation, its source gone: said at once (a shown StageSet is not held).
    with world.cluster._lock:
        del world.cluster.objects[GITREPOSITORIES.object_path(name="app", namespace=NS)]

    result = world.reconcile("shop")

    assert result.wanted is None
    assert world.ready("shop")["reason"] == "SourceNotReady"


def test_a_gitrepository_not_fetched_yet_is_waited_for_longer_than_the_grace(world: World) -> None:
    ticks = Ticks()
    world.reconciler = holding_reconciler(world, ticks)
    source = GITREPOSITORIES.object_path(name="app", namespace=NS)
    world.cluster.put({"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
                       "metadata": {"name": "app", "namespace": NS}, "spec": {"url": "https://git.example/x"}})
    world.stageset("shop", [{"name": "app", "path": "./app"}])

    held = world.reconcile("shop")
    assert held.requeue_after == PATIENCE
    ticks.now += GRACE * 10  # queued behind other fetches
    again = world.reconcile("shop")  # woken by another change of the source, say
    assert again.requeue_after == pytest.approx(PATIENCE - GRACE * 10)
    assert world.cluster.writes() == []

    world.cluster.set_status(source, {"conditions": [{
        "type": "Ready", "status": "False", "reason": "GitOperationFailed", "message": "unreachable",
        "lastTransitionTime": "2030-01-01T00:00:00Z"}]})
    said = world.reconcile("shop")  # its failure wakes the StageSet: said at once

    assert said.wanted is None
    assert held.wanted is not None
    assert not held.wanted()
    ready = world.ready("shop")
    assert (ready["status"], ready["reason"]) == ("False", "SourceNotReady")
    assert "unreachable" in ready["message"]


def test_a_dependency_ready_within_the_grace_is_never_shown_as_not_ready(world: World) -> None:
    ticks = Ticks()
    world.reconciler = holding_reconciler(world, ticks)
    world.commit({"db/a.json": configmap("a"), "app/b.json": configmap("b")})
    world.stageset("db", [{"name": "db", "path": "./db"}])
    world.stageset("shop", [{"name": "app", "path": "./app"}], dependsOn=[{"name": "db"}])

    held = world.reconcile("shop")  # db has not been reconciled yet
    # The short grace: a dependency's first word wakes nobody, only its turning Ready does.
    assert held.requeue_after == GRACE
    assert world.cluster.writes() == []

    world.reconcile("db")
    assert world.ready("db")["status"] == "True"
    done = world.reconcile("shop")  # woken by db turning Ready

    assert world.ready("shop")["status"] == "True"
    assert done.wanted is None
    assert held.wanted is not None
    assert not held.wanted()
    writes = stageset_writes(world)
    assert writes.count(("patch", "status")) == 1, writes
