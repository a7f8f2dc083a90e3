"""Readiness by watch: a bounded pool of selected watches, each as the identity that opened it.

A stage waiting for its objects to become ready used to read each of them every half second.
:class:`WatchPool` instead keeps one watch per (cluster, identity, kind, namespace, selector) —
label-selected for the objects a stage applied (its owner labels), field-selected by name for
the objects it only checks (``readyChecks.checks``) — and tells whoever listens when one of
them changes.  Each is a :class:`~stageset.kube.watch.Reflector`: list, then watch, relist on
410, resync.

Identity: every list and watch is made with the client handed to :meth:`WatchPool.watch`, bound
by the caller to the stage's identity (the tenant's ServiceAccount): a watch shows exactly
what that identity may list, scoped by the server to one namespace, one kind and the selector
— never a wider watch filtered here — and what it holds is only ever read back under the same
key, so nothing one identity saw reaches another.

Bounds: at most ``capacity`` watches at once (``--max-readiness-watches``); past that
:meth:`WatchPool.watch` answers ``None`` and the caller polls as before.  A watch nobody has
used for ``idle`` seconds is closed when room is needed, and listeners that were not renewed
within ``listener_ttl`` are dropped, so a StageSet that went away leaves nothing behind for
long.  Objects are kept per watch only while it lives.

**Held watches** (:meth:`WatchPool.hold`, :meth:`WatchPool.release`) are the other use: a watch
kept open for as long as someone holds it — drift detection holds one per (cluster, identity, kind,
namespace) that StageSets applied into (:mod:`stageset.controller.drift`) — and closed at once
when the last holder lets go (its stream shut down, its thread ended).  A held watch keeps no
objects: each event goes to its holders' handlers as it comes (metadata only by default, so no
Secret value passes through), and may start from a known ``resourceVersion`` instead of a list.
It is retried for as long as it is held (a refusal every few minutes at most; while a cluster
does not answer, one of its held watches probes it and the others wait:
:class:`~stageset.kube.watch.ClusterGate`), and says whether its last attempt worked
(:meth:`WatchPool.healthy`).  Held watches have no bound here: whoever
holds them bounds them (``--max-drift-watches``).  Same identity rule: a held watch is opened
with the client its first holder hands in, and joined only under the same key (cluster, identity,
collection, selectors).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from stageset.kube.client import KubeClient
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject
from stageset.kube.watch import ClusterGate, Handler, Listed, Reflector

log = logging.getLogger(__name__)

DEFAULT_CAPACITY = 100
HELD_RESYNC = 1800.0
"""Held watches list again this often (a backstop: an event a stream lost is seen by then)."""
HELD_READ_TIMEOUT = 150.0
"""A held stream silent for this long is dead (the apiserver sends a bookmark about every minute)."""
HELD_BACKOFF_CAP = 10.0
"""A held watch that fails (a cluster that is down) is tried again within this many seconds."""
HELD_DENIED_BACKOFF = 300.0
"""... and one refused (403, 404: the identity may not watch that kind there) every five minutes at most."""
WATCH_RESYNC = 120.0
"""Selected watches list again (and end their stream) this often: a closed one's thread ends by then."""

Key = tuple[str, str, str, str, str]  # (cluster, identity, collection path, label, field selector)


@dataclass
class _Listener:
    callback: Callable[[], None]
    renewed: float


@dataclass
class Watched:
    """One selected watch: the objects it holds (by name), whether its first list is done, and
    who listens for changes."""

    objects: dict[str, KubeObject] = field(default_factory=dict)
    synced: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    used: float = field(default_factory=time.monotonic)
    _listeners: dict[Hashable, _Listener] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, name: str) -> KubeObject | None:
        with self._lock:
            self.used = time.monotonic()
            return self.objects.get(name)

    def listen(self, key: Hashable, callback: Callable[[], None]) -> None:
        """Call ``callback`` on every change from now on (replacing ``key``'s earlier one)."""
        with self._lock:
            self.used = time.monotonic()
            self._listeners[key] = _Listener(callback, time.monotonic())

    def unlisten(self, key: Hashable) -> None:
        with self._lock:
            self._listeners.pop(key, None)

    def listeners(self, *, ttl: float) -> int:
        """How many listen, after dropping those not renewed within ``ttl`` seconds."""
        now = time.monotonic()
        with self._lock:
            for key in [k for k, v in self._listeners.items() if now - v.renewed > ttl]:
                del self._listeners[key]
            return len(self._listeners)

    def handle(self, event: str, obj: KubeObject) -> None:
        """A watch event: kept; listeners hear real changes only — not the first list, nor a
        relist's repeat of an object as it was."""
        name = str((obj.get("metadata") or {}).get("name", ""))
        with self._lock:
            before = self.objects.get(name)
            if event == "DELETED":
                self.objects.pop(name, None)
            else:
                self.objects[name] = obj
            same = before is not None and event != "DELETED" and \
                (before.get("metadata") or {}).get("resourceVersion") == \
                (obj.get("metadata") or {}).get("resourceVersion")
            if same or not self.synced.is_set():
                return
            callbacks = [listener.callback for listener in self._listeners.values()]
        for callback in callbacks:
            try:
                callback()
            except Exception:  # a listener's failure is its own: the watch goes on
                log.exception("a readiness listener failed")


@dataclass
class _Held:
    """One held watch: its reflector, its holders (each with its handler) and its last word."""

    handlers: dict[Hashable, tuple[Handler, Listed | None]]
    reflector: Reflector | None = None
    healthy: bool | None = None
    """Whether its last list or stream worked (``None``: not known yet)."""


class WatchPool:
    def __init__(self, *, capacity: int = DEFAULT_CAPACITY, idle: float = 60.0, listener_ttl: float = 300.0,
                 resync: float = WATCH_RESYNC, on_refused: Callable[[], None] | None = None):
        self._capacity = capacity
        self._on_refused = on_refused
        self._idle = idle
        self._ttl = listener_ttl
        self._resync = resync
        self._watches: dict[Key, Watched] = {}
        self._held: dict[Key, _Held] = {}
        self._gates: dict[str, ClusterGate] = {}
        """One per cluster: while it does not answer, one held watch probes it, the others wait."""
        self._lock = threading.Lock()
        self.refused = 0
        """Watches asked for while the pool was full (the caller polled instead)."""

    def __len__(self) -> int:
        with self._lock:
            return len(self._watches)

    def watch(self, client: KubeClient, resource: Resource, namespace: str | None, *,
              label_selector: str = "", field_selector: str = "", existing_only: bool = False
              ) -> Watched | None:
        """The watch of ``resource`` in ``namespace`` matching the selectors, as ``client``'s
        identity (opened now if needed, unless ``existing_only``); ``None`` when the pool is full."""
        key: Key = (client.cluster.name, client.identity.user or "", resource.collection_path(namespace),
                    label_selector, field_selector)
        with self._lock:
            found = self._watches.get(key)
            if found is not None:
                found.used = time.monotonic()
                return found
            if existing_only:
                return None
            if len(self._watches) >= self._capacity:
                self._reap()
            if len(self._watches) >= self._capacity:
                self.refused += 1
                if self._on_refused is not None:
                    self._on_refused()
                return None
            watched = Watched()
            self._watches[key] = watched
        reflector = Reflector(client=client, resource=resource, namespace=namespace, handler=watched.handle,
                              stop=watched.stop, resync=self._resync, label_selector=label_selector,
                              field_selector=field_selector)
        watched.synced = reflector.synced  # set once the first list is in
        threading.Thread(target=reflector.run, name=f"ready-{resource.plural}", daemon=True).start()
        return watched

    def _reap(self) -> None:
        """Close watches nobody listens to and nobody used for ``idle`` seconds (lock held)."""
        now = time.monotonic()
        for key, watched in list(self._watches.items()):
            if watched.listeners(ttl=self._ttl) == 0 and now - watched.used > self._idle:
                watched.stop.set()
                del self._watches[key]

    # -- held watches ------------------------------------------------------------------------

    @staticmethod
    def key(client: KubeClient, resource: Resource, namespace: str | None, *, label_selector: str = "",
            field_selector: str = "") -> Key:
        """The key a watch of ``resource`` in ``namespace`` with these selectors, as ``client``'s
        identity, is kept under (held or not)."""
        return (client.cluster.name, client.identity.user or "", resource.collection_path(namespace),
                label_selector, field_selector)

    def hold(self, holder: Hashable, client: KubeClient, resource: Resource, namespace: str | None, *,
             handler: Handler, listed: Listed | None = None, label_selector: str = "",
             field_selector: str = "", resource_version: str = "", metadata_only: bool = True) -> Key:
        """Hold the watch of ``resource`` in ``namespace`` matching the selectors, as ``client``'s
        identity: opened now (from ``resource_version`` when given, else listed first) or joined;
        ``handler`` hears its every event from now on, ``listed`` the keys each list found.  A
        holder that holds it already only replaces its handlers.  Returns the watch's key."""
        key = self.key(client, resource, namespace, label_selector=label_selector,
                       field_selector=field_selector)
        with self._lock:
            found = self._held.get(key)
            if found is not None:
                found.handlers[holder] = (handler, listed)
                return key
            held = _Held(handlers={holder: (handler, listed)})
            reflector = held.reflector = Reflector(
                client=client, resource=resource, namespace=namespace, stop=threading.Event(),
                handler=lambda event, obj: self._dispatch(held, event, obj),
                listed=lambda keys: self._listed(held, keys), health=lambda ok: self._health(held, ok),
                resync=HELD_RESYNC, label_selector=label_selector, field_selector=field_selector,
                metadata_only=metadata_only, resource_version=resource_version,
                read_timeout=HELD_READ_TIMEOUT, backoff_cap=HELD_BACKOFF_CAP,
                denied_backoff=HELD_DENIED_BACKOFF, gate=self._gates.setdefault(key[0], ClusterGate()))
            self._held[key] = held
        threading.Thread(target=reflector.run, name=f"held-{resource.plural}", daemon=True).start()
        return key

    def release(self, holder: Hashable, key: Key, *, drain: bool = False) -> None:
        """``holder`` no longer needs the watch ``key``: closed at once when nobody else holds it —
        or, with ``drain``, left to end when the server ends its stream (a namespace being deleted:
        no request, not even a close, goes there any more; :meth:`Reflector.drain`)."""
        with self._lock:
            found = self._held.get(key)
            if found is None:
                return
            found.handlers.pop(holder, None)
            if found.handlers:
                return
            del self._held[key]
        if found.reflector is not None:
            if drain:
                found.reflector.drain()
            else:
                found.reflector.close()

    def held(self) -> int:
        """How many held watches are open."""
        with self._lock:
            return len(self._held)

    def healthy(self, key: Key) -> bool | None:
        """Whether the held watch ``key`` worked at its last attempt (``None``: not held, or not known)."""
        with self._lock:
            found = self._held.get(key)
            return None if found is None else found.healthy

    def _handlers(self, held: _Held) -> list[tuple[Handler, Listed | None]]:
        with self._lock:
            return list(held.handlers.values())

    def _dispatch(self, held: _Held, event: str, obj: KubeObject) -> None:
        for handler, _ in self._handlers(held):
            try:
                handler(event, obj)
            except Exception:  # a holder's failure is its own: the watch goes on
                log.exception("a held watch's handler failed")

    def _listed(self, held: _Held, keys: set[tuple[str, str]]) -> None:
        for _, listed in self._handlers(held):
            if listed is not None:
                try:
                    listed(keys)
                except Exception:
                    log.exception("a held watch's list handler failed")

    def _health(self, held: _Held, ok: bool) -> None:
        held.healthy = ok

    def close(self) -> None:
        with self._lock:
            for watched in self._watches.values():
                watched.stop.set()
            self._watches.clear()
            held, self._held = list(self._held.values()), {}
        for found in held:
            if found.reflector is not None:
                found.reflector.close()
