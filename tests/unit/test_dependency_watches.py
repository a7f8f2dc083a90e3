"""The watches that wake StageSets waiting for objects of other kinds
(``stageset.controller.stageset.dependencywatches``) over a recording pool: one held watch per
cluster, identity, kind and namespace, ref-counted by the StageSets waiting, a wake only for a change
the StageSet's pass did not see, and the bounds.  The real pool against a real apiserver:
tests/e2e/test_object_dependencies.py."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from stageset.controller.stageset.dependencywatches import DependencyWatches, WatchKey, watch_key
from stageset.kube.client import LOCAL, Identity, KubeClient
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject

DATABASES = Resource(group="db.example", version="v1", kind="Database", plural="databases", namespaced=True)
CACHES = Resource(group="db.example", version="v1", kind="Cache", plural="caches", namespaced=True)


class Client:
    """What the watches ask of a client: its cluster and identity (no request is made here)."""

    def __init__(self, user: str | None) -> None:
        self.identity = Identity(user=user)
        self.cluster = LOCAL


TENANT = Client("system:serviceaccount:shop:deployer")
OTHER = Client("system:serviceaccount:shop:reader")


def client(c: Client) -> KubeClient:
    return c  # type: ignore[return-value]


@dataclass
class Pool:
    """Held watches, recorded: who holds which key, and each one's handler."""

    held: dict[WatchKey, dict[Hashable, Callable[[str, KubeObject], None]]] = field(default_factory=dict)
    opened: list[WatchKey] = field(default_factory=list)
    released: list[WatchKey] = field(default_factory=list)
    health: dict[WatchKey, bool | None] = field(default_factory=dict)

    def hold(self, holder: Hashable, client: KubeClient, resource: Resource, namespace: str | None, *,
             handler: Callable[[str, KubeObject], None], metadata_only: bool = True) -> WatchKey:
        assert metadata_only
        key = (client.cluster.name, client.identity.user or "", resource.collection_path(namespace), "", "")
        if key not in self.held:
            self.opened.append(key)
        self.held.setdefault(key, {})[holder] = handler
        return key

    def release(self, holder: Hashable, key: WatchKey) -> None:
        self.held[key].pop(holder)
        if not self.held[key]:
            del self.held[key]
            self.released.append(key)

    def healthy(self, key: WatchKey) -> bool | None:
        return self.health.get(key)

    def event(self, key: WatchKey, name: str, version: str, kind: str = "MODIFIED") -> None:
        for handler in list(self.held[key].values()):
            handler(kind, {"metadata": {"name": name, "namespace": "shop", "resourceVersion": version}})


class Ticks:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def setup(**bounds: Any) -> tuple[Pool, DependencyWatches, list[tuple[str, str]], Ticks]:
    pool, woken, ticks = Pool(), [], Ticks()
    watches = DependencyWatches(pool=pool, wake=lambda ns, name: woken.append((ns, name)), ticks=ticks,
                                **bounds)
    return pool, watches, woken, ticks


DB_KEY = watch_key(client(TENANT), DATABASES, "shop")


def test_one_watch_per_identity_kind_and_namespace_shared_by_the_stagesets_waiting() -> None:
    pool, watches, _, ticks = setup()
    assert watches.wait(("shop", "a"), client(TENANT), DATABASES, "shop", "db", seen="5", asked=ticks.now)
    assert watches.wait(("shop", "b"), client(TENANT), DATABASES, "shop", "cache", seen=None, asked=ticks.now)
    assert pool.opened == [DB_KEY] == list(pool.held)
    assert DB_KEY == ("local", "system:serviceaccount:shop:deployer",
                      "/apis/db.example/v1/namespaces/shop/databases", "", "")
    # Another identity never joins it: a watch of its own.
    assert watches.wait(("shop", "c"), client(OTHER), DATABASES, "shop", "db", seen="5", asked=ticks.now)
    assert len(pool.opened) == 2
    assert len(watches) == 2


def test_released_when_the_last_stageset_stops_waiting_and_not_before() -> None:
    pool, watches, _, ticks = setup()
    watches.wait(("shop", "a"), client(TENANT), DATABASES, "shop", "db", seen="5", asked=ticks.now)
    watches.wait(("shop", "b"), client(TENANT), DATABASES, "shop", "db", seen="5", asked=ticks.now)
    watches.stop(("shop", "a"))
    assert pool.released == []
    watches.forget("shop", "b")
    assert pool.released == [DB_KEY]
    assert not pool.held
    assert len(watches) == 0
    watches.stop(("shop", "b"))  # twice: nothing more
    assert pool.released == [DB_KEY]


def test_waiting_again_on_the_same_watch_keeps_it_open_and_a_new_one_releases_the_old() -> None:
    pool, watches, _, ticks = setup()
    ref = ("shop", "a")
    watches.wait(ref, client(TENANT), DATABASES, "shop", "db", seen="5", asked=ticks.now)
    watches.wait(ref, client(TENANT), DATABASES, "shop", "db", seen="6", asked=ticks.now)
    assert pool.opened == [DB_KEY]
    assert pool.released == []
    watches.wait(ref, client(TENANT), CACHES, "shop", "c", seen=None, asked=ticks.now)
    assert pool.released == [DB_KEY]
    assert watches.waiting(ref) == (watch_key(client(TENANT), CACHES, "shop"), "c")


def test_a_change_wakes_only_the_stagesets_waiting_for_that_name_at_another_version() -> None:
    pool, watches, woken, ticks = setup()
    watches.wait(("shop", "a"), client(TENANT), DATABASES, "shop", "db", seen="5", asked=ticks.now)
    watches.wait(("shop", "b"), client(TENANT), DATABASES, "shop", "other", seen="7", asked=ticks.now)
    pool.event(DB_KEY, "db", "5", kind="ADDED")  # the watch's first list: as the pass saw it
    assert woken == []
    pool.event(DB_KEY, "unrelated", "9")
    assert woken == []
    pool.event(DB_KEY, "db", "8")
    assert woken == [("shop", "a")]
    pool.event(DB_KEY, "db", "8", kind="ADDED")  # a relist's repeat of what woke it
    assert woken == [("shop", "a")]


def test_an_absent_object_wakes_its_stageset_when_it_appears() -> None:
    pool, watches, woken, ticks = setup()
    watches.wait(("shop", "a"), client(TENANT), DATABASES, "shop", "db", seen=None, asked=ticks.now)
    pool.event(DB_KEY, "db", "3", kind="ADDED")
    assert woken == [("shop", "a")]


def test_a_change_between_the_read_and_the_registration_is_not_lost() -> None:
    pool, watches, woken, ticks = setup()
    # Another StageSet keeps the watch open; "a" reads db at version 5 (at t=100) ...
    watches.wait(("shop", "b"), client(TENANT), DATABASES, "shop", "cache", seen="1", asked=ticks.now)
    asked = ticks.now
    ticks.now += 0.01
    pool.event(DB_KEY, "db", "6")  # ... db turns ready before "a" says it waits for it
    assert woken == []
    watches.wait(("shop", "a"), client(TENANT), DATABASES, "shop", "db", seen="5", asked=asked)
    assert woken == [("shop", "a")]
    # A change from before the read is what the read saw: no wake.
    ticks.now += 1
    watches.wait(("shop", "c"), client(TENANT), DATABASES, "shop", "db", seen="6", asked=ticks.now)
    assert woken == [("shop", "a")]


def test_bounds_total_and_per_identity_then_the_stageset_is_not_watched() -> None:
    pool, watches, _, ticks = setup(capacity=3, per_identity=2)
    assert watches.wait(("shop", "a"), client(TENANT), DATABASES, "shop", "db", seen=None, asked=ticks.now)
    assert watches.wait(("shop", "b"), client(TENANT), CACHES, "shop", "c", seen=None, asked=ticks.now)
    assert not watches.wait(("shop", "c"), client(TENANT), DATABASES, "other", "db", seen=None,
                            asked=ticks.now)
    assert watches.waiting(("shop", "c")) is None
    # An existing watch may still be joined at the bound.
    assert watches.wait(("shop", "d"), client(TENANT), DATABASES, "shop", "x", seen=None, asked=ticks.now)
    assert watches.wait(("shop", "e"), client(OTHER), DATABASES, "shop", "db", seen=None, asked=ticks.now)
    assert not watches.wait(("shop", "f"), client(OTHER), CACHES, "shop", "db", seen=None, asked=ticks.now)
    assert len(pool.held) == 3


def test_whether_the_watch_worked_is_told_for_the_message() -> None:
    pool, watches, _, ticks = setup()
    assert watches.watched(("shop", "a")) is None
    watches.wait(("shop", "a"), client(TENANT), DATABASES, "shop", "db", seen=None, asked=ticks.now)
    assert watches.watched(("shop", "a")) is None  # not known yet
    pool.health[DB_KEY] = False  # 403 on list/watch
    assert watches.watched(("shop", "a")) is False


def test_close_releases_everything() -> None:
    pool, watches, _, ticks = setup()
    watches.wait(("shop", "a"), client(TENANT), DATABASES, "shop", "db", seen=None, asked=ticks.now)
    watches.wait(("shop", "b"), client(OTHER), CACHES, "shop", "db", seen=None, asked=ticks.now)
    watches.close()
    assert not pool.held
    assert len(watches) == 0
