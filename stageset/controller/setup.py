"""What a feature declares to the manager: its kinds, what it watches and which events queue which keys.

As controller-runtime's ``SetupWithManager``: each feature's ``setup`` returns a :class:`Setup`
(:func:`merged` joins them).  A :class:`Controller` is ``For`` one kind (the manager lists,
watches and caches it, and queues the object's own key when its :attr:`~Controller.trigger`
changes), ``Watches`` kinds other controllers are ``For`` with a mapping from the watched object's
key to the keys to queue (:class:`Watch`), and says which Ready→False transitions become Warning
events (:attr:`~Controller.transitions`).  Work that is no reconcile is declared too: :class:`Jobs`
(a runner of :class:`~stageset.controller.keys.JobKey` work in a controller's pool) and
:class:`Reports` (objects watched under another label selector, each event mapped to a
:class:`~stageset.controller.keys.ReportKey` written about it).  Event sources the manager does
not run (discovery-driven watches, download jobs that end) queue keys through the :data:`Enqueue`
they are given; a :class:`Runnable` is started with the watches (and, declared among the
:attr:`~Setup.caches`, waited for with them before any worker starts).  An :class:`Index` is told
every event of another controller's kind before any key is queued; a listener hears every event
the recorder records; a :data:`Closer` finishes after the workers stopped.  A :class:`Guard`
declared on a controller (or on a whole setup: :attr:`Setup.guard`) sees each watch event of its
kind first and runs around each of its reconciles (the label shards' hand-off,
:mod:`stageset.controller.handoff`).

The manager knows no kind and builds no feature: it runs what a :class:`Setup` declares
(:mod:`stageset.controller.wiring` joins each feature's own ``setup``).

Invariants: a state function is pure and cheap (it runs on every watch event, under the cache's
lock); a mapping returns keys only (it never queues or blocks); a watched kind is one some
controller is ``For`` (the manager refuses a setup that is not).

Identity: none; declarations make no request.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Protocol

from stageset.controller.events import Subscription
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
Transitions = Callable[[tuple[str, str, str], KubeObject, KubeObject], None]
"""Told after each reconcile: the object's (kind, namespace, name), the object its reconcile was
handed and the object as the cache knows it now (:class:`~stageset.controller.events.ReadyWarnings`)."""
Closer = Callable[[float], None]
"""Called once the workers have stopped (or their deadline passed), with the seconds left of the
shutdown deadline: finish what is queued (the notifier sends it), then stop."""


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
    transitions: Transitions | None = None
    """The Ready→False event policy of this kind (:class:`~stageset.controller.events.ReadyWarnings`);
    ``None``: no event."""

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
class Index:
    """Told every event of :attr:`kind` (a kind some controller is ``For``) after that controller's
    own :attr:`~Controller.indexed` hook, before any key is queued: a view another feature keeps of
    a kind it does not reconcile (the FleetRollouts' view of StageSets)."""

    kind: str
    indexed: Callable[[Event, ObjectKey, KubeObject], None]


@dataclass(frozen=True)
class Setup:
    """What one feature declares, or (:func:`merged`) everything the manager runs."""

    controllers: tuple[Controller, ...] = ()
    jobs: tuple[Jobs, ...] = ()
    reports: Reports | None = None
    runnables: tuple[Runnable, ...] = ()
    caches: tuple[Synced, ...] = ()
    """Runnables (among :attr:`runnables`) that count as caches: no worker starts before they have
    listed, and "caches synced" (``/readyz``, ``stageset_caches_synced``) waits for them too."""
    indexes: tuple[Index, ...] = ()
    listeners: tuple[Subscription, ...] = ()
    """Told every new event the recorder records of the kinds each declares (they must not block:
    the notifier only queues)."""
    closers: tuple[Closer, ...] = ()
    """Closed after the workers stopped, in order."""
    guard: Guard | None = None
    """Around every controller watched under the manager's namespaces and label selector (not one
    watched in namespaces of its own): the label shards' hand-off."""


def merged(*setups: Setup) -> Setup:
    """One :class:`Setup` of every feature's: each declaration kept in order; at most one
    :attr:`~Setup.reports` and one :attr:`~Setup.guard`, which then guards every controller it
    covers (a controller guarded twice is refused)."""
    reports = [s.reports for s in setups if s.reports is not None]
    guards = [s.guard for s in setups if s.guard is not None]
    if len(reports) > 1 or len(guards) > 1:
        raise ValueError("more than one feature declares reports or a guard for every controller")
    controllers = tuple(c for s in setups for c in s.controllers)
    if guards:
        if any(c.guard is not None and c.namespaces is None for c in controllers):
            raise ValueError("a controller declares a guard of its own and is guarded by a setup's too")
        guard = guards[0]
        controllers = tuple(c if c.namespaces is not None else replace(c, guard=guard) for c in controllers)
    return Setup(controllers=controllers,
                 jobs=tuple(j for s in setups for j in s.jobs),
                 reports=reports[0] if reports else None,
                 runnables=tuple(r for s in setups for r in s.runnables),
                 caches=tuple(c for s in setups for c in s.caches),
                 indexes=tuple(i for s in setups for i in s.indexes),
                 listeners=tuple(li for s in setups for li in s.listeners),
                 closers=tuple(c for s in setups for c in s.closers))
