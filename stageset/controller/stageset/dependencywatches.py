"""The watches that wake a StageSet waiting for an object of another kind it names in ``spec.dependsOn``.

While a pass ends waiting for such an object (absent, not ready, its ``readyExpr`` false:
:mod:`~stageset.controller.stageset.objectdeps`), the StageSet is listed here as waiting for that
name, and one watch per (cluster, identity, kind, namespace) — a held watch of the shared pool
(:meth:`stageset.kube.watches.WatchPool.hold`), metadata only — tells it when the object changes:
its StageSet is queued at once (``wake``), so it starts within a moment of the object turning
ready, not at its ``retryInterval``.

Invariants:

- **Ref-counted.** A watch is held while at least one StageSet waits for an object it covers, and
  released the moment the last one stops waiting (its dependency turned ready, its spec changed,
  it was suspended or deleted: :meth:`DependencyWatches.stop`), which closes it at once unless
  another feature of the controller holds the same watch.  A StageSet waits for one object at a
  time (the first in ``spec.dependsOn`` that is not ready).
- **No wake is lost, none is repeated for nothing.**  Each waiter remembers the ``resourceVersion``
  its pass judged (``None``: absent); an event for that name at another version wakes it (and
  becomes what it remembers), the same version (a list's or relist's repeat) does not.  An event
  that came between the pass's read and its registration here is found in the watch's short memory
  of recent changes (:data:`RECENT`, name -> version and when) and wakes it at once.
- **Bounded.** At most ``capacity`` watches (``--max-dependency-watches``) and
  :data:`PER_IDENTITY` per identity (one tenant cannot take every slot); past either, the StageSet
  is not watched and looks again at its ``retryInterval`` (:meth:`DependencyWatches.wait` answers
  ``False``).  Memory: per watch, its waiters and at most :data:`RECENT` names.

Identity: every watch is opened with the client the pass hands in — the StageSet's identity
(its ServiceAccount, impersonated; the controller only in cluster-admin mode without one), the
same that read the object — so a watch shows exactly what that identity may list and watch, and a
waiter only ever joins a watch of its own identity (the pool's key holds it).  Metadata only: no
spec, status or Secret data passes through here; the pass reads the object again when woken.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Protocol

from stageset.kube.client import KubeClient
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject

log = logging.getLogger(__name__)

Ref = tuple[str, str]  # (namespace, name) of a StageSet
WatchKey = tuple[str, str, str, str, str]  # the pool's: (cluster, identity, collection path, labels, fields)
Wake = Callable[[str, str], None]

DEFAULT_CAPACITY = 100
"""Dependency watches at once (``--max-dependency-watches``): each is a thread and a connection, and
about 145 KiB of the controller's memory (measured for held watches by issue 45)."""
PER_IDENTITY = 16
"""Dependency watches one identity may hold at once (kinds and namespaces its StageSets wait in)."""
RECENT = 256
"""Names whose last change each watch remembers (for a change that came while a pass registered)."""


class HeldWatches(Protocol):
    """Held watches as an identity (:class:`stageset.kube.watches.WatchPool`)."""

    def hold(self, holder: Hashable, client: KubeClient, resource: Resource, namespace: str | None, *,
             handler: Callable[[str, KubeObject], None], metadata_only: bool = True) -> WatchKey: ...

    def release(self, holder: Hashable, key: WatchKey) -> None: ...

    def healthy(self, key: WatchKey) -> bool | None: ...


def watch_key(client: KubeClient, resource: Resource, namespace: str | None) -> WatchKey:
    """The pool's key of the unselected watch of ``resource`` in ``namespace`` as ``client``'s identity."""
    return (client.cluster.name, client.identity.user or "", resource.collection_path(namespace), "", "")


@dataclass
class _Watch:
    """One held watch: who waits for which name (and the version each last judged), recent changes."""

    waiters: dict[Ref, list[str | None]] = field(default_factory=dict)
    """StageSet -> [name, resourceVersion its pass judged (``None``: absent)]."""
    recent: OrderedDict[str, tuple[str, float]] = field(default_factory=OrderedDict)


class DependencyWatches:
    """Which StageSets wait for which objects, and the held watches that wake them.  Thread-safe."""

    def __init__(self, *, pool: HeldWatches, wake: Wake, capacity: int = DEFAULT_CAPACITY,
                 per_identity: int = PER_IDENTITY, ticks: Callable[[], float] = time.monotonic):
        self._pool = pool
        self._wake = wake
        self._capacity = capacity
        self._per_identity = per_identity
        self._ticks = ticks
        self._lock = threading.Lock()
        self._watches: dict[WatchKey, _Watch] = {}
        self._waiting: dict[Ref, WatchKey] = {}

    def __len__(self) -> int:
        """Watches held now."""
        with self._lock:
            return len(self._watches)

    def waiting(self, ref: Ref) -> tuple[WatchKey, str] | None:
        """What StageSet ``ref`` waits for now: (watch, name); ``None``: nothing."""
        with self._lock:
            key = self._waiting.get(ref)
            if key is None:
                return None
            name = self._watches[key].waiters[ref][0]
            return key, str(name)

    def wait(self, ref: Ref, client: KubeClient, resource: Resource, namespace: str | None, name: str, *,
             seen: str | None, asked: float) -> bool:
        """StageSet ``ref`` now waits for object ``name`` (as ``client``'s identity), judged at version
        ``seen`` (``None``: absent) by a read that started at ``asked`` (``ticks``).  Replaces what it
        waited for before.  ``False``: not watched (a bound was reached): it looks again at its retry."""
        key = watch_key(client, resource, namespace)
        missed = False
        with self._lock:
            self._leave(ref, keep=key)
            watch = self._watches.get(key)
            if watch is None:
                if not self._room(key):
                    log.info("not watching %s for StageSet %s/%s: at the bound of dependency watches "
                             "(%d, %d per identity); it looks again at its retryInterval", key[2], *ref,
                             self._capacity, self._per_identity)
                    return False
                watch = self._watches[key] = _Watch()
                held = self._pool.hold(self, client, resource, namespace,
                                       handler=lambda _event, obj: self._handle(key, obj), metadata_only=True)
                assert held == key, (held, key)  # the pool keys watches as watch_key does
            watch.waiters[ref] = [name, seen]
            self._waiting[ref] = key
            recent = watch.recent.get(name)
            if recent is not None and recent[0] != seen and recent[1] >= asked:
                watch.waiters[ref][1] = recent[0]
                missed = True
        if missed:
            self._wake(*ref)
        return True

    def watched(self, ref: Ref) -> bool | None:
        """Whether the watch StageSet ``ref`` waits on worked at its last attempt (``None``: not known
        yet, or it waits for nothing): ``False`` when its identity may not list or watch there."""
        with self._lock:
            key = self._waiting.get(ref)
        return None if key is None else self._pool.healthy(key)

    def stop(self, ref: Ref) -> None:
        """StageSet ``ref`` waits for nothing (any more): its watch is released when nobody else waits."""
        with self._lock:
            self._leave(ref)

    def forget(self, namespace: str, name: str) -> None:
        """The StageSet is gone."""
        self.stop((namespace, name))

    def close(self) -> None:
        with self._lock:
            for key in list(self._watches):
                self._pool.release(self, key)
            self._watches.clear()
            self._waiting.clear()

    def _room(self, key: WatchKey) -> bool:
        """Whether one more watch fits the bounds (lock held)."""
        if len(self._watches) >= self._capacity:
            return False
        same = sum(1 for other in self._watches if other[:2] == key[:2])
        return same < self._per_identity

    def _leave(self, ref: Ref, *, keep: WatchKey | None = None) -> None:
        """Drop ``ref``'s waiting (lock held); release a watch nobody waits on, unless it is ``keep``
        (about to be waited on again: never closed and reopened in between)."""
        key = self._waiting.pop(ref, None)
        if key is None:
            return
        watch = self._watches.get(key)
        if watch is None:
            return
        watch.waiters.pop(ref, None)
        if not watch.waiters and key != keep:
            del self._watches[key]
            self._pool.release(self, key)

    def _handle(self, key: WatchKey, obj: KubeObject) -> None:
        """An event of watch ``key`` (metadata only): wake the StageSets waiting for that name whose
        pass judged another version of it."""
        meta = obj.get("metadata") or {}
        name, version = str(meta.get("name", "")), str(meta.get("resourceVersion", ""))
        woken: list[Ref] = []
        with self._lock:
            watch = self._watches.get(key)
            if watch is None:
                return
            watch.recent[name] = (version, self._ticks())
            watch.recent.move_to_end(name)
            while len(watch.recent) > RECENT:
                watch.recent.popitem(last=False)
            for ref, waited in watch.waiters.items():
                if waited[0] == name and waited[1] != version:
                    waited[1] = version
                    woken.append(ref)
        for ref in woken:
            log.debug("%s changed: waking StageSet %s/%s", name, *ref)
            self._wake(*ref)
