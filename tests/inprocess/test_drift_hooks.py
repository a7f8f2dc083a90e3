"""The StageSet reconciler as wired with drift watches (``controller/stageset/drifting.py``) over the
fake cluster and a recording pool: what each pass registers, as whom, what suspend and deletion
release, and ``Warn`` through the whole pass (condition, ``status.drifted``, one event per drift)."""

from __future__ import annotations

from typing import Any

from stageset.controller.drift.registry import SELECTOR, DriftWatches
from stageset.controller.events import EventRecorder
from stageset.controller.identity import IdentityPolicy
from stageset.controller.kinds import GITREPOSITORIES, STAGESETS
from stageset.controller.metrics import Metrics
from stageset.controller.shared import Shared
from stageset.controller.stageset.setup import stageset_reconciler
from stageset.controller.targets.setup import clusters
from tests.inprocess.conftest import NS, TENANT, World, configmap
from tests.unit.test_drift_registry import Pool

CM = f"/api/v1/namespaces/{NS}/configmaps"


def wired(world: World) -> tuple[Pool, list[tuple[str, str]], Any]:
    """The world's reconciler again, now telling drift watches over a recording pool."""
    pool, queued = Pool(), []
    drift = DriftWatches(pool=pool, enqueue=lambda ns, name: queued.append((ns, name)))
    shared = Shared(
        clients=world.pool,
        settings=world.settings,
        metrics=Metrics(),
        clock=world.clock,
        events=EventRecorder(world.pool.client(), clock=world.clock),
        terminating=world.terminating,
    )
    world.reconciler = stageset_reconciler(
        shared,
        identities=IdentityPolicy(cluster_admin=False),
        store=world.sources,
        resource=STAGESETS,
        source_resource=GITREPOSITORIES,
        index=world.index,
        stop=world.stop,
        selected_by=world.selected_by,
        targets=clusters(shared),
        drift=drift,
    )
    return pool, queued, drift


def warnings(world: World, reason: str) -> list[dict[str, Any]]:
    return [o for p, o in world.cluster.objects.items() if "/events/" in p and o["reason"] == reason]


def test_a_pass_holds_the_watch_of_what_it_applied_as_the_tenant_and_suspend_lets_it_go(world: World) -> None:
    pool, _, drift = wired(world)
    world.commit({"app/a.json": configmap("a"), "app/b.json": configmap("b")})
    world.stageset("shop", [{"name": "app", "path": "./app"}])
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"
    [(key, held)] = pool.held.items()
    assert key[1] == TENANT
    assert key[2] == CM
    assert held.label_selector == SELECTOR
    newest = max(int(world.configmap(n)["metadata"]["resourceVersion"]) for n in ("a", "b"))  # type: ignore[index]
    assert held.resource_version == str(newest), "from where the pass left off: no list"
    assert drift.objects() == 2
    # Suspended: nothing is watched (an admin's edits while suspended are left alone).
    world.stageset("shop", [{"name": "app", "path": "./app"}], suspend=True)
    world.reconcile("shop")
    assert pool.held == {}
    assert drift.objects() == 0


def test_warn_through_the_whole_pass_reports_once_and_correct_restores(world: World) -> None:
    wired(world)
    world.commit({"app/a.json": configmap("a", "git")})
    world.stageset("shop", [{"name": "app", "path": "./app"}], driftDetection={"mode": "Warn"})
    world.reconcile("shop")
    world.cluster.edit(f"{CM}/a", lambda o: o.update(data={"k": "by hand"}))
    for _ in range(2):
        world.reconcile("shop")
    assert world.configmap("a")["data"] == {"k": "by hand"}  # type: ignore[index]
    status = world.get("shop")["status"]
    assert status["drifted"] == [{"stage": "app", "id": f"{NS}_a__ConfigMap", "fields": ["data.k"]}]
    [drifted] = [c for c in status["conditions"] if c["type"] == "Drifted"]
    assert drifted["reason"] == "DriftDetected"
    assert f"ConfigMap {NS}/a (data.k)" in drifted["message"]
    assert world.ready("shop")["status"] == "True"
    [event] = warnings(world, "DriftDetected")
    assert event["type"] == "Warning"
    assert warnings(world, "DriftCorrected") == []
    world.stageset("shop", [{"name": "app", "path": "./app"}], driftDetection={"mode": "Correct"})
    world.reconcile("shop")
    assert world.configmap("a")["data"] == {"k": "git"}  # type: ignore[index]
    status = world.get("shop")["status"]
    assert not status.get("drifted")
    assert not [c for c in status["conditions"] if c["type"] == "Drifted"]
    assert len(warnings(world, "DriftCorrected")) == 1
