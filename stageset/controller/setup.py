"""What a reconciler declares to the manager: its kind, what it watches and which events queue which keys.

As controller-runtime's ``SetupWithManager``: a :class:`Controller` is ``For`` one kind (the
manager lists, watches and caches it, and queues the object's own key when its
:attr:`~Controller.trigger` changes) and ``Watches`` kinds other controllers are ``For`` with a
mapping from the watched object's key to the keys to queue (:class:`Watch`).  Work that is no
reconcile is declared too: :class:`Jobs` (a runner of :class:`~stageset.controller.keys.JobKey`
work in a controller's pool) and :class:`Reports` (objects watched under another label selector,
each event mapped to a :class:`~stageset.controller.keys.ReportKey` written about it).  Event
sources the manager does not run (discovery-driven watches, download jobs that end) queue keys
through the :data:`Enqueue` they are given; a :class:`Runnable` is started with the watches (and,
declared :class:`Synced`, waited for with them before any worker starts).  A
:class:`Guard` declared on a controller sees each watch event of its kind first and runs around
each of its reconciles (the label shards' hand-off, :mod:`stageset.controller.handoff`).

The manager knows no kind by name: it runs what a :class:`Setup` declares
(:mod:`stageset.controller.wiring` builds it; each reconciler module says its own part).

Invariants: a state function is pure and cheap (it runs on every watch event, under the cache's
lock); a mapping returns keys only (it never queues or blocks); a watched kind is one some
controller is ``For`` (the manager refuses a setup that is not).

Identity: none; declarations make no request.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from stageset.controller.keys import JobKey, ObjectKey, ReportKey, WorkKey
from stageset.controller.result import Result
from stageset.controller.status import requested_at
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject

Enqueue = Callable[[WorkKey], None]
"""Queue a key (in the pool its type and kind or runner name)."""
State = Callable[[KubeObject], Any]
"""What of an object a watch compares between two events (compared with ``!=``)."""
Mapping = Callable[[ObjectKey], Iterable[ObjectKey]]
"""From the key of a watched object to the keys to queue."""


class Event(StrEnum):
    """A watch event's type, as the apiserver spells it."""

    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


class Reconciler(Protocol):
    def reconcile(self, raw: KubeObject) -> Result:
        """Reconcile ``raw`` (from the watch cache: read, never changed)."""
        ...


class Runnable(Protocol):
    def start(self) -> threading.Thread:
        """Start (a daemon thread that ends once the manager's stop event is set)."""
        ...


class Synced(Runnable, Protocol):
    """A runnable watch whose first complete list a reconcile depends on (it fills an index the
    reconciles read): set once it has listed."""

    synced: threading.Event


class Guard(Protocol):
    """Around a controller's reconciles, and told each watch event of its kind before anything else
    is (the cache, the indexes, the triggers): what may stop or hold a reconcile because of what
    the watch saw — with label shards, the hand-off (:class:`~stageset.controller.handoff.ShardHandoff`)
    fences a pass whose object left the shard and holds the first write of one that arrived."""

    def observe(self, key: ObjectKey, event: Event, obj: KubeObject, *, known: bool) -> None:
        """A watch event of the controller's kind (``known``: the key was in the cache before it)."""
        ...

    def run(self, key: ObjectKey, obj: KubeObject, reconcile: Callable[[KubeObject], Result]) -> Result:
        """One reconcile of ``key``: ``reconcile(obj)`` under the guard, or a result without it."""
        ...


@dataclass(frozen=True)
class Predicate:
    """Which transitions of a watched state queue the mapped keys (controller-runtime's predicate
    functions): the object first seen, its state changed, a seen object gone."""

    create: bool
    update: bool
    delete: bool

    def fires(self, before: Any | None, now: Any | None) -> bool:
        """``before``/``now``: the state at the last and at this event (``None``: not there)."""
        if now is None:
            return self.delete and before is not None
        if before is None:
            return self.create
        return self.update and before != now


CREATED_OR_CHANGED = Predicate(create=True, update=True, delete=False)
"""A controller's own trigger: a deletion needs no reconcile (a finalizer's deletion is a change)."""
ANY_CHANGE = Predicate(create=True, update=True, delete=True)
CHANGED_OR_GONE = Predicate(create=False, update=True, delete=True)
"""For what others wait on: its first sight tells nothing new (they read it when they run)."""


def reconcile_trigger(obj: KubeObject) -> tuple[Any, ...]:
    """What, when changed, calls for a reconcile of any of our kinds: the spec (generation), a
    ``requestedAt`` annotation, a deletion.  Status writes alone do not."""
    metadata = obj.get("metadata", {})
    return metadata.get("generation"), requested_at(obj), bool(metadata.get("deletionTimestamp"))


@dataclass(frozen=True)
class Watch:
    """``Watches(kind, mapping)``: an event of ``kind`` whose :attr:`state` moved as :attr:`fires`
    says queues :attr:`keys` of the watched object's key."""

    kind: str
    state: State
    fires: Predicate
    keys: Mapping


@dataclass(frozen=True)
class Controller:
    """``For(resource)`` with its own trigger, ``Watches`` and the indexes its watch feeds."""

    resource: Resource
    reconciler: Reconciler
    workers: int
    """The size of this controller's pool (named after its kind, as its metrics are)."""
    trigger: State
    """What of the object, when changed (or first seen), queues its own key (:data:`CREATED_OR_CHANGED`)."""
    watches: tuple[Watch, ...] = ()
    indexed: Callable[[Event, ObjectKey, KubeObject], None] | None = None
    """Told every event of this kind before any key is queued for it (indexes the reconcile reads,
    such as the StageSets' dependency graph); also where a controller forgets a deleted object."""
    guard: Guard | None = None
    """Sees every event of this kind first and runs around every reconcile (:class:`Guard`)."""
    namespaces: tuple[str, ...] | None = None
    """Watched in these namespaces (one list/watch each, without the shard's label selector)
    instead of the manager's: a platform kind that lives only where the platform keeps it."""

    @property
    def kind(self) -> str:
        return self.resource.kind


@dataclass(frozen=True)
class Jobs:
    """Jobs of :attr:`runner` (``JobKey.runner``), run in :attr:`pool` (a controller's kind).
    ``run`` returns ``Result(backoff=True)`` to be retried with the key's backoff."""

    runner: str
    pool: str
    run: Callable[[JobKey], Result]


@dataclass(frozen=True)
class Reports:
    """Objects of :attr:`resources` the apiserver selects by :attr:`label_selector` (a watch of its
    own, not cached, not waited for), each event mapped by :attr:`handle` to a report, written by
    :attr:`run` in :attr:`pool`."""

    resources: tuple[Resource, ...]
    label_selector: str
    handle: Callable[[str, Event, KubeObject], ReportKey | None]
    """``(kind, event, object)``: the report due, if any."""
    run: Callable[[ReportKey], Result]
    pool: str


@dataclass(frozen=True)
class Setup:
    """Everything the manager runs."""

    controllers: tuple[Controller, ...]
    jobs: tuple[Jobs, ...] = ()
    reports: Reports | None = None
    runnables: tuple[Runnable, ...] = ()
    synced: tuple[Synced, ...] = ()
    """Runnables (among :attr:`runnables`) that count as caches: no worker starts before they have
    listed, and "caches synced" (``/readyz``, ``stageset_caches_synced``) waits for them too."""
