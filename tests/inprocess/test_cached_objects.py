"""A reconcile never changes the object it is handed: the watch cache's objects are shared with the
watch and the next reconcile, and read-only (as in controller-runtime and kopf)."""

from __future__ import annotations

import copy
import json
import threading
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stageset.controller.gitrepository import GitRepositoryReconciler
from stageset.controller.identity import IdentityPolicy
from stageset.controller.kinds import GITREPOSITORIES
from stageset.controller.manager import Manager
from stageset.controller.result import Result
from stageset.controller.settings import ControllerSettings
from stageset.kube.types import KubeObject
from tests.inprocess.conftest import NS, URL, World, configmap, deployment, stageset_path
from tests.inprocess.test_manager import eventually, is_ready
from tests.inprocess.test_stageset_reconciler import remote_world


def held(world: World, path: str, reconcile: Callable[[KubeObject], Result]) -> tuple[KubeObject, Result]:
    """Reconcile the object at ``path`` as the cache holds it; fail if the reconcile changed it."""
    cached = world.cluster.get(path)
    assert cached is not None
    before = copy.deepcopy(cached)
    result = reconcile(cached)
    assert cached == before, "the reconcile changed the object it was handed"
    return cached, result


def test_a_stagesets_whole_life_leaves_every_object_it_was_handed_as_it_was(world: World) -> None:
    world.commit({"app/web.json": deployment("web"), "app/old.json": configmap("old"),
                  "keep/cm.json": configmap("kept")})
    world.stageset("shop", [{"name": "app", "path": "./app", "timeout": "60s"},
                            {"name": "keep", "path": "./keep", "prune": False}])
    path = stageset_path("shop")

    def step(**expected: Any) -> KubeObject:
        cached, _ = held(world, path, world.reconciler.reconcile)
        assert world.get("shop") != cached, "the pass wrote (status, record or finalizer)"
        assert {k: world.ready("shop")[k] for k in expected} == expected
        return cached

    step(reason="Progressing")                     # finalizer, record, announce, waiting
    world.clock.advance(30)
    held(world, path, world.reconciler.reconcile)  # a re-check: nothing written, nothing changed
    world.roll_out("web")
    world.commit({"app/web.json": deployment("web"), "keep/cm.json": configmap("kept")})
    step(status="True")                            # applied, pruned, record settled
    assert world.configmap("old") is None
    with world.cluster._lock:
        world.cluster.objects[path]["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    for _ in range(4):                             # teardown: status per stage, release, finalizer
        _, result = held(world, path, world.reconciler.reconcile)
        if result.requeue_after is None:
            break
    assert world.cluster.get(path) is None
    assert world.configmap("kept") is not None, "prune: false is released, not deleted"


@pytest.mark.parametrize(("stage", "spec", "reason"), [("app", {"suspend": True}, "Suspended"),
                                                       ("Not A Label", {}, "InvalidSpec")])
def test_a_short_reconcile_leaves_it_too(world: World, stage: str, spec: dict[str, Any], reason: str) -> None:
    world.commit({"app/cm.json": configmap("a")})
    world.stageset("shop", [{"name": stage, "path": "./app"}], **spec)
    held(world, stageset_path("shop"), world.reconciler.reconcile)
    assert world.ready("shop")["reason"] == reason


def test_a_failing_remote_cluster_leaves_it_too(world: World) -> None:
    from stageset.kube.client import UnreachableError

    remote = remote_world(world)
    world.reconcile("shop")
    remote.down = UnreachableError(server="https://prod.example:6443", why="connection refused")
    world.reconciler = world.make_reconciler()
    world.commit({"app/cm.json": configmap("remote", "v2")})
    _, result = held(world, stageset_path("shop"), world.reconciler.reconcile)
    assert result.backoff


def test_a_gitrepository_reconcile_leaves_it_too(world: World) -> None:
    world.sources.commit(URL, {"cm.json": "{}"})
    world.cluster.put({"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
                       "metadata": {"name": "app", "namespace": NS}, "spec": {"url": URL}})
    written: list[KubeObject] = []
    git = GitRepositoryReconciler(clients=world.pool, store=world.sources, resource=GITREPOSITORIES,
                                  on_revision=lambda *_: None, identities=IdentityPolicy(cluster_admin=False),
                                  clock=world.clock, on_write=written.append)
    held(world, GITREPOSITORIES.object_path(name="app", namespace=NS), git.reconcile)
    # The object as written reaches the listener instead (the manager's view until the watch catches up).
    [after] = written
    assert after["status"]["artifact"]["revision"] == world.sources.revision(URL)
    live = world.cluster.get(GITREPOSITORIES.object_path(name="app", namespace=NS)) or {}
    assert after["metadata"]["resourceVersion"] == live["metadata"]["resourceVersion"]


class Recording(dict[Any, KubeObject]):
    """The manager's cache, keeping a copy of each object as it was stored."""

    def __init__(self) -> None:
        super().__init__()
        self.stored: list[tuple[KubeObject, KubeObject]] = []
        self._lock = threading.Lock()

    def __setitem__(self, key: Any, obj: KubeObject) -> None:
        with self._lock:
            self.stored.append((obj, copy.deepcopy(obj)))
        super().__setitem__(key, obj)


@pytest.fixture
def manager(world: World) -> Iterator[Manager]:
    manager = Manager(clients=world.pool, store=world.sources, clock=world.clock,
                      settings=ControllerSettings(readiness_slice=0.0, readiness_requeue=0.05))
    manager.cache.objects = Recording()
    thread = threading.Thread(target=manager.run, daemon=True)
    thread.start()
    yield manager
    manager.stop.set()
    thread.join(timeout=10)


def test_the_managers_cache_is_never_changed_by_the_reconciles_it_feeds(world: World, manager: Manager
                                                                        ) -> None:
    world.commit({"app/cm.json": configmap("a"), "web/d.json": deployment("web")})
    world.stageset("shop", [{"name": "app", "path": "./app"}, {"name": "web", "path": "./web"}])
    eventually(lambda: world.phases("shop").get("web") == "Waiting", what="web waiting")
    world.roll_out("web")
    eventually(lambda: is_ready(world, "shop"), what="StageSet Ready")
    stored = manager.cache.objects.stored  # type: ignore[attr-defined]
    # The cache holds each object as compressed JSON bytes: immutable, so no reconcile can change
    # it (each gets a copy parsed from them).
    assert all(isinstance(raw, bytes) for raw, _ in stored)
    parsed = [json.loads(zlib.decompress(raw)) for raw, _ in stored]
    kinds = {obj.get("kind") for obj in parsed}
    assert kinds == {"StageSet", "GitRepository"}  # the evidence: both kinds went through the cache
    assert len([o for o in parsed if o.get("kind") == "StageSet"]) >= 4
    changed = [obj["metadata"]["name"] for obj, (raw, copied) in zip(parsed, stored, strict=True)
               if raw != copied]
    assert changed == [], "a reconcile changed an object in the watch cache"
